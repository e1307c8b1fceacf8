"""Checkpoints through torch.distributed.checkpoint: torch_shard vs DTensor vs torch.distributed._shard,
and what checking every byte costs.

Run with 2 or 4 ranks: ``torchrun --standalone --nproc-per-node=4 bench/bench_checkpoint.py`` (or
``make bench``); ``--size 4096`` is a 64 MiB float32 tensor, ``--size 16384`` 1 GiB, and ``--size 256
--tensors 100`` a state dict of a hundred 256 KiB tensors (a model's many small parameters, where a
load's fixed costs per item and per checkpoint show). Gloo on CPU. The tensor is saved in row chunks
with ``dcp.save`` (``FileSystemWriter``, and ``ChecksumFileSystemWriter`` for the
"torch_shard+checksums" row), then loaded with ``dcp.load`` into row chunks (the same layout)
and into column chunks:

* torch_shard: ``ShardedTensor`` with ``ChunkShardingSpec(dim=0 / 1)``;
* DTensor: ``[Shard(0)]`` / ``[Shard(1)]`` on a 1-D mesh;
* upstream: ``torch.distributed._shard`` ``ShardedTensor`` with its ``ChunkShardingSpec``;
* each through DCP's ``FileSystemReader`` and ``torch_shard.checkpoint.ByteRangeFileSystemReader``,
  unchecked (``verify=False``) and checked (the default).

The lines after the table are the issue-32 ratios on the same files: checked load / ``FileSystemReader``
(same layout, resharded), checked / unchecked, ``ChecksumFileSystemWriter`` / ``FileSystemWriter``
save, and where a checked load's time goes (``ByteRangeFileSystemReader.timings``: read, check, agree,
write into the destinations; the slowest rank's, from one extra load).

Times are the max over ranks per iteration, median over --repeats iterations after one warm-up, with
the cases compared interleaved (all saves; per library and layout, all readers). Bytes read are the
largest per-rank growth of ``rchar`` in /proc/self/io over one load: what the process read through
read()-family system calls (checkpoint data, archive headers, the metadata file on the coordinator).
The files sit in the page cache after the save, so the times are of reading memory and
deserialising, not of a disk.
"""

from __future__ import annotations

import argparse
import functools
import shutil
import tempfile
import warnings

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from _timing import timed_cases
from torch.distributed._shard import sharded_tensor as up_sharded_tensor
from torch.distributed._shard.sharding_spec import ChunkShardingSpec as UpChunkShardingSpec
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Shard
from torch.distributed.tensor import zeros as dtensor_zeros

from torch_shard import sharded_tensor
from torch_shard.checkpoint import ByteRangeFileSystemReader, ChecksumFileSystemWriter
from torch_shard.checkpoint._archive import CRC32_BACKEND
from torch_shard.sharding_spec import ChunkShardingSpec


def _rchar() -> int:
    with open("/proc/self/io") as f:
        for line in f:
            if line.startswith("rchar:"):
                return int(line.split()[1])
    raise RuntimeError("no rchar in /proc/self/io")


def _max_over_ranks(value: float) -> float:
    t = torch.tensor([value], dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t.item()


def _bytes_read(fn) -> float:
    dist.barrier()
    before = _rchar()
    fn()
    return _max_over_ranks(_rchar() - before)


def _fill(st, full):
    for shard in st.local_shards():
        md = shard.metadata
        shard.tensor.copy_(full[tuple(slice(o, o + s) for o, s in zip(md.shard_offsets, md.shard_sizes))])
    return st


def _load(targets: dict, reader_cls, path):
    reader = reader_cls(path)
    dcp.load(dict(targets), storage_reader=reader)
    return reader


def _holds(local: torch.Tensor, full: torch.Tensor, offsets) -> bool:
    return torch.equal(local, full[tuple(slice(o, o + s) for o, s in zip(offsets, local.shape))])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=4096)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--tensors", type=int, default=1,
                        help="how many --size x --size tensors the state dict holds (a model's many small ones)")
    parser.add_argument(
        "--libraries",
        default="torch_shard,DTensor,upstream,torch_shard+checksums",
        help="comma-separated rows to run (torch_shard, DTensor, upstream, torch_shard+checksums)",
    )
    args = parser.parse_args()
    warnings.filterwarnings("ignore")  # upstream's deprecation notices, one per call

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    n = args.size
    torch.manual_seed(0)
    full = torch.rand(n, n)
    split = -(-n // world)

    placements = [f"rank:{r}/cpu" for r in range(world)]
    mesh = init_device_mesh("cpu", (world,))
    ours_rows, ours_cols = ChunkShardingSpec(0, placements), ChunkShardingSpec(1, placements)
    up_rows, up_cols = UpChunkShardingSpec(0, placements), UpChunkShardingSpec(1, placements)
    local_rows = full[rank * split : (rank + 1) * split].clone()
    names = [f"w{i}" if args.tensors > 1 else "w" for i in range(args.tensors)]

    def each(make):
        return {name: make() for name in names}

    # Every tensor of the state dict holds the same values (what is timed is the number of items).
    libraries = {
        "torch_shard": (
            each(lambda: _fill(sharded_tensor.empty(ours_rows, n, n), full)),
            lambda: each(lambda: sharded_tensor.zeros(ours_rows, n, n)),
            lambda: each(lambda: sharded_tensor.zeros(ours_cols, n, n)),
        ),
        "DTensor": (
            each(lambda: DTensor.from_local(local_rows, mesh, [Shard(0)], shape=full.shape, stride=full.stride())),
            lambda: each(lambda: dtensor_zeros([n, n], device_mesh=mesh, placements=[Shard(0)])),
            lambda: each(lambda: dtensor_zeros([n, n], device_mesh=mesh, placements=[Shard(1)])),
        ),
        "upstream": (
            each(lambda: _fill(up_sharded_tensor.empty(up_rows, n, n), full)),
            lambda: each(lambda: up_sharded_tensor.zeros(up_rows, n, n)),
            lambda: each(lambda: up_sharded_tensor.zeros(up_cols, n, n)),
        ),
    }
    unchecked = functools.partial(ByteRangeFileSystemReader, verify=False)
    readers = [
        ("FileSystemReader", dcp.FileSystemReader),
        ("ByteRange, unchecked", unchecked),
        ("ByteRange, checked", ByteRangeFileSystemReader),
    ]
    # The same tensor saved with ChecksumFileSystemWriter: every reader reads the same files.
    libraries["torch_shard+checksums"] = libraries["torch_shard"]
    wanted = args.libraries.split(",")
    unknown = set(wanted) - set(libraries)
    if unknown:
        parser.error(f"unknown --libraries {sorted(unknown)}; choose from {list(libraries)}")
    libraries = {name: value for name, value in libraries.items() if name in wanted}

    root = [tempfile.mkdtemp(prefix="torch_shard_bench_dcp_") if rank == 0 else None]
    dist.broadcast_object_list(root, src=0)
    rows_out = []
    spent: dict[tuple[str, str], dict[str, float]] = {}
    try:
        # Every case is timed interleaved with the ones it is compared with (A, B, A, B, ...), so the
        # machine's noise hits them alike: the saves of all libraries, then per library and layout the
        # loads through every reader.
        paths = {name: f"{root[0]}/{name}" for name in libraries}

        def save_case(name, saved):
            writer = ChecksumFileSystemWriter if name.endswith("+checksums") else dcp.FileSystemWriter
            return None, lambda: dcp.save(dict(saved), storage_writer=writer(paths[name]))

        save_s = timed_cases({name: save_case(name, lib[0]) for name, lib in libraries.items()}, args.repeats)
        for name, (_saved, make_rows, make_cols) in libraries.items():
            mine = [
                (reader_name, reader_cls)
                for reader_name, reader_cls in readers
                if not (name == "upstream" and reader_cls is not dcp.FileSystemReader)
            ]
            cells: dict[str, list] = {reader_name: [] for reader_name, _ in mine}
            for layout, make in (("rows", make_rows), ("cols", make_cols)):
                targets = {reader_name: make() for reader_name, _ in mine}
                loads = {
                    reader_name: functools.partial(_load, targets[reader_name], reader_cls, paths[name])
                    for reader_name, reader_cls in mine
                }
                times = timed_cases({reader_name: (None, fn) for reader_name, fn in loads.items()}, args.repeats)
                for reader_name, load in loads.items():
                    read = _bytes_read(load)
                    ok = True
                    for target in targets[reader_name].values():
                        if isinstance(target, DTensor):
                            ok &= _holds(target.to_local(), full, _dtensor_offsets(target, rank, world, n))
                        else:
                            shards = target.local_shards()
                            ok &= all(_holds(s.tensor, full, s.metadata.shard_offsets) for s in shards)
                    if not ok:
                        raise RuntimeError(f"{name} / {reader_name}: loaded values differ from the saved")
                    cells[reader_name].append((1e3 * times[reader_name], read / 2**20))
                if name.startswith("torch_shard") and "ByteRange, checked" in targets:
                    reader = _load(targets["ByteRange, checked"], ByteRangeFileSystemReader, paths[name])
                    spent[(name, layout)] = {k: 1e3 * _max_over_ranks(v) for k, v in vars(reader.timings).items()}
            for reader_name, reader_cls in mine:
                first = reader_cls is dcp.FileSystemReader
                rows_out.append((name, reader_name, 1e3 * save_s[name] if first else None, cells[reader_name]))
    finally:
        dist.barrier()
        if rank == 0:
            shutil.rmtree(root[0], ignore_errors=True)

    if rank == 0:
        mb = args.tensors * n * n * 4 / 2**20
        what = f"{n} x {n} float32" if args.tensors == 1 else f"{args.tensors} tensors of {n} x {n} float32"
        print(f"\ndcp.save / dcp.load of {what} ({mb:.0f} MB) in row chunks, {world} ranks (gloo)")
        print(f"CRC-32 from {CRC32_BACKEND}")
        print("| library | reader | save ms | rows->rows ms | MB read/rank | rows->cols ms | MB read/rank |")
        print("|---|---|---|---|---|---|---|")
        for name, reader_name, save_ms, ((rr_ms, rr_mb), (rc_ms, rc_mb)) in rows_out:
            save = f"{save_ms:.1f}" if save_ms is not None else "-"
            cells = f"{rr_ms:.1f} | {rr_mb:.1f} | {rc_ms:.1f} | {rc_mb:.1f}"
            print(f"| {name} | {reader_name} | {save} | {cells} |")
        got = {(name, reader_name): (save_ms, cells) for name, reader_name, save_ms, cells in rows_out}
        _print_ratios(got, spent)
    dist.destroy_process_group()


def _print_ratios(got: dict, spent: dict) -> None:
    """The issue-32 ratios, from the rows of the table (same files, same run)."""
    layouts = (("same layout", 0), ("resharded", 1))
    for name, what in (("torch_shard+checksums", "saved by ChecksumFileSystemWriter"),
                       ("torch_shard", "saved by FileSystemWriter, no .checksums")):
        plain, unchecked, checked = (got.get((name, r)) for r in
                                     ("FileSystemReader", "ByteRange, unchecked", "ByteRange, checked"))
        if not (plain and unchecked and checked):
            continue
        print(f"{name} ({what}):")
        for layout, i in layouts:
            c, p, u = checked[1][i][0], plain[1][i][0], unchecked[1][i][0]
            print(f"  {layout}: checked / FileSystemReader {c / p:.2f}x (target <= 1.0x), "
                  f"checked / unchecked {c / u:.2f}x, MB read checked / FileSystemReader "
                  f"{checked[1][i][1] / plain[1][i][1]:.2f}")
            parts = spent.get((name, "rows" if i == 0 else "cols"))
            if parts:
                shown = ", ".join(f"{k[:-2]} {v:.1f} ms" for k, v in parts.items())
                print(f"    checked load's time (slowest rank each): {shown}")
    plain_save = got.get(("torch_shard", "FileSystemReader"))
    sums_save = got.get(("torch_shard+checksums", "FileSystemReader"))
    if plain_save and sums_save and plain_save[0] and sums_save[0]:
        print(f"save, ChecksumFileSystemWriter / FileSystemWriter: {sums_save[0] / plain_save[0]:.2f}x (target <= 1.1x)")


def _dtensor_offsets(dt, rank: int, world: int, n: int) -> list[int]:
    split = -(-n // world)
    dim = dt.placements[0].dim
    offsets = [0, 0]
    offsets[dim] = min(rank * split, n)
    return offsets


if __name__ == "__main__":
    main()
