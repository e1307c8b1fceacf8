"""torch_shard's main job in seven checks: ``make demo`` (torchrun, 4 ranks, gloo on CPU).

    torchrun --standalone --nproc-per-node=4 examples/demo.py

Every rank builds the same small dense model (an ``EmbeddingBag`` feeding a ``Linear``) from one seed,
shards a copy of it, and checks each step against the dense model or the values it started from. Rank
0 prints one line per check: a check mark (or a cross and FAILED), what was done, and the largest
absolute difference from the dense computation over every rank. Layout pictures come from
``torch_shard.visualize_sharding``. The exit code is 1 if any check failed.

1. ``shard_module`` shards the embedding table and the linear weight row-wise over the ranks.
2. One training step (forward, backward, SGD) on the sharded model equals the dense model's step.
3. and 4. ``reshard`` moves the table rows -> columns -> an uneven grid, with its picture each time.
5. ``dcp.save`` with ``ChecksumFileSystemWriter`` (DCP's writer plus what lets a load check every byte
   against this save), then ``dcp.load`` into another layout with ``ByteRangeFileSystemReader``, which
   checks every byte it reads and reads about a quarter of what DCP's ``FileSystemReader`` reads.
6. ``to_dtensor`` / ``from_dtensor``: to DTensor and back, sharing the shards' memory where it can.
7. ``gather`` the trained table to rank 0, equal to the dense model's.
"""

from __future__ import annotations

import argparse
import copy
import os
import shutil
import sys
import tempfile
import time
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol
import torch.distributed.checkpoint as dcp
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.checkpoint import FileSystemReader
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Shard as DShard

import torch_shard
from torch_shard import sharded_tensor, visualize_sharding
from torch_shard.checkpoint import ByteRangeFileSystemReader, ChecksumFileSystemWriter
from torch_shard.interop import from_dtensor, to_dtensor
from torch_shard.sharded_optim import ShardedOptimizer, named_params_with_sharded_tensor
from torch_shard.sharding_plan import ShardingPlan
from torch_shard.sharding_spec import ChunkShardingSpec, EnumerableShardingSpec, ShardMetadata
from torch_shard.sharding_spec.api import custom_sharding_spec_op

NUM_EMBEDDINGS, EMBEDDING_DIM, OUT_FEATURES = 4096, 64, 8  # a 1 MiB float32 table
BAGS, IDS_PER_BAG, LR = 8, 20, 0.5
# Float results of sums may differ in the last bits between the sharded and the dense computation,
# which add in different orders; values that are only moved must be exact.
RTOL_FLOAT = 1e-5


class Model(nn.Module):
    """The dense model: a sum-pooled embedding table feeding a linear layer without bias."""

    def __init__(self) -> None:
        super().__init__()
        self.bag = nn.EmbeddingBag(NUM_EMBEDDINGS, EMBEDDING_DIM, mode="sum")
        self.fc = nn.Linear(EMBEDDING_DIM, OUT_FEATURES, bias=False)

    def forward(self, ids: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
        return self.fc(self.bag(ids, offsets))


# torch_shard ships sharded F.embedding / F.embedding_bag; other ops on a ShardedTensor are the user's
# to register. This is F.linear for a weight split by output features (ChunkShardingSpec(dim=0), one
# chunk per rank in rank order), with a different batch on every rank: each rank applies its rows of
# the weight to every rank's batch, and each rank keeps its own batch's part of every rank's result.
# all_gather_tensor_autograd is differentiable: its backward carries the gradients back, summed over the ranks.
@custom_sharding_spec_op(ChunkShardingSpec, F.linear)
def row_sharded_linear(types, args, kwargs, process_group):
    """``F.linear(x, weight)`` with ``weight`` row-sharded over ``process_group`` (no bias)."""
    x, weight = args[0], args[1]
    bias = args[2] if len(args) > 2 else kwargs.get("bias")
    if weight.sharding_spec().dim != 0 or bias is not None:
        raise NotImplementedError("the demo's sharded linear takes a row-sharded weight and no bias")
    world, rank = dist.get_world_size(process_group), dist.get_rank(process_group)
    batches = funcol.all_gather_tensor_autograd(x, gather_dim=0, group=process_group)  # every rank's batch
    partial = F.linear(batches, weight.local_tensor())  # my output features of every batch
    pieces = funcol.all_gather_tensor_autograd(partial, gather_dim=1, group=process_group)  # all features
    return pieces.chunk(world, dim=0)[rank]  # my batch (batches are the same size on every rank)


def batch(rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Rank ``rank``'s batch (ids, offsets): any rank can rebuild any rank's batch from its seed."""
    g = torch.Generator().manual_seed(1000 + rank)
    ids = torch.randint(0, NUM_EMBEDDINGS, (BAGS * IDS_PER_BAG,), generator=g)
    return ids, torch.arange(0, BAGS * IDS_PER_BAG, IDS_PER_BAG)


def loss_of(model: nn.Module, rank: int) -> torch.Tensor:
    ids, offsets = batch(rank)
    return model(ids, offsets).square().mean()


def box(full: torch.Tensor, offsets, sizes) -> torch.Tensor:
    """The block of ``full`` a shard at ``offsets`` with ``sizes`` holds."""
    return full[tuple(slice(o, o + s) for o, s in zip(offsets, sizes))]


def max_diff_of_shards(st, full: torch.Tensor) -> float:
    """Largest |difference| between this rank's shards of ``st`` and their blocks of ``full``."""
    worst = 0.0
    for shard in st.local_shards():
        md = shard.metadata
        if shard.tensor.numel():
            worst = max(worst, (shard.tensor.detach() - box(full, md.shard_offsets, md.shard_sizes)).abs().max().item())
    return worst


def rchar() -> int:
    """Bytes this process has read through read-like calls so far (Linux /proc/self/io)."""
    with open("/proc/self/io") as f:
        for line in f:
            if line.startswith("rchar:"):
                return int(line.split()[1])
    raise RuntimeError("no rchar in /proc/self/io")


class Steps:
    """Runs the checks: each step's worst difference is the maximum over every rank, so every rank
    reaches the same verdict and rank 0 prints it."""

    def __init__(self, rank: int) -> None:
        self.rank = rank
        self.number = 0
        self.failed = 0

    def check(self, what: str, diff: float, tolerance: float = 0.0, extra: str = "") -> None:
        worst = torch.tensor([diff], dtype=torch.float64)
        dist.all_reduce(worst, op=dist.ReduceOp.MAX)
        ok = worst.item() <= tolerance
        self.number += 1
        self.failed += not ok
        if self.rank == 0:
            mark = "\u2713" if ok else "\u2717 FAILED"
            tail = f"; {extra}" if extra else ""
            print(f"{mark} {self.number}. {what}: max abs diff {worst.item():.3g}{tail}", flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--checkpoint-dir", default=None, help="where check 5's checkpoint goes (a temporary folder inside it)")
    parser.add_argument("--timeout", type=float, default=300, help="process-group timeout, seconds")
    args = parser.parse_args()

    started = time.perf_counter()
    dist.init_process_group("gloo", timeout=timedelta(seconds=args.timeout))
    rank, world = dist.get_rank(), dist.get_world_size()
    placements = [f"rank:{r}/cpu" for r in range(world)]
    rows = ChunkShardingSpec(dim=0, placements=placements)
    cols = ChunkShardingSpec(dim=1, placements=placements)
    steps = Steps(rank)
    if rank == 0:
        print(f"torch_shard demo: {world} ranks, gloo on CPU, torch {torch.__version__}", flush=True)

    # 1. The same dense model on every rank; shard a copy's weights row-wise.
    torch.manual_seed(0)
    dense = Model()
    model = copy.deepcopy(dense)
    torch_shard.shard_module(model, ShardingPlan(plan={"bag.weight": rows, "fc.weight": rows}))
    diff = max(max_diff_of_shards(model.bag.weight, dense.bag.weight), max_diff_of_shards(model.fc.weight, dense.fc.weight))
    steps.check(f"shard_module: EmbeddingBag({NUM_EMBEDDINGS}, {EMBEDDING_DIM}) and Linear weights row-wise", diff)

    # 2. One SGD step. Each rank trains on its own batch; the sharded backward sends every rank's
    #    gradient to the shards' owners, so the sharded model follows the sum of the ranks' losses,
    #    which the dense model computes over all ranks' batches.
    optimizer = ShardedOptimizer(dict(named_params_with_sharded_tensor(model)), torch.optim.SGD, lr=LR)
    loss = loss_of(model, rank)
    loss.backward()
    optimizer.step()
    dense_losses = [loss_of(dense, r) for r in range(world)]
    sum(dense_losses).backward()
    torch.optim.SGD(dense.parameters(), lr=LR).step()
    diff = max(
        abs(loss.item() - dense_losses[rank].item()),
        max_diff_of_shards(model.bag.weight, dense.bag.weight.detach()),
        max_diff_of_shards(model.fc.weight, dense.fc.weight.detach()),
    )
    steps.check("one training step (loss, updated shards) equals the dense model's", diff, RTOL_FLOAT)

    # 3. and 4. Reshard a copy of the trained table: rows -> columns -> an uneven grid. Each move must
    #    keep every value exactly: compare with the table as it was before the moves.
    table = model.bag.weight.detach().clone()
    before = full_copy(table)
    visualize_sharding(table, "the table after training (rows):")
    table.reshard(cols)
    visualize_sharding(table, "the table after reshard(columns):")
    steps.check("reshard rows -> columns", max_diff_of_shards(table, before))
    grid = uneven_grid(placements)
    table.reshard(grid)
    visualize_sharding(table, "the table after reshard(grid):")
    steps.check("reshard columns -> an uneven grid (several shards per rank, an empty shard)", max_diff_of_shards(table, before))

    # 5. Save the trained model's state_dict (rows) the way we recommend, with checksums of this save;
    #    load the table as columns with each reader (ours checks every byte it hands over).
    path = shared_temp_dir(rank, args.checkpoint_dir)
    try:
        dcp.save(model.state_dict(), storage_writer=ChecksumFileSystemWriter(path))
        diff, read = 0.0, {}
        for name, reader in (("FileSystemReader", FileSystemReader), ("ByteRangeFileSystemReader", ByteRangeFileSystemReader)):
            target = sharded_tensor.zeros(cols, NUM_EMBEDDINGS, EMBEDDING_DIM)
            start = rchar()
            dcp.load({"bag.weight": target}, storage_reader=reader(path))
            read[name] = max_over_ranks(rchar() - start)
            diff = max(diff, max_diff_of_shards(target, before))
        mib = {name: n / 2**20 for name, n in read.items()}
        steps.check(
            "dcp.save (rows, ChecksumFileSystemWriter), dcp.load as columns",
            diff,
            extra=f"MiB read per rank: ByteRangeFileSystemReader (every byte checked) "
            f"{mib['ByteRangeFileSystemReader']:.2f}, DCP's FileSystemReader (unchecked) {mib['FileSystemReader']:.2f}",
        )
    finally:
        dist.barrier()
        if rank == 0:
            shutil.rmtree(path, ignore_errors=True)

    # 6. To DTensor and back. Shard(0) over a 1-D mesh is the row layout: no copy.
    mesh = init_device_mesh("cpu", (world,))
    weight = model.bag.weight.detach()
    dt = to_dtensor(weight, mesh, [DShard(0)])
    shared = dt.to_local().data_ptr() == weight.local_tensor().data_ptr()
    back = from_dtensor(to_dtensor(weight, mesh, [DShard(1)]))
    diff = max((dt.full_tensor() - before).abs().max().item(), max_diff_of_shards(back, before))
    diff = diff if max_over_ranks(0 if shared else 1) == 0 else float("inf")
    steps.check("to_dtensor(Shard(0)) shares the shards; to_dtensor(Shard(1)) -> from_dtensor", diff)

    # 7. The whole trained table on rank 0 only.
    out = torch.empty(NUM_EMBEDDINGS, EMBEDDING_DIM) if rank == 0 else None
    model.bag.weight.gather(dst=0, out=out)
    diff = (out - dense.bag.weight.detach()).abs().max().item() if rank == 0 else 0.0
    steps.check("gather to rank 0 equals the dense model's table", diff, RTOL_FLOAT)

    elapsed = max_over_ranks(time.perf_counter() - started)
    if rank == 0:
        verdict = "all checks passed" if not steps.failed else f"{steps.failed} of {steps.number} checks FAILED"
        print(f"demo: {verdict} ({elapsed:.1f} s after start-up)", flush=True)
    dist.destroy_process_group()
    return 1 if steps.failed else 0


def full_copy(st) -> torch.Tensor:
    """Every rank's dense copy of ``st``: its blocks placed, then summed over ranks (exact, since
    exactly one rank contributes each element)."""
    full = torch.zeros(st.size(), dtype=st.dtype)
    for shard in st.local_shards():
        md = shard.metadata
        box(full, md.shard_offsets, md.shard_sizes).copy_(shard.tensor.detach())
    dist.all_reduce(full)
    return full


def uneven_grid(placements: list[str]) -> EnumerableShardingSpec:
    """Two row bands cut at different columns; rank 0 owns two blocks, the last rank only an empty one."""
    top, left_top, left_bottom = 1500, 40, 16
    n, d, last = NUM_EMBEDDINGS, EMBEDDING_DIM, len(placements) - 1
    return EnumerableShardingSpec(
        [
            ShardMetadata([0, 0], [top, left_top], placements[0]),
            ShardMetadata([0, left_top], [top, d - left_top], placements[1 % len(placements)]),
            ShardMetadata([top, 0], [n - top, left_bottom], placements[2 % len(placements)]),
            ShardMetadata([top, left_bottom], [n - top, d - left_bottom], placements[0]),
            ShardMetadata([n, 0], [0, d], placements[last]),
        ]
    )


def shared_temp_dir(rank: int, root: str | None) -> str:
    """A fresh folder made by rank 0, its path sent to every rank (one host: a local folder)."""
    holder = [tempfile.mkdtemp(prefix="torch_shard_demo_", dir=root) if rank == 0 else None]
    dist.broadcast_object_list(holder, src=0)
    return holder[0]


def max_over_ranks(value: float) -> float:
    t = torch.tensor([float(value)], dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t.item()


if __name__ == "__main__":
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    sys.exit(main())
