"""Data paths side by side: torch_shard vs torch.distributed._shard (same wheel) vs DTensor vs a raw
all-to-all floor.

Run with 4 ranks: ``torchrun --standalone --nproc-per-node=4 bench/bench_data_paths.py`` (or
``make bench``); any world size W works, with every N a multiple of W. Gloo on CPU, float32 N x N for
each N of --sizes (default 64 512 2048 4096):

* scatter from rank 0 into row chunks: upstream ``_shard_tensor``, torch_shard ``_shard_tensor``,
  DTensor ``distribute_tensor(src_data_rank=0)`` with ``[Shard(0)]``;
* reshard row chunks -> column chunks: upstream / torch_shard ``reshard``, DTensor ``redistribute``
  Shard(0) -> Shard(1); the floor is ``dist.all_to_all_single`` of exactly the bytes that move;
* gather row chunks to rank 0: upstream / torch_shard ``gather``; DTensor has no gather-to-one, its
  ``full_tensor()`` (every rank gets the tensor) is shown for reference.

A second table sets each op against its floor: the same bytes moved by one unchecked collective with
no wrapper (scatter: ``dist.scatter`` into a new row chunk; gather: rank 0 receives each peer's rows
straight into ``out``; reshard: the all-to-all above). ``fl/up`` is the lowest gather/upstream ratio
any gather can reach here.

Variants run interleaved; times are the slowest rank's, median over --repeats after a warm-up. The
64 x 64 case is also printed in microseconds (small-op latency: fixed per-op costs dominate).
``--memory``: instead of times, rank 0's peak memory during gather above its starting RSS, as a
multiple of the output size (a separate run: it changes malloc settings).

``--json PATH``: rank 0 also writes the run's times (seconds per case and size) there, for drivers such
as bench/sweep.py that collect many runs. ``--round-one auto|all_to_all`` sets torch_shard's exchange
mode for round 1 first (see bench/_round_one.py).
"""

from __future__ import annotations

import argparse
import json
import os

import torch
import torch.distributed as dist
import torch.distributed._shard.api as up_api
import torch.distributed._shard.sharding_spec as up_spec
from _round_one import ROUND_ONE_MODES, set_round_one
from _timing import timed_cases
from torch.distributed.tensor import Shard, distribute_tensor, init_device_mesh

import torch_shard.api as ts_api
import torch_shard.sharding_spec as ts_spec


def _fixed_mmap_threshold() -> None:
    # glibc raises its mmap threshold after large frees and then serves big blocks from the heap,
    # whose freed pages stay resident; RSS would then hide allocations. A fixed threshold keeps
    # large buffers in their own mappings, so peak RSS tracks live memory.
    try:
        import ctypes

        ctypes.CDLL("libc.so.6").mallopt(-3, 1 << 20)  # M_MMAP_THRESHOLD = 1 MiB
    except OSError:
        pass


def _rss_bytes(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    return -1


def _reset_peak_rss() -> bool:
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False



def peak_gather_memory(st, size, rank: int) -> float:
    """Rank 0's peak RSS growth during one gather, as a multiple of the output's size."""
    dist.barrier()
    out_bytes = size * size * 4
    out = None
    if rank == 0:
        _reset_peak_rss()
        base = _rss_bytes("VmRSS")
        out = torch.empty(size, size)
    st.gather(0, out)
    ratio = 0.0
    if rank == 0:
        ratio = (_rss_bytes("VmHWM") - base) / out_bytes
    del out
    dist.barrier()
    return ratio


def memory_main(n: int) -> None:
    rank, world = dist.get_rank(), dist.get_world_size()
    placements = [f"rank:{r}/cpu" for r in range(world)]
    full = torch.rand(n, n)
    ratios = {}
    for name, api, spec_mod in (("upstream", up_api, up_spec), ("torch_shard", ts_api, ts_spec)):
        st = api._shard_tensor(full, spec_mod.ChunkShardingSpec(dim=0, placements=list(placements)))
        ratios[name] = peak_gather_memory(st, n, rank)
        del st
    if rank == 0:
        print(f"gather to rank 0 of {n}x{n} float32 row chunks: peak memory on rank 0 above its "
              f"starting RSS, as a multiple of the output size")
        print(f"  upstream {ratios['upstream']:.2f}x   torch_shard {ratios['torch_shard']:.2f}x")


def time_size(n: int, repeats: int, mesh) -> dict[str, float]:
    rank, world = dist.get_rank(), dist.get_world_size()
    placements = [f"rank:{r}/cpu" for r in range(world)]
    torch.manual_seed(0)
    full = torch.rand(n, n)
    cases = {}
    tensors = {}
    for name, api, spec_mod in (("upstream", up_api, up_spec), ("torch_shard", ts_api, ts_spec)):
        rows = spec_mod.ChunkShardingSpec(dim=0, placements=list(placements))
        cols = spec_mod.ChunkShardingSpec(dim=1, placements=list(placements))
        st = api._shard_tensor(full, rows)
        moving = api._shard_tensor(full, rows)
        tensors[name] = st
        out = torch.empty(n, n) if rank == 0 else None
        cases[f"{name} scatter"] = (None, lambda api=api, rows=rows: api._shard_tensor(full, rows))
        # Reshard works in place: put the tensor back in rows (untimed), then time rows -> cols.
        cases[f"{name} reshard"] = (
            lambda moving=moving, rows=rows: moving.reshard(rows),
            lambda moving=moving, cols=cols: moving.reshard(cols),
        )
        cases[f"{name} gather"] = (None, lambda st=st, out=out: st.gather(0, out))
    dt_rows = distribute_tensor(full, mesh, [Shard(0)], src_data_rank=0)
    cases["dtensor scatter"] = (None, lambda: distribute_tensor(full, mesh, [Shard(0)], src_data_rank=0))
    cases["dtensor reshard"] = (None, lambda: dt_rows.redistribute(mesh, [Shard(1)]))
    cases["dtensor full_tensor"] = (None, lambda: dt_rows.full_tensor())
    # The floor: the bytes a row->column reshard moves, with one all_to_all_single into preallocated
    # buffers (a rank's own block does not cross the wire).
    chunk = n // world
    splits = [chunk * chunk] * world
    splits[rank] = 0
    send = torch.rand(sum(splits))
    recv = torch.empty(sum(splits))
    cases["floor all_to_all"] = (None, lambda: dist.all_to_all_single(recv, send, splits, splits))
    # Floors of the other two ops: the same bytes with one unchecked collective and no wrapper. A
    # scatter must produce a new row chunk on every rank (allocated per call, as the op does); a
    # gather to rank 0 receives each peer's rows straight into `out`, the fewest copies possible.
    row_chunks = list(full.chunk(world)) if rank == 0 else None
    gather_out = torch.empty(n, n) if rank == 0 else None
    mine = full.chunk(world)[rank].clone()

    def floor_scatter():
        fresh = torch.empty_like(mine)
        dist.scatter(fresh, row_chunks, src=0)
        return fresh

    def floor_gather():
        if rank != 0:
            dist.send(mine, dst=0)
            return
        rows_of = gather_out.chunk(world)
        works = [dist.irecv(rows_of[r], src=r) for r in range(1, world)]
        rows_of[0].copy_(mine)
        for work in works:
            work.wait()

    cases["floor scatter"] = (None, floor_scatter)
    cases["floor gather"] = (None, floor_gather)
    res = timed_cases(cases, repeats)
    # Correctness gate: bit-exact gather for both libraries.
    for name, st in tensors.items():
        out = torch.empty(n, n) if rank == 0 else None
        st.gather(0, out)
        if rank == 0 and not torch.equal(out, full):
            raise AssertionError(f"{name} gather of {n}x{n} is not bit-exact")
    return res


def write_json(path: str, rows, world: int, round_one: str | None, repeats: dict[int, int]) -> None:
    """The run's medians (seconds) per size and case, with what a table of many runs needs to label it."""
    local = int(os.environ.get("LOCAL_WORLD_SIZE", world))
    record = {
        "torch": torch.__version__,
        "world": world,
        "hosts": world // local if local and world % local == 0 else None,
        "round_one": round_one,
        "repeats": {str(n): repeats[n] for n, _ in rows},
        "seconds": {str(n): r for n, r in rows},
    }
    with open(path, "w") as f:
        json.dump(record, f, indent=1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[64, 512, 2048, 4096])
    parser.add_argument("--repeats", type=int, default=0, help="0: 40 for N <= 512, else 7")
    parser.add_argument("--size", type=int, default=4096, help="tensor size for --memory")
    parser.add_argument(
        "--memory", action="store_true", help="measure rank 0's peak memory during gather instead of time"
    )
    parser.add_argument("--json", metavar="PATH", help="rank 0 writes the times there as JSON")
    parser.add_argument(
        "--round-one", choices=ROUND_ONE_MODES, help="torch_shard's round-1 exchange mode (default: leave it)"
    )
    args = parser.parse_args()
    if args.memory:
        # Set before any large allocation, so every big buffer is its own mapping and freed memory
        # is returned: peak RSS then tracks live memory, with no reuse between the two libraries.
        _fixed_mmap_threshold()
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    if args.memory:
        memory_main(args.size)
        dist.destroy_process_group()
        return
    rank, world = dist.get_rank(), dist.get_world_size()
    # Row and column chunks of equal size on every rank: the floors' collectives (gloo's scatter
    # among them) need equal pieces, and the all-to-all floor counts W equal blocks.
    uneven = [n for n in args.sizes if n % world]
    if uneven:
        if rank == 0:
            print(f"bench_data_paths: every size must be a multiple of the world size {world}; not {uneven}")
        dist.destroy_process_group()
        raise SystemExit(2)
    round_one = None
    if args.round_one is not None:
        round_one = args.round_one if set_round_one(args.round_one) else None
        if round_one is None and rank == 0:
            print(f"this build has no torch_shard._testing_C: --round-one {args.round_one} not applied")
    mesh = init_device_mesh("cpu", (world,))
    rows = []
    repeats = {}
    for n in args.sizes:
        repeats[n] = args.repeats or (40 if n <= 512 else 7)
        rows.append((n, time_size(n, repeats[n], mesh)))
    if rank != 0:
        dist.destroy_process_group()
        return
    if args.json:
        write_json(args.json, rows, world, round_one, repeats)
    mode = f", round 1: {round_one}" if round_one else ""
    print(f"torch {torch.__version__}, {world} gloo ranks{mode}, float32 N x N, slowest rank, median; ms")
    header = (f"{'N':>5} | {'scatter up':>10} {'ts':>7} {'dt':>7} {'ts/up':>6} {'ts/dt':>6} | "
              f"{'reshard up':>10} {'ts':>7} {'dt':>7} {'floor':>7} {'ts/up':>6} {'ts/dt':>6} {'ts/fl':>6} | "
              f"{'gather up':>9} {'ts':>7} {'ts/up':>6} {'dt full':>8}")
    print(header)
    for n, r in rows:
        def ms(key):
            return r[key] * 1e3
        print(f"{n:>5} | {ms('upstream scatter'):>10.2f} {ms('torch_shard scatter'):>7.2f} {ms('dtensor scatter'):>7.2f} "
              f"{r['torch_shard scatter'] / r['upstream scatter']:>6.2f} {r['torch_shard scatter'] / r['dtensor scatter']:>6.2f} | "
              f"{ms('upstream reshard'):>10.2f} {ms('torch_shard reshard'):>7.2f} {ms('dtensor reshard'):>7.2f} "
              f"{ms('floor all_to_all'):>7.2f} {r['torch_shard reshard'] / r['upstream reshard']:>6.2f} "
              f"{r['torch_shard reshard'] / r['dtensor reshard']:>6.2f} {r['torch_shard reshard'] / r['floor all_to_all']:>6.2f} | "
              f"{ms('upstream gather'):>9.2f} {ms('torch_shard gather'):>7.2f} "
              f"{r['torch_shard gather'] / r['upstream gather']:>6.2f} {ms('dtensor full_tensor'):>8.2f}")
    print("\nthe same run against each op's floor (one unchecked collective, no wrapper); ms")
    print(f"{'N':>5} | {'scatter floor':>13} {'ts/fl':>6} {'dt/fl':>6} {'up/fl':>6} | "
          f"{'gather floor':>12} {'ts/fl':>6} {'up/fl':>6} {'fl/up':>6} | {'reshard ts/fl':>13}")
    for n, r in rows:
        sf, gf = r["floor scatter"], r["floor gather"]
        print(f"{n:>5} | {sf * 1e3:>13.2f} {r['torch_shard scatter'] / sf:>6.2f} {r['dtensor scatter'] / sf:>6.2f} "
              f"{r['upstream scatter'] / sf:>6.2f} | {gf * 1e3:>12.2f} {r['torch_shard gather'] / gf:>6.2f} "
              f"{r['upstream gather'] / gf:>6.2f} {gf / r['upstream gather']:>6.2f} | "
              f"{r['torch_shard reshard'] / r['floor all_to_all']:>13.2f}")
    small = [r for n, r in rows if n == 64]
    if small:
        r = small[0]
        print("\nsmall-op latency, 64 x 64 float32, microseconds per op")
        print(f"{'op':<10} {'upstream':>10} {'torch_shard':>12} {'ratio':>7}")
        for op in ("scatter", "reshard", "gather"):
            up, ts = r[f"upstream {op}"] * 1e6, r[f"torch_shard {op}"] * 1e6
            print(f"{op:<10} {up:>10.0f} {ts:>12.0f} {ts / up:>7.2f}")
    dist.destroy_process_group()


if __name__ == "__main__":
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main()
