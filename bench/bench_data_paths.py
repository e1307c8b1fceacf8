"""Data paths side by side: torch_shard vs torch.distributed._shard (same wheel) vs raw all-to-all.

Run with 4 ranks: ``torchrun --standalone --nproc-per-node=4 bench/bench_data_paths.py`` (or
``make bench``). Gloo on CPU. Cases (4096 x 4096 float32 unless --size says otherwise):

* shard: scatter the full tensor from rank 0 into row chunks (``_shard_tensor``).
* reshard: row chunks -> column chunks (``ShardedTensor.reshard``).
* floor: ``dist.all_to_all_single`` moving exactly the bytes a row->column reshard moves.
* gather: row chunks -> the full tensor on rank 0 (``ShardedTensor.gather``).
* ``--memory``: instead of times, rank 0's peak memory during gather above its starting RSS, as a
  multiple of the output size (a separate run: it changes malloc settings).

Times are the max over ranks per iteration, median over --repeats iterations after one warm-up.
"""

from __future__ import annotations

import argparse
import os

import torch
import torch.distributed as dist
import torch.distributed._shard.api as up_api
import torch.distributed._shard.sharding_spec as up_spec

import torch_shard.api as ts_api
import torch_shard.sharding_spec as ts_spec
from _timing import timed


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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=4096)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument(
        "--memory", action="store_true", help="measure rank 0's peak memory during gather instead of time"
    )
    args = parser.parse_args()
    if args.memory:
        # Set before any large allocation, so every big buffer is its own mapping and freed memory
        # is returned: peak RSS then tracks live memory, with no reuse between the two libraries.
        _fixed_mmap_threshold()
    dist.init_process_group("gloo")
    if args.memory:
        memory_main(args.size)
        dist.destroy_process_group()
        return
    rank, world = dist.get_rank(), dist.get_world_size()
    n = args.size
    placements = [f"rank:{r}/cpu" for r in range(world)]
    torch.manual_seed(0)
    full = torch.rand(n, n)

    results: dict[str, dict[str, float]] = {}
    for name, api, spec_mod in (("upstream", up_api, up_spec), ("torch_shard", ts_api, ts_spec)):
        rows = spec_mod.ChunkShardingSpec(dim=0, placements=list(placements))
        cols = spec_mod.ChunkShardingSpec(dim=1, placements=list(placements))
        res = results.setdefault(name, {})
        res["shard"] = timed(lambda: api._shard_tensor(full, rows), args.repeats)
        st_rows = api._shard_tensor(full, rows)
        # Reshard works in place: time it on fresh row-sharded copies made outside the timed region.
        copies = iter([api._shard_tensor(full, rows) for _ in range(args.repeats + 1)])
        res["reshard"] = timed(lambda: next(copies).reshard(cols), args.repeats)
        out = torch.empty(n, n) if rank == 0 else None
        res["gather"] = timed(lambda: st_rows.gather(0, out), args.repeats)
        if rank == 0:
            res["gather_exact"] = float(torch.equal(out, full))

    # The floor: the bytes a row->column reshard moves, with one all_to_all_single.
    chunk = n // world
    send = torch.empty(world * chunk * chunk)
    recv = torch.empty(world * chunk * chunk)
    splits = [chunk * chunk] * world
    splits[rank] = 0  # a rank's own block does not cross the wire
    send_used = send[: sum(splits)]
    recv_used = recv[: sum(splits)]
    floor = timed(lambda: dist.all_to_all_single(recv_used, send_used, splits, splits), args.repeats)
    # A reshard must land in new memory; the same all-to-all into a fresh output shows what first
    # touching that memory costs on this machine.
    floor_fresh = timed(
        lambda: dist.all_to_all_single(torch.empty(sum(splits)), send_used, splits, splits), args.repeats
    )

    if rank == 0:
        up, ts = results["upstream"], results["torch_shard"]
        print(f"torch {torch.__version__}, {world} gloo ranks, {n}x{n} float32, median of {args.repeats}")
        print(f"{'case':<22} {'upstream':>10} {'torch_shard':>12} {'ratio ts/up':>12}")
        for case in ("shard", "reshard", "gather"):
            print(f"{case + ' (ms)':<22} {up[case] * 1e3:>10.1f} {ts[case] * 1e3:>12.1f} {ts[case] / up[case]:>12.2f}")
        print(f"{'gather exact':<22} {bool(up['gather_exact'])!s:>10} {bool(ts['gather_exact'])!s:>12}")
        print(f"all_to_all_single of the reshard's bytes (floor): {floor * 1e3:.1f} ms preallocated, "
              f"{floor_fresh * 1e3:.1f} ms into a fresh output; torch_shard reshard / floor = "
              f"{ts['reshard'] / floor:.2f} ({ts['reshard'] / floor_fresh:.2f} vs fresh)")
    dist.destroy_process_group()


if __name__ == "__main__":
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    main()
