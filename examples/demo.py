"""torch_shard demo: run with `make demo` (torchrun, 4 ranks, gloo on CPU).

Creates a chunk-sharded and an enumerable-sharded tensor and prints, rank by rank, which shards
each process holds.
"""

import os

import torch
import torch.distributed as dist

from torch_shard import sharded_tensor
from torch_shard.sharding_spec import ChunkShardingSpec, EnumerableShardingSpec, ShardMetadata


def in_rank_order(rank: int, world_size: int, text: str) -> None:
    """Print `text` on every rank, one rank after another."""
    for turn in range(world_size):
        if turn == rank:
            print(text, flush=True)
        dist.barrier()


def describe(st) -> str:
    lines = []
    for shard in st.local_shards():
        md = shard.metadata
        lines.append(
            f"    shard at offsets {md.shard_offsets} sizes {md.shard_sizes} on {md.placement}: "
            f"sum={shard.tensor.sum().item():.3f}"
        )
    return "\n".join(lines) if lines else "    (no local shards)"


def main() -> None:
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    devices = [f"rank:{r}/cpu" for r in range(world)]

    torch.manual_seed(rank)
    rows = ChunkShardingSpec(dim=0, placements=devices)
    st = sharded_tensor.rand(rows, 10, 6)
    if rank == 0:
        print(f"ChunkShardingSpec(dim=0) over {world} ranks, global size {tuple(st.size())}:")
    in_rank_order(rank, world, f"  rank {rank}:\n{describe(st)}")

    # Uneven, several shards on rank 0, nothing on the last rank.
    grid = EnumerableShardingSpec(
        [
            ShardMetadata([0, 0], [4, 3], devices[0]),
            ShardMetadata([0, 3], [4, 3], devices[1 % world]),
            ShardMetadata([4, 0], [6, 3], devices[2 % world]),
            ShardMetadata([4, 3], [6, 3], devices[0]),
        ]
    )
    ones = sharded_tensor.ones(grid, 10, 6, dtype=torch.float64)
    if rank == 0:
        print(f"\nEnumerableShardingSpec with 4 shards, global size {tuple(ones.size())}:")
    in_rank_order(rank, world, f"  rank {rank}:\n{describe(ones)}")
    if rank == 0:
        ops = sorted(n for n in torch._C._dispatch_get_all_op_names() if n.startswith("torch_shard::"))
        print(f"\nC++ ops registered through the dispatcher: {ops}")
    dist.destroy_process_group()


if __name__ == "__main__":
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    main()
