"""One rank of tests/test_multihost.py: torchrun runs it on two hosts (network namespaces) with two
ranks each, so ranks 0-1 and 2-3 reach each other only over the veth between the hosts.

Rank 0 scatters a random tensor in row chunks, the ranks reshard it to column chunks and then to an
uneven EnumerableShardingSpec (two ranks holding two blocks each), and the tensor is gathered to rank
2, on the other host than the source. After every step each rank compares its local shards bitwise
with its slices of the dense tensor (rebuilt on every rank from a seed rank 0 sends through plain
c10d), and rank 2 compares the gathered tensor. Rank 2 prints ``multihost ok ...`` when every rank
saw every check pass; a rank with a failed check prints it and every rank exits 1.
"""

from __future__ import annotations

import os
import sys
from datetime import timedelta

import torch
import torch.distributed as dist

from torch_shard import _shard_tensor
from torch_shard.sharding_spec import ChunkShardingSpec, EnumerableShardingSpec, ShardMetadata

WORLD = 4
DST = 2  # the first rank of the second host
# (rows, cols, dtype): one small uneven tensor and one whose messages exceed a small exchange's
# slots, so the exchange's later rounds cross the hosts too.
CASES = ((37, 53, torch.float32), (512, 384, torch.float32), (96, 130, torch.int64))


def placements() -> list[str]:
    return [f"rank:{r}/cpu" for r in range(WORLD)]


def blocks_spec(rows: int, cols: int) -> EnumerableShardingSpec:
    """2 x 3 uneven blocks; ranks 3 and 0 hold two blocks each, one on each host."""
    r_cut, c_cuts = rows // 3, (cols // 4, cols // 4 + cols // 3, cols)
    owners = (3, 0, 2, 1, 0, 3)
    shards = []
    for i, (r0, r1) in enumerate(((0, r_cut), (r_cut, rows))):
        for j, (c0, c1) in enumerate(zip((0, *c_cuts[:-1]), c_cuts)):
            shards.append(ShardMetadata([r0, c0], [r1 - r0, c1 - c0], f"rank:{owners[3 * i + j]}/cpu"))
    return EnumerableShardingSpec(shards)


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    if a.dtype.is_floating_point:
        a, b = a.contiguous().view(torch.int32), b.contiguous().view(torch.int32)
    return torch.equal(a, b)


def check_local(st, full: torch.Tensor, step: str, failures: list[str]) -> None:
    for shard in st.local_shards():
        offsets, sizes = shard.metadata.shard_offsets, shard.metadata.shard_sizes
        expected = full[offsets[0] : offsets[0] + sizes[0], offsets[1] : offsets[1] + sizes[1]]
        if not same_bits(shard.tensor, expected):
            failures.append(f"rank {dist.get_rank()}: {step}: local shard at {offsets} differs from the dense tensor")


def run_case(rows: int, cols: int, dtype: torch.dtype, generator: torch.Generator, failures: list[str]) -> None:
    rank = dist.get_rank()
    if dtype.is_floating_point:
        full = torch.rand(rows, cols, generator=generator, dtype=dtype)
        # Only the source's data is read; the others pass NaN, which no check would accept.
        given = full if rank == 0 else torch.full((rows, cols), float("nan"), dtype=dtype)
    else:
        full = torch.randint(-(2**40), 2**40, (rows, cols), generator=generator, dtype=dtype)
        given = full if rank == 0 else torch.full((rows, cols), -1, dtype=dtype)
    name = f"{rows}x{cols} {dtype}"
    st = _shard_tensor(given, ChunkShardingSpec(dim=0, placements=placements()), src_rank=0)
    check_local(st, full, f"{name} scatter", failures)
    st.reshard(ChunkShardingSpec(dim=1, placements=placements()))
    check_local(st, full, f"{name} rows -> columns", failures)
    st.reshard(blocks_spec(rows, cols))
    check_local(st, full, f"{name} columns -> blocks", failures)
    out = torch.zeros(rows, cols, dtype=dtype) if rank == DST else None
    st.gather(DST, out)
    if rank == DST and not same_bits(out, full):
        failures.append(f"rank {rank}: {name}: tensor gathered to rank {DST} differs from the dense tensor")


def main() -> int:
    dist.init_process_group("gloo", timeout=timedelta(seconds=60))
    rank, world = dist.get_rank(), dist.get_world_size()
    hosts = world // int(os.environ["LOCAL_WORLD_SIZE"])
    if world != WORLD or hosts != 2:
        raise SystemExit(f"expected {WORLD} ranks on 2 hosts, got {world} on {hosts}")
    seed = torch.randint(0, 2**62, (1,)) if rank == 0 else torch.zeros(1, dtype=torch.int64)
    dist.broadcast(seed, 0)
    generator = torch.Generator().manual_seed(int(seed.item()))
    failures: list[str] = []
    for rows, cols, dtype in CASES:
        run_case(rows, cols, dtype, generator, failures)
    for failure in failures:
        print(failure, flush=True)
    failed = torch.tensor([len(failures)])
    dist.all_reduce(failed)
    if rank == DST and failed.item() == 0:
        iface = os.environ.get("GLOO_SOCKET_IFNAME")
        print(f"multihost ok: {len(CASES)} tensors scattered from rank 0, resharded rows -> columns -> blocks, "
              f"gathered bit-exact on rank {DST} (host 1, gloo on {iface}), seed {int(seed.item())}", flush=True)
    dist.destroy_process_group()
    return 1 if failed.item() else 0


if __name__ == "__main__":
    sys.exit(main())
