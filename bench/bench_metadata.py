"""Metadata-heavy paths side by side with torch.distributed._shard (same wheel), 4 gloo ranks.

Run: ``torchrun --standalone --nproc-per-node=4 bench/bench_metadata.py`` (or ``make bench``).

* init_from_local_shards with N = 1024 and 16384 shards in total (N/4 row shards per rank).
* Many tables (100 and 1000; each 4 row shards, one per rank), as a model with one sharded table
  per embedding builds them: upstream's init_from_local_shards once per table, torch_shard's once per
  table, and torch_shard's init_from_local_shards_many once for all of them (one exchange).
* torch.save + torch.load of the state_dict of a module holding 1000 sharded parameters
  (16x16 float32 each, row-chunked over the 4 ranks), to an in-memory buffer.

Times are the slowest rank's, median of --repeats iterations after a warm-up.
"""

from __future__ import annotations

import argparse
import io
import os

import torch
import torch.distributed as dist
import torch.distributed._shard.sharded_tensor as up_st
import torch.distributed._shard.sharding_spec as up_spec
from _timing import timed, timed_cases

import torch_shard.sharded_tensor as ts_st
import torch_shard.sharding_spec as ts_spec


def local_shards(lib_st, lib_spec, total: int, rank: int, world: int, rows: int = 2, cols: int = 8):
    per_rank = total // world
    shards = []
    for i in range(per_rank):
        row = (rank * per_rank + i) * rows
        md = lib_spec.ShardMetadata([row, 0], [rows, cols], f"rank:{rank}/cpu")
        shards.append(lib_st.Shard(torch.zeros(rows, cols), md))
    return shards, [total * rows, cols]


class ManyShardedParams(torch.nn.Module):
    def __init__(self, lib_st, spec, count: int):
        super().__init__()
        for i in range(count):
            setattr(self, f"p{i}", lib_st.rand(spec, 16, 16))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--params", type=int, default=1000)
    parser.add_argument("--tables", type=int, nargs="+", default=[100, 1000])
    args = parser.parse_args()
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    libs = {"upstream": (up_st, up_spec), "torch_shard": (ts_st, ts_spec)}
    rows = []
    for total in (1024, 16384):
        times = {}
        for name, (lib_st, lib_spec) in libs.items():
            shards, size = local_shards(lib_st, lib_spec, total, rank, world)
            times[name] = timed(lambda: lib_st.init_from_local_shards(shards, size), args.repeats)
        rows.append((f"init_from_local_shards, {total} shards", times))

    many_rows = []
    for tables in args.tables:
        per_table = [local_shards(ts_st, ts_spec, world, rank, world) for _ in range(tables)]
        up_tables = [local_shards(up_st, up_spec, world, rank, world) for _ in range(tables)]
        cases = {
            "upstream, one call per table": (None, lambda: [up_st.init_from_local_shards(s, z) for s, z in up_tables]),
            "torch_shard, one call per table": (None, lambda: [ts_st.init_from_local_shards(s, z) for s, z in per_table]),
            "torch_shard, init_from_local_shards_many": (
                None,
                lambda: ts_st.init_from_local_shards_many([s for s, _ in per_table], [z for _, z in per_table]),
            ),
        }
        many_rows.append((tables, timed_cases(cases, args.repeats)))

    for name, (lib_st, lib_spec) in libs.items():
        spec = lib_spec.ChunkShardingSpec(dim=0, placements=[f"rank:{r}/cpu" for r in range(world)])
        module = ManyShardedParams(lib_st, spec, args.params)
        module._register_state_dict_hook(lib_st.state_dict_hook)
        target = ManyShardedParams(lib_st, spec, 0)
        target._register_load_state_dict_pre_hook(lib_st.pre_load_state_dict_hook, True)

        def save_load():
            buffer = io.BytesIO()
            torch.save(module.state_dict(), buffer)
            buffer.seek(0)
            loaded = torch.load(buffer, weights_only=False)
            target.load_state_dict(loaded, strict=False)

        t = timed(save_load, args.repeats)
        rows_entry = next((r for r in rows if r[0].startswith("state_dict")), None)
        if rows_entry is None:
            rows.append((f"state_dict save+load, {args.params} params", {name: t}))
        else:
            rows_entry[1][name] = t

    if rank == 0:
        print(f"torch {torch.__version__}, {world} gloo ranks, median of {args.repeats}")
        print(f"{'case':<42} {'upstream ms':>12} {'torch_shard ms':>15} {'ratio ts/up':>12}")
        for label, times in rows:
            up, ts = times["upstream"], times["torch_shard"]
            print(f"{label:<42} {up * 1e3:>12.1f} {ts * 1e3:>15.1f} {ts / up:>12.2f}")
        print()
        print(f"{'tables':>6} {'case':<44} {'ms':>10} {'vs upstream':>12} {'vs per-table':>13}")
        for tables, times in many_rows:
            up = times["upstream, one call per table"]
            each = times["torch_shard, one call per table"]
            for label, t in times.items():
                print(f"{tables:>6} {label:<44} {t * 1e3:>10.1f} {t / up:>12.3f} {t / each:>13.3f}")
    dist.destroy_process_group()


if __name__ == "__main__":
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    main()
