"""Sharded embedding / embedding_bag: torch_shard vs torch.distributed._shard (same wheel) vs the dense op.

Run: ``torchrun --standalone --nproc-per-node=4 bench/bench_embedding.py`` (``--device cpu``, gloo, any
number of ranks; the default) or ``torchrun --standalone --nproc-per-node=<GPUs> bench/bench_embedding.py
--device cuda`` (NCCL, one rank per GPU; one GPU is enough).

A [--rows x --dim] float32 table, sharded row-wise and column-wise over every rank; every rank looks up
its own --bags x --ids-per-bag random ids (seeded by rank): ``F.embedding`` on the [bags, ids] input and
``F.embedding_bag`` (sum, mean, max) on its rows as bags. The dense op runs the same ids against a
whole table on each rank. TorchRec's row-wise EmbeddingBagCollection (a fused FBGEMM kernel, ids routed
to their owners) on the same table size and ids is a column where torchrec is importable
(``make torchrec``); it is what users of row-wise embedding_bag would pick instead. ``--max-norm X``
passes ``max_norm=X`` to every lookup (each library renormalises the rows it reads, in place, first;
no TorchRec column).

Per case and library it prints:
* fwd ms: forward under no_grad; fwd+bwd ms: forward and ``out.sum().backward()`` into the shards.
  Median of --repeats after a warm-up, of the slowest rank (CUDA: synchronised);
* fwd ops, bwd ops: ATen ops that do work in ONE forward (autograd on, as a training step runs it:
  unlike fwd ms), and in one ``out.sum().backward()``, on rank 0: torch.profiler events ``aten::*`` at
  every level, leaving out the ops that launch no kernel (views, slices, selects, detach, empty*,
  resize_, the reshape family: torch_shard.testing._aten_work).
  The CPU's proxy for kernel launches. ``--gpu-path`` runs torch_shard's lookups on the ATen
  composition every non-CPU device takes (``torch_shard.testing.cpu_loops(False)``): on the CPU, its
  op counts are what a GPU would launch;
* syncs: host syncs in one forward (CUDA only: ``torch.cuda.set_sync_debug_mode``);
* MB sent: bytes this rank sends to other ranks in one forward (torch_shard's own counters; "-" for
  the others). ``ids bound`` is the target for the ids part: the rank's own ids plus 4 B per bag
  per owner.
"""

from __future__ import annotations

import argparse
import os
import warnings

import torch
import torch.distributed as dist
import torch.distributed._shard.sharded_tensor as up_st
import torch.distributed._shard.sharding_spec as up_spec
import torch.nn.functional as F
from _timing import timed_cases

import torch_shard.sharded_tensor as ts_st
import torch_shard.sharding_spec as ts_spec
from torch_shard.testing import cpu_loops
from torch_shard.testing._aten_work import aten_work_ops

CASES = (("embedding", None), ("embedding_bag", "sum"), ("embedding_bag", "mean"), ("embedding_bag", "max"))


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def count_aten_ops(fn) -> int:
    return sum(aten_work_ops(fn).values())


def count_syncs(fn, device: torch.device) -> int | None:
    if device.type != "cuda":
        return None
    _sync(device)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            fn()
        finally:
            torch.cuda.set_sync_debug_mode(0)
    return sum("synchroniz" in str(w.message) for w in caught)


def bytes_sent(fn) -> int:
    torch.ops.torch_shard._comm_stats(True)
    fn()
    return torch.ops.torch_shard._comm_stats(True)[0]


def lookup(op: str, mode: str | None, ids: torch.Tensor, weight, max_norm: float | None = None):
    if op == "embedding":
        return F.embedding(ids, weight, max_norm=max_norm)
    return F.embedding_bag(ids, weight, mode=mode, max_norm=max_norm)


class TorchRec:
    """TorchRec's row-wise EmbeddingBagCollection of one table with the same size, on the same ids."""

    def __init__(self, args, mode: str, device: torch.device, ids: torch.Tensor):
        import torchrec
        from torchrec.distributed.model_parallel import DistributedModelParallel
        from torchrec.distributed.sharding_plan import construct_module_sharding_plan, row_wise
        from torchrec.distributed.types import ShardingEnv, ShardingPlan
        from torchrec.optim.apply_optimizer_in_backward import apply_optimizer_in_backward

        pooling = {"sum": torchrec.PoolingType.SUM, "mean": torchrec.PoolingType.MEAN}[mode]
        table = torchrec.EmbeddingBagConfig(
            name="t", embedding_dim=args.dim, num_embeddings=args.rows, feature_names=["f"], pooling=pooling
        )
        ebc = torchrec.EmbeddingBagCollection(tables=[table], device=torch.device("meta"))
        apply_optimizer_in_backward(torch.optim.SGD, ebc.parameters(), {"lr": 0.0})
        world = dist.get_world_size()
        plan = construct_module_sharding_plan(
            ebc, {"t": row_wise()}, local_size=world, world_size=world, device_type=device.type
        )
        env = ShardingEnv.from_process_group(dist.group.WORLD)
        self.model = DistributedModelParallel(ebc, env=env, device=device, plan=ShardingPlan({"": plan}))
        lengths = torch.full((ids.size(0),), ids.size(1), dtype=torch.int64)
        self.kjt = torchrec.KeyedJaggedTensor.from_lengths_sync(
            keys=["f"], values=ids.reshape(-1).cpu(), lengths=lengths
        ).to(device)

    def forward(self):
        return self.model(self.kjt).values()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--dim", type=int, default=64)
    parser.add_argument("--bags", type=int, default=2048)
    parser.add_argument("--ids-per-bag", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--shardings", default="row,col", help="comma-separated: row, col")
    parser.add_argument("--cases", default="embedding,sum,mean,max", help="comma-separated: embedding, sum, mean, max")
    parser.add_argument("--no-backward", action="store_true", help="forward times only")
    parser.add_argument(
        "--gpu-path", action="store_true", help="torch_shard's lookups take the ATen composition GPUs take"
    )
    parser.add_argument(
        "--max-norm", type=float, default=None, help="every lookup renormalises the rows it reads to this norm"
    )
    args = parser.parse_args()
    with cpu_loops(not args.gpu_path):
        run(args)


def run(args) -> None:
    cuda = args.device == "cuda"
    if cuda:
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)) % torch.cuda.device_count())
        torch.cuda.set_device(device)
        dist.init_process_group("nccl", device_id=device)
    else:
        dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    if cuda:
        placements = [f"rank:{r}/cuda:{r % torch.cuda.device_count()}" for r in range(world)]
    else:
        device = torch.device("cpu")
        placements = [f"rank:{r}/cpu" for r in range(world)]
    torch.manual_seed(rank)
    ids = torch.randint(0, args.rows, (args.bags, args.ids_per_bag)).to(device)
    dense = torch.rand(args.rows, args.dim, device=device, requires_grad=True)
    wanted_cases = args.cases.split(",")
    cases = [(op, mode) for op, mode in CASES if (mode or op) in wanted_cases]
    rows = []  # (sharding, case, lib, fwd, fwdbwd, fwd ops, bwd ops, syncs, sent)
    failures: list[str] = []
    for sharding in args.shardings.split(","):
        shard_dim = {"row": 0, "col": 1}[sharding]
        weights = {}
        for lib, lib_st, lib_spec in (("upstream", up_st, up_spec), ("torch_shard", ts_st, ts_spec)):
            spec = lib_spec.ChunkShardingSpec(dim=shard_dim, placements=list(placements))
            weights[lib] = lib_st.rand(spec, args.rows, args.dim, requires_grad=True)
        weights["dense"] = dense
        for op, mode in cases:
            libs = dict(weights)
            forward = {lib: (lambda w=w: lookup(op, mode, ids, w, args.max_norm)) for lib, w in libs.items()}
            if sharding == "row" and op == "embedding_bag" and mode != "max" and args.max_norm is None:
                try:
                    torchrec = TorchRec(args, mode, device, ids)
                    forward["torchrec"] = torchrec.forward
                except Exception as exc:  # noqa: BLE001 - a column, not the benchmark's purpose
                    if rank == 0:
                        print(f"torchrec column skipped: {type(exc).__name__}: {str(exc).splitlines()[0][:120]}")

            def no_grad(fn):
                def run():
                    with torch.no_grad():
                        fn()
                    _sync(device)

                return run

            def with_backward(fn):
                def run():
                    fn().sum().backward()
                    _sync(device)

                return run

            def zero_grads():
                dense.grad = None
                for lib in ("upstream", "torch_shard"):
                    for shard in weights[lib].local_shards():
                        shard.tensor.grad = None

            timing = {f"{lib} fwd": (None, no_grad(fn)) for lib, fn in forward.items()}
            if not args.no_backward:
                for lib, fn in forward.items():
                    # A library whose backward fails (upstream's column-wise max_norm: its output stops
                    # requiring grad once a lookup ran under no_grad) gets no column, and a note.
                    zero_grads()
                    failed = _fails_on_any_rank(lambda fn=fn: (no_grad(fn)(), with_backward(fn)()), device)
                    if failed is None:
                        timing[f"{lib} bwd"] = (zero_grads, with_backward(fn))
                    elif rank == 0:
                        failures.append(f"{sharding} {mode or op} {lib}: fwd+bwd fails ({failed})")
            times = timed_cases(timing, args.repeats)
            for lib, fn in forward.items():
                with torch.no_grad():
                    syncs = count_syncs(fn, device)
                    sent = bytes_sent(fn) if lib == "torch_shard" else None
                ops = count_aten_ops(fn)  # with autograd on, as a training step runs it
                backward_ops = None
                if f"{lib} bwd" in times:
                    zero_grads()
                    out = fn()
                    backward_ops = count_aten_ops(lambda out=out: out.sum().backward())
                rows.append(
                    (sharding, mode or op, lib, times[f"{lib} fwd"], times.get(f"{lib} bwd"), ops, backward_ops, syncs, sent)
                )
    if rank == 0:
        _report(args, world, device, ids, rows)
        for failure in failures:
            print(failure)
    dist.destroy_process_group()


def _fails_on_any_rank(fn, device) -> str | None:
    """None when ``fn`` runs on every rank, else this rank's error (or that another rank failed)."""
    try:
        fn()
        error = None
    except Exception as exc:  # noqa: BLE001 - reported, and the case left out
        error = f"{type(exc).__name__}: {str(exc).splitlines()[0][:100]}"
    flag = torch.tensor([int(error is not None)], device=device)
    dist.all_reduce(flag, op=dist.ReduceOp.MAX)
    return error if error is not None else ("failed on another rank" if flag.item() else None)


def _report(args, world, device, ids, rows) -> None:
    def ms(t):
        return "-" if t is None else f"{t * 1e3:.2f}"

    ids_bound = ids.numel() * 8 + 4 * args.bags * world
    print(
        f"torch {torch.__version__}, {world} {'NCCL' if device.type == 'cuda' else 'gloo'} rank(s) on {device.type}, "
        f"table {args.rows}x{args.dim} float32, {args.bags} bags x {args.ids_per_bag} ids per rank, "
        f"median of {args.repeats}{'' if args.max_norm is None else f', max_norm {args.max_norm}'}; "
        f"ids bound {ids_bound / 1e6:.3f} MB sent per rank"
        f"{'; torch_shard on the GPU path (cpu_loops(False))' if args.gpu_path else ''}"
    )
    header = f"{'sharding':<8} {'case':<10} {'library':<12} {'fwd ms':>9} {'fwd+bwd ms':>11} {'fwd ops':>8} {'bwd ops':>8}"
    print(header + f" {'syncs':>6} {'MB sent':>8} {'fwd/up':>7} {'fwd/dense':>9}")
    by_key = {(s, c, lib): fwd for s, c, lib, fwd, *_ in rows}
    for sharding, case, lib, fwd, fwdbwd, ops, backward_ops, syncs, sent in rows:
        up, dense = by_key.get((sharding, case, "upstream")), by_key.get((sharding, case, "dense"))
        print(
            f"{sharding:<8} {case:<10} {lib:<12} {ms(fwd):>9} {ms(fwdbwd):>11} {ops:>8} "
            f"{'-' if backward_ops is None else backward_ops:>8} "
            f"{'-' if syncs is None else syncs:>6} {'-' if sent is None else f'{sent / 1e6:.3f}':>8} "
            f"{fwd / up:>7.2f} {fwd / dense:>9.2f}"
        )


if __name__ == "__main__":
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    main()
