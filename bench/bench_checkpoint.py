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

The lines after the table are the costs of checking, as ratios on the same files: checked load / ``FileSystemReader``
(same layout, resharded), checked / unchecked, ``ChecksumFileSystemWriter`` / ``FileSystemWriter``
save, and where a checked load's time goes (``ByteRangeFileSystemReader.timings``: read, check, agree,
write into the destinations; the slowest rank's, from one extra load).

Times are the max over ranks per iteration, median over --repeats iterations after one warm-up, with
the cases compared interleaved (all saves; per library and layout, all readers). Bytes read are the
largest per-rank growth of ``rchar`` in /proc/self/io over one load: what the process read through
read()-family system calls (checkpoint data, archive headers, the metadata file on the coordinator).
The files sit in the page cache after the save, so the times are of reading memory and
deserialising, not of a disk.

``--state replicated`` is a cluster's checkpoint instead: ``--mib`` MiB of a row-sharded
float32 ``ShardedTensor`` (``ChunkShardingSpec(dim=0)``) and ``--mib`` MiB of a plain tensor every
rank holds (replicated), saved once with ``FileSystemWriter`` and once with ``ChecksumFileSystemWriter``
(the "save" table: one run each, max over ranks), then loaded from the latter, caches dropped before
each load (``/proc/sys/vm/drop_caches``, by local rank 0 of each host, when root), by DCP's
``FileSystemReader``, ``ByteRangeFileSystemReader(path, read_once=False)`` (each rank reads what it
needs itself) and ``ByteRangeFileSystemReader(path, read_once=True)`` ("read_once: not available"
where the reader has no such keyword), each in the same layout and resharded (loaded into column
chunks; the replicated tensor stays replicated). Per load: time (max over ranks), bytes read summed
over ranks (``reader.timings.read_bytes``; ``FileSystemReader``: rchar growth), the union of what the
ranks need (each element once), bytes over the storage server's link, and peak RSS (sampled during
the load, max over ranks). Under the storage rig (``scripts/torchrun_hosts.py --storage DIR``) it
saves into DIR (the server's directory) and loads through each host's sshfs mount::

    python scripts/torchrun_hosts.py --hosts 2 --nproc-per-node 2 --storage /tmp/ckpt --storage-rate 1gbit \\
        -- bench/bench_checkpoint.py --state replicated --mib 256
    torchrun --standalone --nproc-per-node 8 bench/bench_checkpoint.py --state replicated --mib 256
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import os
import shutil
import subprocess
import tempfile
import threading
import time
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
    parser.add_argument("--state", choices=("square", "replicated"), default="square",
                        help="square: the tables above (default); replicated: a cluster's checkpoint, "
                             "--mib MiB row-sharded + --mib MiB replicated, loads with caches dropped")
    parser.add_argument("--mib", type=int, default=256, help="(--state replicated) MiB of each of the two tensors")
    parser.add_argument("--cols", type=int, default=1024, help="(--state replicated) columns of both tensors")
    parser.add_argument("--dir", help="(--state replicated) directory to save under (default: $TORCH_SHARD_RIG_EXPORT "
                                      "under the rig, else a temporary directory)")
    args = parser.parse_args()
    warnings.filterwarnings("ignore")  # upstream's deprecation notices, one per call
    if args.state == "replicated":
        _cluster_main(args)
        return

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
                    spent[(name, layout)] = {k: 1e3 * _max_over_ranks(v) for k, v in vars(reader.timings).items()
                                             if k.endswith("_s")}  # read_bytes is no time
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
    """The costs of checking as ratios, from the rows of the table (same files, same run)."""
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


# --- --state replicated: a cluster's checkpoint ----------------------------------------------------

_RSS_PAGE = os.sysconf("SC_PAGE_SIZE")


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * _RSS_PAGE


class _PeakRss:
    """Samples this process's resident set (/proc/self/statm) on a thread every ``interval`` seconds
    while the block runs: ``peak`` is the largest seen (ru_maxrss only grows over a process's life, so
    it cannot tell one load from the ones before it). A peak shorter than the interval (plus the GIL's
    switch interval while the load runs Python code) can be missed."""

    def __init__(self, interval: float = 0.002):
        self.interval = interval
        self.before = self.peak = 0

    def __enter__(self):
        self.before = self.peak = _rss()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()
        return self

    def _sample(self):
        while not self._stop.wait(self.interval):
            self.peak = max(self.peak, _rss())

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, _rss())
        return False


def _link_bytes(link: str | None) -> int | None:
    """Bytes the rig's server link has sent (TORCH_SHARD_RIG_LINK = "<netns>:<ifname>"), None without the rig."""
    if not link:
        return None
    ns, ifname = link.split(":", 1)
    out = subprocess.run(["ip", "-n", ns, "-s", "-j", "link", "show", ifname], capture_output=True, text=True,
                         check=True, timeout=30).stdout
    return int(json.loads(out)[0]["stats64"]["tx"]["bytes"])


def _drop_caches() -> bool:
    """Drop this machine's page cache (one rank per host; FUSE mounts' caches go too). False when not
    permitted (not root)."""
    if int(os.environ.get("LOCAL_RANK", "0")) == 0:
        try:
            os.sync()
            with open("/proc/sys/vm/drop_caches", "w") as f:
                f.write("3\n")
        except OSError:
            return False
    return True


def _sharded_values(offsets, sizes, cols: int) -> torch.Tensor:
    """The row-sharded tensor's values at a box: element (i, j) holds (i * cols + j) mod 65521 (exact
    in float32, and no rank ever builds the whole tensor)."""
    rows = torch.arange(offsets[0], offsets[0] + sizes[0], dtype=torch.int64)[:, None] * cols
    return (rows + torch.arange(offsets[1], offsets[1] + sizes[1], dtype=torch.int64)[None, :]).remainder_(65521).float()


# ByteRangeFileSystemReader.timings' time fields, reported per load of the replicated state.
_SPLIT = ("read_s", "check_s", "exchange_s", "agree_s", "write_s")


def _replicated_values(rows: int, cols: int) -> torch.Tensor:
    return torch.arange(rows * cols, dtype=torch.int32).remainder_(65519).float().view(rows, cols)


def _union_bytes(state: dict) -> int:
    """Bytes of the union of what the ranks load: each rank's boxes (per tensor: a shard's offsets and
    sizes, a plain tensor whole), gathered, each distinct box counted once (the boxes here are either
    the same or disjoint)."""
    boxes = []
    for name, value in state.items():
        if isinstance(value, torch.Tensor) and not hasattr(value, "local_shards"):
            boxes.append((name, (0,) * value.dim(), tuple(value.shape), value.element_size()))
        else:
            for shard in value.local_shards():
                md = shard.metadata
                boxes.append((name, tuple(md.shard_offsets), tuple(md.shard_sizes), shard.tensor.element_size()))
    gathered = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, boxes)
    distinct = {box for rank_boxes in gathered for box in rank_boxes}
    return sum(math.prod(sizes) * itemsize for _name, _offsets, sizes, itemsize in distinct)


def _cluster_main(args) -> None:
    """Save a state dict of a row-sharded tensor and a replicated one, then load it through each reader,
    caches dropped before each load, in the same layout and resharded (see the module's docstring)."""
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    cols = args.cols
    rows = args.mib * 2**20 // (4 * cols)
    if rows < world:
        raise SystemExit(f"--mib {args.mib} is too small for {world} ranks at --cols {cols}")
    export, mount = os.environ.get("TORCH_SHARD_RIG_EXPORT"), os.environ.get("TORCH_SHARD_RIG_MOUNT")
    link = os.environ.get("TORCH_SHARD_RIG_LINK")
    placements = [f"rank:{r}/cpu" for r in range(world)]
    by_rows, by_cols = ChunkShardingSpec(0, placements), ChunkShardingSpec(1, placements)

    sharded = sharded_tensor.empty(by_rows, rows, cols)
    for shard in sharded.local_shards():
        shard.tensor.copy_(_sharded_values(shard.metadata.shard_offsets, shard.metadata.shard_sizes, cols))
    replicated = _replicated_values(rows, cols)
    saved = {"sharded": sharded, "replicated": replicated}

    # The checkpoint is written straight into the directory (under the rig: the server's own), and read
    # back through this host's mount when there is one.
    root = [tempfile.mkdtemp(prefix="torch_shard_bench_cluster_", dir=args.dir or export) if rank == 0 else None]
    dist.broadcast_object_list(root, src=0)
    save_root = root[0]
    load_root = os.path.join(mount, os.path.relpath(save_root, export)) if mount and export else save_root
    dropped = True
    save_rows, load_rows = [], []
    try:
        for writer_name, writer in (("FileSystemWriter", dcp.FileSystemWriter),
                                    ("ChecksumFileSystemWriter", ChecksumFileSystemWriter)):
            dist.barrier()
            start = time.perf_counter()
            dcp.save(dict(saved), storage_writer=writer(f"{save_root}/{writer_name}"))
            save_rows.append((writer_name, _max_over_ranks(time.perf_counter() - start)))
        path = f"{load_root}/ChecksumFileSystemWriter"

        def byte_range(**kwargs):
            return lambda: ByteRangeFileSystemReader(path, **kwargs)

        def byte_range_each_own():
            # Where read_once exists its default turns it on for network file systems: off, explicitly.
            try:
                return ByteRangeFileSystemReader(path, read_once=False)
            except TypeError:
                return ByteRangeFileSystemReader(path)

        readers = [
            ("FileSystemReader", lambda: dcp.FileSystemReader(path)),
            ("ByteRange (each rank its own)", byte_range_each_own),
            ("ByteRange read_once=True", byte_range(read_once=True)),
        ]
        for layout, spec in (("same layout", by_rows), ("resharded", by_cols)):
            for reader_name, make_reader in readers:
                try:
                    reader = make_reader()
                except TypeError:
                    load_rows.append((reader_name, layout, None))
                    continue
                targets = {"sharded": sharded_tensor.zeros(spec, rows, cols), "replicated": torch.zeros(rows, cols)}
                needed = _union_bytes(targets)
                dropped &= _drop_caches()
                dist.barrier()
                link_before = _link_bytes(link) if rank == 0 else None
                dist.barrier()
                rchar = _rchar()
                with _PeakRss() as rss:
                    start = time.perf_counter()
                    dcp.load(targets, storage_reader=reader)
                    elapsed = time.perf_counter() - start
                rchar = _rchar() - rchar
                dist.barrier()
                crossed = _link_bytes(link) - link_before if rank == 0 and link else None
                timings = getattr(reader, "timings", None)
                read = timings.read_bytes if timings is not None else rchar
                ok = torch.equal(targets["replicated"], replicated) and all(
                    torch.equal(s.tensor, _sharded_values(s.metadata.shard_offsets, s.metadata.shard_sizes, cols))
                    for s in targets["sharded"].local_shards())
                split = [getattr(timings, f, 0.0) for f in _SPLIT] if timings is not None else [0.0] * len(_SPLIT)
                stats = torch.tensor([elapsed, read, rss.peak, rss.peak - rss.before, 0.0 if ok else 1.0, *split],
                                     dtype=torch.float64)
                maxed, summed = stats.clone(), stats.clone()
                dist.all_reduce(maxed, op=dist.ReduceOp.MAX)
                dist.all_reduce(summed, op=dist.ReduceOp.SUM)
                if maxed[4].item():
                    raise RuntimeError(f"{reader_name}, {layout}: loaded values differ from the saved")
                load_rows.append((reader_name, layout, {
                    "s": maxed[0].item(), "read": summed[1].item(), "needed": needed, "link": crossed,
                    "rss": maxed[2].item(), "rss_growth": maxed[3].item(),
                    "split": maxed[5:].tolist() if timings is not None else None,
                    "read_from": "timings.read_bytes" if timings is not None else "rchar"}))
                del targets, reader
    finally:
        dist.barrier()
        if rank == 0:
            shutil.rmtree(save_root, ignore_errors=True)

    if rank == 0:
        hosts = os.environ.get("TORCH_SHARD_RIG_HOSTS")
        where = (f"{hosts} hosts reading over sshfs (rig), server link capped at "
                 f"{os.environ.get('TORCH_SHARD_RIG_RATE') or 'no cap'}" if mount else "one host, local file system")
        mib = 2**20
        print(f"\n{args.mib} MiB row-sharded + {args.mib} MiB replicated float32 ({rows} x {cols} each), "
              f"{world} ranks, {where}")
        print("caches dropped before each load" if dropped else "caches NOT dropped (not root): loads read the page cache")
        print("\n| save | s (max over ranks) |\n|---|---|")
        for writer_name, seconds in save_rows:
            print(f"| {writer_name} | {seconds:.2f} |")
        print("\n| reader | layout | load s (max over ranks) | MiB read, sum over ranks | MiB needed (union) "
              "| read / needed | MiB over the server link | peak RSS MiB (max rank) | RSS growth MiB (max rank) |")
        print("|---|---|---|---|---|---|---|---|---|")
        for reader_name, layout, cell in load_rows:
            if cell is None:
                print(f"| {reader_name} | {layout} | read_once: not available | | | | | | |")
                continue
            crossed = "" if cell["link"] is None else f"{cell['link'] / mib:.1f}"
            print(f"| {reader_name} | {layout} | {cell['s']:.2f} | {cell['read'] / mib:.1f} | {cell['needed'] / mib:.1f} "
                  f"| {cell['read'] / cell['needed']:.2f} | {crossed} | {cell['rss'] / mib:.0f} | {cell['rss_growth'] / mib:.0f} |")
        print("\nWhere ByteRange's load time went, seconds (each the slowest rank's): " + ", ".join(_SPLIT) + "\n")
        print("| reader | layout | " + " | ".join(_SPLIT) + " |\n|---|---|" + "---|" * len(_SPLIT))
        for reader_name, layout, cell in load_rows:
            if cell is not None and cell.get("split") is not None:
                print(f"| {reader_name} | {layout} | " + " | ".join(f"{v:.2f}" for v in cell["split"]) + " |")
        print("\nMiB read: FileSystemReader's from /proc/self/io rchar (data files and .metadata), ByteRange's from "
              "reader.timings.read_bytes (data files only). Peak RSS: /proc/self/statm sampled every 2 ms on a "
              "thread during the load (growth: above the RSS before it, the destinations already allocated). "
              "One run each.")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
