"""Shard-layout validation: torch_shard (C++) vs torch.distributed._shard, same torch wheel.

Times ``EnumerableShardingSpec(shards)`` (overlap validation) plus ``build_metadata`` (bounds and
coverage against the global size) for 1-D row layouts and 2-D grids of N shards. ShardMetadata
objects are built before timing, for each library, so only validation is measured.

Run: ``.venv/bin/python bench/bench_validation.py [--sizes 1024 4096 16384] [--repeats 5]``
"""

from __future__ import annotations

import argparse
import math
import statistics
import time

import torch
import torch.distributed._shard.sharded_tensor.metadata as up_md
import torch.distributed._shard.sharding_spec as up_spec

import torch_shard.sharded_tensor as ts_md
import torch_shard.sharding_spec as ts_spec


def row_layout(n: int, rows_per_shard: int = 4, cols: int = 8):
    boxes = [([i * rows_per_shard, 0], [rows_per_shard, cols]) for i in range(n)]
    return boxes, [n * rows_per_shard, cols]


def grid_layout(n: int, tile: int = 4):
    side = int(math.isqrt(n))
    boxes = [([r * tile, c * tile], [tile, tile]) for r in range(side) for c in range(side)]
    return boxes, [side * tile, side * tile]


def timed(fn, repeats: int) -> float:
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)


def bench(kind: str, n: int, repeats: int) -> tuple[float, float]:
    boxes, size = (row_layout if kind == "1-D rows" else grid_layout)(n)
    world = 4
    up_shards = [up_spec.ShardMetadata(o, s, f"rank:{i % world}/cpu") for i, (o, s) in enumerate(boxes)]
    ts_shards = [ts_spec.ShardMetadata(o, s, f"rank:{i % world}/cpu") for i, (o, s) in enumerate(boxes)]
    gsize = torch.Size(size)

    def upstream():
        up_spec.EnumerableShardingSpec(up_shards).build_metadata(gsize, up_md.TensorProperties())

    def ours():
        ts_spec.EnumerableShardingSpec(ts_shards).build_metadata(gsize, ts_md.TensorProperties())

    ours()  # warm-up (op lookup)
    upstream()
    return timed(upstream, repeats), timed(ours, repeats)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[1024, 4096, 16384])
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    print(f"torch {torch.__version__}; median of {args.repeats} runs")
    print(f"{'layout':<10} {'shards':>7} {'upstream ms':>12} {'torch_shard ms':>15} {'speed-up':>9}")
    for kind in ("1-D rows", "2-D grid"):
        for n in args.sizes:
            up, ours = bench(kind, n, args.repeats)
            print(f"{kind:<10} {n:>7} {up * 1e3:>12.2f} {ours * 1e3:>15.2f} {up / ours:>8.1f}x")


if __name__ == "__main__":
    main()
