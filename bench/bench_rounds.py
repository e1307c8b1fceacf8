"""What a data op costs in rounds and time, first call and steady state, beside the raw collectives:
the measurements behind docs/performance.md, "Steady state, per op" (NOTE [ Rooms ]).

Run: ``torchrun --standalone --nproc-per-node=W bench/bench_rounds.py`` (gloo on CPU), or across
emulated hosts with ``scripts/torchrun_hosts.py``. For each op (scatter from rank 0, gather to rank 0,
reshard rows -> columns) and tensor size (float32 N x N, N a multiple of W), it prints the slowest
rank's median time and this rank's collectives:

* first: a layout the group's history has never seen (a fresh tensor size each call), so round 1
  cannot predict it;
* steady: the same op as in a loop (scatter, gather, reshard to columns and back, repeated), once the
  history knows it;

and the raw collectives of the same ops with no agreement: ``dist.all_to_all_single`` of 4 bytes per
peer (one hop of W(W-1) messages: the latency of an all-to-all round) and of the reshard's bytes.
"""

from __future__ import annotations

import argparse

import torch
import torch.distributed as dist
from _timing import timed_cases

import torch_shard
from torch_shard.sharding_spec import ChunkShardingSpec


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[64, 2048])
    parser.add_argument("--repeats", type=int, default=20)
    args = parser.parse_args()
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    placements = [f"rank:{r}/cpu" for r in range(world)]
    rows, cols = (ChunkShardingSpec(dim=d, placements=placements) for d in (0, 1))
    stats = torch.ops.torch_shard._comm_stats
    if rank == 0:
        print(f"torch {torch.__version__}, {world} gloo ranks, float32 N x N; ms (slowest rank, median of "
              f"{args.repeats}) and collectives on rank 0")
        print(f"{'N':>6} {'op':>8} {'first ms':>9} {'coll':>5} {'steady ms':>10} {'coll':>5} {'raw ms':>7}")
    tiny_send, tiny_recv = torch.zeros(world), torch.zeros(world)
    for n in args.sizes:
        full = torch.rand(n, n)
        st = torch_shard._shard_tensor(full, rows)
        out = torch.empty(n, n) if rank == 0 else None
        chunk = (n // world) ** 2
        send, recv = torch.rand(chunk * world), torch.empty(chunk * world)
        grow = iter(range(1, 100_000))
        held = {}

        def fresh_tensor():
            # A size no op on the group has used: its layouts are new to the history.
            held["full"] = torch.rand(n + world * next(grow), n)

        def fresh_sharded():
            fresh_tensor()
            held["st"] = torch_shard._shard_tensor(held["full"], rows)
            held["out"] = torch.empty(held["full"].size()) if rank == 0 else None

        steady = {
            "scatter": (None, lambda: torch_shard._shard_tensor(full, rows)),
            "gather": (None, lambda: st.gather(0, out)),
            "reshard": (None, lambda: (st.reshard(cols), st.reshard(rows))),
        }
        firsts = {
            "scatter": (fresh_tensor, lambda: torch_shard._shard_tensor(held["full"], rows)),
            "gather": (fresh_sharded, lambda: held["st"].gather(0, held["out"])),
            "reshard": (fresh_sharded, lambda: held["st"].reshard(cols)),
        }
        cases = {f"first {k}": f for k, f in firsts.items()}
        cases.update({f"steady {k}": f for k, f in steady.items()})
        cases["raw tiny"] = (None, lambda: dist.all_to_all_single(tiny_recv, tiny_send))
        cases["raw reshard"] = (None, lambda: dist.all_to_all_single(recv, send))
        times = timed_cases(cases, args.repeats)
        rounds = {}
        for name, (setup, fn) in cases.items():
            if setup is not None:
                setup()
            stats(True)
            fn()
            rounds[name] = stats(False)[2]
        if rank == 0:
            for op in ("scatter", "gather", "reshard"):
                halves = 2 if op == "reshard" else 1  # the steady reshard goes there and back
                raw = times["raw reshard" if op == "reshard" else "raw tiny"] * 1e3
                print(f"{n:6d} {op:>8} {times[f'first {op}'] * 1e3:9.2f} {rounds[f'first {op}']:5d} "
                      f"{times[f'steady {op}'] * 1e3 / halves:10.2f} {rounds[f'steady {op}'] // halves:5d} {raw:7.2f}",
                      flush=True)
            print(f"{n:6d} {'a2a hop':>8} {'':>9} {'':>5} {'':>10} {'':>5} {times['raw tiny'] * 1e3:7.2f}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
