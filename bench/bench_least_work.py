"""The least a layout change must do, against the raw all-to-all floor of bench_dtensor.py.

Run: ``torchrun --standalone --nproc-per-node=4 bench/bench_least_work.py`` (gloo on CPU).

bench_dtensor.py's "raw a2a" floor is one ``all_to_all_single`` from and into buffers made beforehand:
nothing packed, unpacked or allocated. A redistribution cannot be that: it returns a fresh tensor, and
a change of the sharded dim needs one copy on one side. This bench times, for a 1-D Shard(0) <->
Shard(1) of a float32 N x N tensor, hand-written code that does only that and nothing else (no
agreement, no checks, no Python around it), interleaved with the floor (slowest rank's median):

* Shard(0) -> Shard(1): pack each peer's column block of the row shard into a reused buffer, one
  all-to-all into a fresh column shard (the blocks arrive as consecutive rows: no unpack);
* Shard(1) -> Shard(0): one all-to-all of the column shard's row blocks (consecutive: no pack) into a
  reused buffer, unpacked into a fresh row shard.

Its ratios bound from below what torch_shard.interop.redistribute (or any redistribution) can reach
against that floor on the machine it runs on. In the same run, interleaved with them, the same moves
by torch_shard (``interop.redistribute`` of a DTensor; ``ShardedTensor.reshard`` between row and column
chunks, each way) and by DTensor's ``redistribute``: the second table gives each against the least
work of its direction ("ts/least", the target is at most 1.3) and against DTensor.
"""

from __future__ import annotations

import argparse

import torch
import torch.distributed as dist
from _timing import timed_cases
from torch.distributed.tensor import Shard, distribute_tensor, init_device_mesh

import torch_shard
from torch_shard.interop import redistribute
from torch_shard.sharding_spec import ChunkShardingSpec


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="512,1024,2048", help="square sizes, comma-separated")
    parser.add_argument("--repeats", type=int, default=25)
    args = parser.parse_args()
    dist.init_process_group("gloo")
    world = dist.get_world_size()
    mesh = init_device_mesh("cpu", (world,))
    placements = [f"rank:{r}/cpu" for r in range(world)]
    row_spec, column_spec = (ChunkShardingSpec(dim=d, placements=placements) for d in (0, 1))
    moves = {}
    if dist.get_rank() == 0:
        print(f"torch {torch.__version__}, {world} gloo ranks, float32, median of {args.repeats}")
        print(f"{'size':>6} {'raw a2a ms':>11} {'least S0->S1 ms':>16} {'least S1->S0 ms':>16} {'ratios':>12}")
    for n in map(int, args.sizes.split(",")):
        b = n // world
        rows = torch.randn(b, n)  # this rank's Shard(0)
        send, recv = torch.randn(world * b * b), torch.empty(world * b * b)  # the floor's buffers
        pack = torch.empty(world, b, b)

        def raw() -> None:
            dist.all_to_all_single(recv, send)

        def rows_to_columns() -> torch.Tensor:
            for p in range(world):
                pack[p].copy_(rows[:, p * b : (p + 1) * b])
            columns = torch.empty(n, b)
            dist.all_to_all_single(columns.view(-1), pack.view(-1))
            return columns

        def columns_to_rows() -> torch.Tensor:
            dist.all_to_all_single(recv, send)
            out = torch.empty(b, n)
            for p in range(world):
                out[:, p * b : (p + 1) * b].copy_(recv[p * b * b : (p + 1) * b * b].view(b, b))
            return out

        full = torch.randn(n, n)
        dt_rows, dt_cols = (distribute_tensor(full, mesh, [Shard(d)]) for d in (0, 1))
        st = torch_shard._shard_tensor(full, row_spec)
        times = timed_cases(
            {
                "raw": (None, raw),
                "s0s1": (None, rows_to_columns),
                "s1s0": (None, columns_to_rows),
                "ts redistribute s0s1": (None, lambda: redistribute(dt_rows, mesh, [Shard(1)])),
                "ts redistribute s1s0": (None, lambda: redistribute(dt_cols, mesh, [Shard(0)])),
                "ts reshard s0s1": (lambda: st.reshard(row_spec), lambda: st.reshard(column_spec)),
                "ts reshard s1s0": (lambda: st.reshard(column_spec), lambda: st.reshard(row_spec)),
                "dt s0s1": (None, lambda: dt_rows.redistribute(mesh, [Shard(1)])),
                "dt s1s0": (None, lambda: dt_cols.redistribute(mesh, [Shard(0)])),
            },
            args.repeats,
        )
        moves[n] = times
        if dist.get_rank() == 0:
            r, a, c = (times[k] * 1e3 for k in ("raw", "s0s1", "s1s0"))
            print(f"{n:6d} {r:11.2f} {a:16.2f} {c:16.2f} {a / r:5.2f} {c / r:5.2f}", flush=True)
    if dist.get_rank() == 0:
        print("\nthe same moves by torch_shard and DTensor, same run: ms, and against the least work of the move")
        print(f"{'size':>6} {'move':>9} {'least':>7} {'redist':>7} {'reshard':>8} {'DTensor':>8} "
              f"{'redist/least':>13} {'reshard/least':>14} {'redist/DT':>10}")
        for n, times in moves.items():
            for way, label in (("s0s1", "S0->S1"), ("s1s0", "S1->S0")):
                least, red, res, dt = (
                    times[k] * 1e3 for k in (way, f"ts redistribute {way}", f"ts reshard {way}", f"dt {way}")
                )
                print(f"{n:6d} {label:>9} {least:7.2f} {red:7.2f} {res:8.2f} {dt:8.2f} "
                      f"{red / least:13.2f} {res / least:14.2f} {red / dt:10.2f}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
