"""Sharded embedding_bag forward: torch_shard vs torch.distributed._shard (same wheel), 4 gloo ranks.

Run: ``torchrun --standalone --nproc-per-node=4 bench/bench_embedding.py`` (or ``make bench``).
A [1,000,000 x 128] float32 table (--rows/--dim), sharded row-wise and column-wise; every rank looks
up its own 8192 bags of 20 random ids (sum mode). Times are the slowest rank's, median of --repeats
iterations after a warm-up; bytes are what one rank sends to other ranks per forward (torch_shard's
counters).
"""

from __future__ import annotations

import argparse
import os

import torch
import torch.distributed as dist
import torch.distributed._shard.sharded_tensor as up_st
import torch.distributed._shard.sharding_spec as up_spec
import torch.nn.functional as F
from _timing import timed

import torch_shard.sharded_tensor as ts_st
import torch_shard.sharding_spec as ts_spec


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--dim", type=int, default=128)
    parser.add_argument("--bags", type=int, default=8192)
    parser.add_argument("--ids-per-bag", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(rank)
    ids = torch.randint(0, args.rows, (args.bags, args.ids_per_bag))
    placements = [f"rank:{r}/cpu" for r in range(world)]
    results = {}
    for dim_name, shard_dim in (("row-wise", 0), ("column-wise", 1)):
        for lib, lib_st, lib_spec in (("upstream", up_st, up_spec), ("torch_shard", ts_st, ts_spec)):
            spec = lib_spec.ChunkShardingSpec(dim=shard_dim, placements=list(placements))
            weight = lib_st.rand(spec, args.rows, args.dim)
            with torch.no_grad():
                if lib == "torch_shard":
                    torch.ops.torch_shard._comm_stats(True)
                t = timed(lambda: F.embedding_bag(ids, weight, mode="sum"), args.repeats)
                sent = None
                if lib == "torch_shard":
                    stats = torch.ops.torch_shard._comm_stats(True)
                    sent = stats[0] / (args.repeats + 1)
            results[(dim_name, lib)] = (t, sent)
    if rank == 0:
        print(
            f"torch {torch.__version__}, {world} gloo ranks, table {args.rows}x{args.dim} float32, "
            f"{args.bags} bags x {args.ids_per_bag} ids per rank, median of {args.repeats}"
        )
        print(f"{'sharding':<12} {'upstream ms':>12} {'torch_shard ms':>15} {'ratio ts/up':>12} {'MB sent/rank':>13}")
        for dim_name in ("row-wise", "column-wise"):
            up, _ = results[(dim_name, "upstream")]
            ts, sent = results[(dim_name, "torch_shard")]
            print(f"{dim_name:<12} {up * 1e3:>12.1f} {ts * 1e3:>15.1f} {ts / up:>12.2f} {sent / 1e6:>13.1f}")
    dist.destroy_process_group()


if __name__ == "__main__":
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    main()
