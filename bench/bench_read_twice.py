"""Where a checked load should stop staging whole chunks and read them twice instead (NOTE [ Whole chunks
are checked, then read again into the destination ], ``torch_shard/checkpoint/read/chunk.py``'s ``_READ_TWICE_FROM``).

Run with ``torchrun --standalone --nproc-per-node=4 bench/bench_read_twice.py``. For saved chunks of 4 to
128 MiB (a float32 tensor of 4 x that many bytes in row chunks, saved by ``ChecksumFileSystemWriter``),
every rank loads its own chunk back (the same layout) three ways, interleaved, ``--repeats`` times:
DCP's ``FileSystemReader``, a checked load that stages each whole chunk in memory of its own and copies
it into the destination after the agreement, and one that only hashes it before the agreement and reads
it again from the page cache straight into the destination. Files sit in the page cache (no drop): the
times are of memory, the allocator and the copies. Prints the median (max over ranks) per size and the
two ratios to ``FileSystemReader``; the threshold is where reading twice starts to win.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import tempfile
import time
from unittest import mock

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp

from torch_shard import sharded_tensor
from torch_shard.checkpoint import ByteRangeFileSystemReader, ChecksumFileSystemWriter
from torch_shard.checkpoint.read import chunk as read_chunk
from torch_shard.sharding_spec import ChunkShardingSpec


def _max_over_ranks(seconds: float) -> float:
    t = torch.tensor([seconds])
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t.item()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--chunk-mib", default="4,8,16,32,64,128", help="saved chunk sizes, MiB")
    parser.add_argument("--cols", type=int, default=1024)
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    spec = ChunkShardingSpec(dim=0, placements=[f"rank:{r}/cpu" for r in range(world)])
    root = [tempfile.mkdtemp(prefix="torch_shard_read_twice_") if rank == 0 else None]
    dist.broadcast_object_list(root)
    rows_out = []
    try:
        for mib in (int(m) for m in args.chunk_mib.split(",")):
            rows = mib * 2**20 // (4 * args.cols) * world
            path = f"{root[0]}/{mib}"
            st = sharded_tensor.rand(spec, rows, args.cols)
            dcp.save({"w": st}, storage_writer=ChecksumFileSystemWriter(path))
            target = {"w": sharded_tensor.zeros(spec, rows, args.cols)}
            ways = {
                "FileSystemReader": (lambda: dcp.FileSystemReader(path), None),
                "staged": (lambda: ByteRangeFileSystemReader(path, read_once=False), 1 << 62),
                "read twice": (lambda: ByteRangeFileSystemReader(path, read_once=False), 0),
            }
            times: dict[str, list[float]] = {name: [] for name in ways}
            for i in range(args.repeats + 1):
                for name, (make, threshold) in ways.items():
                    patch = (mock.patch.object(read_chunk, "_READ_TWICE_FROM", threshold) if threshold is not None
                             else mock.patch.object(read_chunk, "_READ_TWICE_FROM", read_chunk._READ_TWICE_FROM))
                    dist.barrier()
                    with patch:
                        start = time.perf_counter()
                        dcp.load(target, storage_reader=make())
                        took = _max_over_ranks(time.perf_counter() - start)
                    if i:  # the first round warms up
                        times[name].append(took)
            if not torch.equal(target["w"].local_shards()[0].tensor, st.local_shards()[0].tensor):
                raise RuntimeError("loaded values differ")
            rows_out.append((mib, {name: statistics.median(v) for name, v in times.items()}))
            dist.barrier()
            if rank == 0:
                shutil.rmtree(path, ignore_errors=True)
    finally:
        dist.barrier()
        if rank == 0:
            shutil.rmtree(root[0], ignore_errors=True)
    if rank == 0:
        print(f"\nsame-layout checked loads, {world} ranks, one saved chunk per rank, page cache warm, "
              f"median of {args.repeats} (max over ranks)\n")
        print("| chunk MiB | FileSystemReader ms | staged ms | read twice ms | staged / FSR | read twice / FSR |")
        print("|---|---|---|---|---|---|")
        for mib, t in rows_out:
            fsr = t["FileSystemReader"]
            print(f"| {mib} | {1e3 * fsr:.1f} | {1e3 * t['staged']:.1f} | {1e3 * t['read twice']:.1f} "
                  f"| {t['staged'] / fsr:.2f}x | {t['read twice'] / fsr:.2f}x |")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
