"""GPU smoke test: torch_shard's main paths on N GPUs with NCCL, each checked against a dense reference.

    torchrun --standalone --nproc-per-node=<gpus> examples/gpu_smoke.py             # CUDA + NCCL
    torchrun --standalone --nproc-per-node=4 examples/gpu_smoke.py --device cpu     # CPU + gloo
    torchrun --standalone --nproc-per-node=4 examples/gpu_smoke.py --backend gloo   # 4 ranks sharing GPUs, gloo

Every rank builds the same dense tensors (from seeded CPU generators, then moved to its device), runs
each case and compares what it holds with them. A case passes when it passes on every rank; rank 0
prints ``PASS <name>`` or ``FAIL <name>: <why>`` per case and, last, ``gpu_smoke: <passed>/<total>
pass``. Every case runs even if an earlier one failed; the exit code is 1 when any case failed. With
``--device cuda`` rank ``r`` uses ``cuda:<its local rank>`` (``torch.cuda.set_device``) and shards are
placed ``rank:r/cuda:<local rank of r>``; with ``--backend gloo`` too, rank ``r`` uses ``cuda:<local rank
mod GPU count>`` (one GPU serves 4 ranks: CUDA kernels and placements, bytes carried by gloo); with ``--device cpu`` the same cases run on gloo with
``rank:r/cpu`` placements (gloo needs a usable interface: on one machine, ``GLOO_SOCKET_IFNAME=lo``).

Only public API is used (see docs/reference/api.md).
"""

from __future__ import annotations

import argparse
import copy
import faulthandler
import os
import shutil
import sys
import tempfile
import traceback
from collections.abc import Callable
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Shard as DShard
from torch.distributed.tensor import distribute_tensor

import torch_shard
from torch_shard import sharded_tensor
from torch_shard.interop import from_dtensor, to_dtensor
from torch_shard.sharded_tensor import Shard
from torch_shard.sharding_spec import ChunkShardingSpec, EnumerableShardingSpec, ShardMetadata
from torch_shard.testing import full_tensor

# Float results of sums (embedding bags, gradients) may differ in the last bits between the sharded
# and the dense computation, which add in different orders; moved values must be exact.
RTOL, ATOL = 1e-5, 1e-6


class CheckError(AssertionError):
    """One or more checks of a case failed on this rank (the message lists them)."""


class Smoke:
    """This rank's view of the run: device, placements, dense references, and the checks of a case.

    Checks do not raise at once: a rank whose value is wrong keeps going, so it still joins every
    collective of the case with its peers, and the case reports all its mismatches at the end.
    """

    def __init__(self, device_type: str, rank: int, world: int, gpus: list[int]) -> None:
        self.device_type = device_type
        self.rank = rank
        self.world = world
        self.gpus = gpus  # the GPU index of every rank (--device cuda)
        self.device = torch.device(device_type, gpus[rank]) if device_type == "cuda" else torch.device("cpu")
        self.problems: list[str] = []

    def placement(self, rank: int) -> str:
        if self.device_type == "cuda":
            return f"rank:{rank}/cuda:{self.gpus[rank]}"
        return f"rank:{rank}/cpu"

    def chunks(self, dim: int, ranks=None) -> ChunkShardingSpec:
        ranks = range(self.world) if ranks is None else ranks
        return ChunkShardingSpec(dim=dim, placements=[self.placement(r) for r in ranks])

    def grid(self, rows: int, cols: int) -> EnumerableShardingSpec:
        """An uneven tiling: two row bands cut at different columns, rank r owning block r % world,
        plus an empty shard; ranks may own several blocks or none."""
        top, left_top, left_bottom = rows // 3, (2 * cols) // 3, cols // 4
        boxes = [
            ([0, 0], [top, left_top]),
            ([0, left_top], [top, cols - left_top]),
            ([top, 0], [rows - top, left_bottom]),
            ([top, left_bottom], [rows - top, cols - left_bottom]),
            ([rows, 0], [0, cols]),  # empty, past the end
        ]
        return EnumerableShardingSpec(
            [ShardMetadata(o, s, self.placement((i + 1) % self.world)) for i, (o, s) in enumerate(boxes)]
        )

    def full(self, *size: int, seed: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """The same dense tensor on every rank, on this rank's device."""
        values = torch.rand(*size, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
        return values.to(dtype).to(self.device)

    @staticmethod
    def box(full: torch.Tensor, md) -> torch.Tensor:
        index = []
        for offset, length, extent in zip(md.shard_offsets, md.shard_sizes, full.shape):
            start = min(offset, extent)
            index.append(slice(start, min(start + length, extent)))
        return full[tuple(index)]

    def make(self, full: torch.Tensor, spec) -> sharded_tensor.ShardedTensor:
        """A ShardedTensor of layout ``spec`` holding ``full``, filled locally (no communication)."""
        st = sharded_tensor.empty(spec, *full.shape, dtype=full.dtype)
        for shard in st.local_shards():
            shard.tensor.copy_(self.box(full, shard.metadata))
        return st

    # ---- checks (recorded, see the class doc) ----

    def check(self, ok: bool, what: str) -> None:
        if not ok:
            self.problems.append(what)

    def equal(self, actual: torch.Tensor | None, expected: torch.Tensor, what: str, exact: bool = True) -> None:
        if actual is None:
            self.problems.append(f"{what}: missing")
            return
        if actual.device != expected.device:
            self.problems.append(f"{what}: on {actual.device}, expected {expected.device}")
        elif actual.dtype != expected.dtype or actual.shape != expected.shape:
            self.problems.append(
                f"{what}: {actual.dtype} {list(actual.shape)}, expected {expected.dtype} {list(expected.shape)}"
            )
        elif exact and not torch.equal(actual, expected):
            self.problems.append(f"{what}: values differ")
        elif not exact and not torch.allclose(actual, expected, rtol=RTOL, atol=ATOL):
            worst = (actual - expected).abs().max().item()
            self.problems.append(f"{what}: values differ (max abs difference {worst:.3g})")

    def holds(self, st, full: torch.Tensor, what: str) -> None:
        """Every local shard of ``st`` is on this rank's device and equals its box of ``full``."""
        for shard in st.local_shards():
            md = shard.metadata
            self.check(md.placement.rank() == self.rank, f"{what}: this rank holds {md.placement}'s shard")
            self.equal(shard.tensor, self.box(full, md), f"{what}: shard at {md.shard_offsets}")

    def gathers(self, st, full: torch.Tensor, dst: int, what: str) -> None:
        out = torch.full_like(full, -1) if self.rank == dst else None
        st.gather(dst, out)
        if self.rank == dst:
            self.equal(out, full, f"{what}: gather to rank {dst}")

    def finish(self) -> None:
        problems, self.problems = self.problems, []
        if problems:
            raise CheckError("; ".join(problems))


# ------------------------------------------------------------------------------------------------
# The cases. Each builds what it needs, so one failing does not take the others with it.


def case_scatter(s: Smoke) -> None:
    full = s.full(13, 7, seed=1)
    src = s.world - 1
    st = torch_shard._shard_tensor(full, s.chunks(0), src_rank=src)
    s.check(st.size() == full.shape, f"global size {tuple(st.size())}")
    s.holds(st, full, f"scatter from rank {src}")


def case_gather(s: Smoke) -> None:
    full = s.full(9, 11, seed=2)
    st = s.make(full, s.chunks(1, reversed(range(s.world))))
    for dst in sorted({0, s.world - 1}):
        s.gathers(st, full, dst, "columns")


def case_reshard_chunk_to_chunk(s: Smoke) -> None:
    full = s.full(10, 14, seed=3)
    st = s.make(full, s.chunks(0))
    target = s.chunks(1)
    same = st.reshard(target)
    s.check(same is st, "reshard did not return the tensor itself")
    s.check(st.sharding_spec() == target, "sharding_spec() is not the target")
    s.holds(st, full, "dim 0 -> dim 1")
    s.gathers(st, full, s.world // 2, "after reshard")


def case_reshard_chunk_to_enumerable(s: Smoke) -> None:
    full = s.full(11, 9, seed=4)
    st = s.make(full, s.chunks(1))
    st.reshard(s.grid(11, 9))
    s.holds(st, full, "dim 1 -> grid")
    st.reshard(s.chunks(0, range(s.world - 1, -1, -1)))  # and back, placements reversed
    s.holds(st, full, "grid -> dim 0")
    s.gathers(st, full, 0, "after reshards")


def case_init_from_local_shards(s: Smoke) -> None:
    # Uneven row blocks in rank order: rank r holds r + 1 rows.
    starts = [sum(range(1, r + 1)) for r in range(s.world + 1)]
    full = s.full(starts[-1], 5, seed=5)
    md = ShardMetadata([starts[s.rank], 0], [s.rank + 1, 5], s.placement(s.rank))
    local = s.box(full, md).clone()
    st = sharded_tensor.init_from_local_shards([Shard(local, md)], starts[-1], 5)
    s.check(st.size() == full.shape, f"global size {tuple(st.size())}")
    s.check(len(st.metadata().shards_metadata) == s.world, "shard count")
    s.check(st.local_shards()[0].tensor is local, "the local shard is not the tensor given")
    s.holds(st, full, "from local shards")
    s.gathers(st, full, s.world - 1, "from local shards")


def case_cuda_of_cpu_placements_then_reshard(s: Smoke) -> None:
    # Shards on the CPU (staged through the GPU by NCCL), moved with .cuda(), then resharded.
    full = s.full(12, 8, seed=6)
    cpu_spec = ChunkShardingSpec(dim=0, placements=[f"rank:{r}/cpu" for r in range(s.world)])
    st_cpu = s.make(full.cpu(), cpu_spec)
    st = st_cpu.cuda()
    for md in st.metadata().shards_metadata:
        s.check(md.placement.device().type == "cuda", f"placement {md.placement} after .cuda()")
    s.holds(st, full, ".cuda()")
    st.reshard(s.chunks(1))
    s.holds(st, full, ".cuda() then reshard")
    s.gathers(st, full, 0, ".cuda() then reshard")


def case_cpu_placements_written_differently_then_reshard(s: Smoke) -> None:
    # The CPU analogue of .cuda(), where each rank writes its own placement with its device and may
    # write the others' differently: the same owners and device type, written "rank:r/cpu" on even
    # ranks and by each owner itself, "rank:r/cpu:0" by the odd ranks; then a round trip through
    # to("cpu", copy=True).
    full = s.full(12, 8, seed=6)
    written = [f"rank:{r}/cpu" if r == s.rank or s.rank % 2 == 0 else f"rank:{r}/cpu:0" for r in range(s.world)]
    st = s.make(full, ChunkShardingSpec(dim=0, placements=written))
    st.reshard(s.chunks(1))
    s.holds(st, full, "written differently, then reshard")
    s.gathers(st, full, 0, "written differently, then reshard")
    copied = st.to("cpu", copy=True)
    s.check(copied is not st, 'to("cpu", copy=True) returned the tensor itself')
    copied.reshard(s.chunks(0))
    s.holds(copied, full, 'to("cpu", copy=True), then reshard')
    s.gathers(copied, full, s.world - 1, 'to("cpu", copy=True), then reshard')


NUM_EMBEDDINGS, EMBEDDING_DIM = 13, 6


def _embedding_inputs(s: Smoke, rank: int, bag: bool):
    """Rank ``rank``'s lookup (ids, offsets, per-sample weights) and the gradient of its output."""
    g = torch.Generator().manual_seed(100 + rank)
    if not bag:
        ids = torch.randint(0, NUM_EMBEDDINGS, (3, 4), generator=g)
        grad = torch.randn(3, 4, EMBEDDING_DIM, generator=g)
        return (ids.to(s.device), None, None), grad.to(s.device)
    ids = torch.randint(0, NUM_EMBEDDINGS, (9,), generator=g)
    offsets = torch.tensor([0, 2, 2, 6])  # with an empty bag
    weights = torch.rand(9, generator=g)
    grad = torch.randn(4, EMBEDDING_DIM, generator=g)
    return (ids.to(s.device), offsets.to(s.device), weights.to(s.device)), grad.to(s.device)


def _lookup(weight, inputs, bag: bool):
    ids, offsets, weights = inputs
    if bag:
        return F.embedding_bag(ids, weight, offsets, mode="sum", per_sample_weights=weights)
    return F.embedding(ids, weight, padding_idx=4)


def _embedding_case(s: Smoke, dim: int, bag: bool) -> None:
    torch.manual_seed(0)
    if bag:
        dense = nn.EmbeddingBag(NUM_EMBEDDINGS, EMBEDDING_DIM, mode="sum").to(s.device)
    else:
        dense = nn.Embedding(NUM_EMBEDDINGS, EMBEDDING_DIM, padding_idx=4).to(s.device)
    sharded = copy.deepcopy(dense)
    torch_shard.shard_parameter(sharded, "weight", s.chunks(dim, reversed(range(s.world))))
    weight = sharded.weight
    s.holds(weight, dense.weight.detach(), "sharded weight")

    inputs, grad = _embedding_inputs(s, s.rank, bag)
    out = _lookup(weight, inputs, bag)
    s.equal(out, _lookup(dense.weight, inputs, bag), "forward", exact=False)
    (out * grad).sum().backward()

    # Each rank's backward sends its gradient to the owners: a shard's gradient is its slice of the
    # gradient of the sum of every rank's loss.
    total = 0
    for r in range(s.world):
        inputs_r, grad_r = _embedding_inputs(s, r, bag)
        total = total + (_lookup(dense.weight, inputs_r, bag) * grad_r).sum()
    total.backward()
    for shard in weight.local_shards():
        expected = s.box(dense.weight.grad, shard.metadata)
        s.equal(shard.tensor.grad, expected, f"gradient of the shard at {shard.metadata.shard_offsets}", exact=False)


def case_embedding_rowwise(s: Smoke) -> None:
    _embedding_case(s, dim=0, bag=False)


def case_embedding_colwise(s: Smoke) -> None:
    _embedding_case(s, dim=1, bag=False)


def case_embedding_bag_rowwise(s: Smoke) -> None:
    _embedding_case(s, dim=0, bag=True)


def case_embedding_bag_colwise(s: Smoke) -> None:
    _embedding_case(s, dim=1, bag=True)


def case_dcp_save_and_load_into_another_layout(s: Smoke, checkpoint_root: str | None) -> None:
    # Rank 0 names the folder; a failure to make it travels too, so every rank fails this case at once
    # instead of the others waiting in the broadcast for the group timeout.
    holder: list[str | OSError | None] = [None]
    if s.rank == 0:
        try:
            holder[0] = tempfile.mkdtemp(prefix="torch_shard_gpu_smoke_", dir=checkpoint_root)
        except OSError as error:
            holder[0] = error
    dist.broadcast_object_list(holder, src=0)
    if isinstance(holder[0], OSError):
        raise holder[0]
    path = holder[0]
    try:
        full = s.full(10, 12, seed=7)
        saved = s.make(full, s.chunks(0))
        dcp.save({"w": saved, "step": torch.tensor(3)}, checkpoint_id=path)
        for name, spec in (("columns", s.chunks(1, reversed(range(s.world)))), ("grid", s.grid(10, 12))):
            target = sharded_tensor.zeros(spec, 10, 12)
            state = {"w": target, "step": torch.tensor(0)}
            dcp.load(state, checkpoint_id=path)
            s.holds(target, full, f"loaded as {name}")
            s.check(int(state["step"]) == 3, f"step {state['step']}")
        # And into a plain tensor on every rank.
        plain = {"w": torch.zeros(10, 12, device=s.device)}
        dcp.load(plain, checkpoint_id=path)
        s.equal(plain["w"], full, "loaded as a plain tensor")
    finally:
        dist.barrier()
        if s.rank == 0:
            shutil.rmtree(path, ignore_errors=True)


def case_dtensor_interop(s: Smoke) -> None:
    mesh = init_device_mesh(s.device_type, (s.world,))
    full = s.full(9, 10, seed=8)
    st = s.make(full, s.chunks(0))
    dt = to_dtensor(st, mesh, [DShard(0)])  # the same layout: zero-copy
    s.equal(full_tensor(dt), full, "to_dtensor(Shard(0))")
    local = st.local_tensor()
    if local.numel() > 0:
        s.check(dt.to_local().data_ptr() == local.data_ptr(), "to_dtensor(Shard(0)) copied the shard")
    moved = to_dtensor(st, mesh, [DShard(1)])  # another layout: resharded, st untouched
    s.equal(full_tensor(moved), full, "to_dtensor(Shard(1))")
    s.holds(st, full, "st after to_dtensor(Shard(1))")
    back = from_dtensor(moved)
    s.holds(back, full, "from_dtensor(Shard(1))")
    s.gathers(back, full, s.world - 1, "from_dtensor(Shard(1))")
    theirs = from_dtensor(distribute_tensor(full, mesh, [DShard(0)]))
    s.holds(theirs, full, "from_dtensor(distribute_tensor)")
    s.check(theirs.sharding_spec() == s.chunks(0), "from_dtensor(Shard(0)) spec")


def cases(device_type: str, checkpoint_root: str | None) -> list[tuple[str, Callable[[Smoke], None]]]:
    move = (
        ("cuda_of_cpu_placements_then_reshard", case_cuda_of_cpu_placements_then_reshard)
        if device_type == "cuda"
        else ("cpu_placements_written_differently_then_reshard", case_cpu_placements_written_differently_then_reshard)
    )
    return [
        ("scatter", case_scatter),
        ("gather", case_gather),
        ("reshard_chunk_to_chunk", case_reshard_chunk_to_chunk),
        ("reshard_chunk_to_enumerable", case_reshard_chunk_to_enumerable),
        ("init_from_local_shards", case_init_from_local_shards),
        move,
        ("embedding_rowwise", case_embedding_rowwise),
        ("embedding_colwise", case_embedding_colwise),
        ("embedding_bag_rowwise", case_embedding_bag_rowwise),
        ("embedding_bag_colwise", case_embedding_bag_colwise),
        ("dcp_save_and_load_into_another_layout", lambda s: case_dcp_save_and_load_into_another_layout(s, checkpoint_root)),
        ("dtensor_interop", case_dtensor_interop),
    ]


def _one_line(exc: BaseException) -> str:
    text = " ".join(f"{type(exc).__name__}: {exc}".split())
    return text if len(text) <= 300 else text[:297] + "..."


def run(s: Smoke, checkpoint_root: str | None) -> int:
    """Run every case; returns the number that failed (the same on every rank)."""
    passed = total = 0
    for name, fn in cases(s.device_type, checkpoint_root):
        total += 1
        try:
            fn(s)
            s.finish()
            mine = None
        except Exception as exc:  # noqa: BLE001 - every failure is reported, and the next case runs
            s.problems = []
            mine = _one_line(exc)
            print(f"[rank {s.rank}] {name} failed:\n{traceback.format_exc()}", file=sys.stderr, flush=True)
        verdicts: list[str | None] = [None] * s.world
        dist.all_gather_object(verdicts, mine)
        failures = [f"rank {r}: {why}" for r, why in enumerate(verdicts) if why is not None]
        if not failures:
            passed += 1
        if s.rank == 0:
            print(f"PASS {name}" if not failures else f"FAIL {name}: {' | '.join(failures)}", flush=True)
    if s.rank == 0:
        print(f"gpu_smoke: {passed}/{total} pass", flush=True)
    return total - passed


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda", help="cuda (NCCL, default) or cpu (gloo)")
    parser.add_argument(
        "--backend",
        choices=("auto", "nccl", "gloo"),
        default="auto",
        help="auto: NCCL for cuda, gloo for cpu; gloo with --device cuda puts rank r on GPU (local rank mod "
        "GPU count), so 4 ranks share one GPU and torch_shard stages their shards through host memory",
    )
    parser.add_argument("--timeout", type=float, default=300.0, help="process-group timeout in seconds")
    parser.add_argument(
        "--checkpoint-dir", default=None, help="where the DCP case writes (must be shared by all ranks; default: a temp dir)"
    )
    args = parser.parse_args()
    # A rank that dies of a signal (SIGSEGV in a CUDA or gloo path) prints its Python stack first, so the
    # log says which call it was in (torch_shard's or the library's under test beside it).
    faulthandler.enable()

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local_rank = int(os.environ.get("LOCAL_RANK", rank))
    backend = args.backend if args.backend != "auto" else ("nccl" if args.device == "cuda" else "gloo")
    if backend == "nccl" and args.device == "cpu":
        print("NCCL moves CUDA tensors only: use --device cuda with --backend nccl", file=sys.stderr)
        return 2
    gpu = local_rank
    if args.device == "cuda":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if backend == "gloo" and count:
            gpu = local_rank % count  # several ranks per GPU: gloo allows it, NCCL does not
        if count <= gpu:
            print(f"rank {rank}: --device cuda needs a GPU for local rank {local_rank}", file=sys.stderr)
            return 2
        torch.cuda.set_device(gpu)
    if args.checkpoint_dir:
        os.makedirs(args.checkpoint_dir, exist_ok=True)
    dist.init_process_group(backend, timeout=timedelta(seconds=args.timeout))
    try:
        gpus: list[int | None] = [None] * world
        dist.all_gather_object(gpus, gpu)
        failed = run(Smoke(args.device, rank, world, gpus), args.checkpoint_dir)
        # Nobody leaves before rank 0 has printed the summary (torchrun stops the other workers as
        # soon as one exits with an error).
        dist.barrier()
    finally:
        dist.destroy_process_group()
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
