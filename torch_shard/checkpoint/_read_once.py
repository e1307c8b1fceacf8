"""Read once across the ranks: every stored byte range any rank of a load needs is read, and checked,
by one rank, and handed to the others through torch_shard's exchange.

NOTE [ Reading every stored byte once across the ranks ]
DCP's readers read, on every rank, everything that rank needs: a tensor replicated on W ranks is read
from storage W times, and on a cluster's shared storage every one of those reads crosses the network.
Under ``ByteRangeFileSystemReader(read_once=True)`` the coordinator, which holds every rank's load plan
in ``prepare_global_plan``, makes a schedule (:func:`plan_read_once`) and DCP's own scatter of the
final plans hands each rank its part, so planning costs no collective of ours:

* Units. Each saved tensor chunk is cut along dim 0 into bands of about ``BAND_BYTES`` (aligned to its
  tile rows, so a band is checked by its own tiles; a chunk without tile digests, or a small one, is
  one band, since checking any part of it needs its whole record). Each distinct intersection of a
  band with a box some rank needs is a unit; a unit knows every rank that needs it.
* Readers. The units of one band are read together by one rank (read as :func:`read_chunk_boxes`
  reads any chunk: one reading of the band's bytes). A band only one rank needs is that rank's read
  (a load into the saved layout moves nothing); the others go, largest first, to the least loaded
  rank that needs them, so bytes read are balanced over the ranks that share them, and no rank reads
  what it would only send (a rank that needs nothing reads nothing).
* Rounds. Each reader reads its bands in rounds of at most ``ROUND_BYTES`` of units for other ranks
  (a band larger than that alone); after each round the units that cross ranks move in one
  ``torch_shard._redistribute`` exchange over the load's group (a 1-D byte layout: each unit's bytes
  owned by its reader, held by each rank that needs it). A load whose units all stay on their reader
  (every rank loads the layout it saved) exchanges nothing. A reader's bands that no other rank
  needs are read in the last round, so the bands others wait for are read and moved first. So that
  the storage link does not idle
  while the ranks exchange, a thread asks the kernel to read ahead every band this rank will read, in
  order (:class:`Prefetcher`: ``posix_fadvise`` WILLNEED, bands read whole only, with a margin of 64
  KiB either side for the data record's estimated place), and the reads find them in the page cache.

Each reader checks its units before the ranks agree and reads them again (from its host's page
cache) to deliver them after (NOTE [ Read once: check, agree, then read again and deliver ],
``_read_once_load.py``), so bytes read from storage, summed over the ranks, are the union of what the
ranks need, up to tile edges, and a rank's memory beyond its destinations is one round: at most
``ROUND_BYTES`` of units it reads for others (one band where a band is bigger: a chunk without tile
digests is one band), what it receives in that round, and the exchange's buffers.

Failures. A unit whose read or check fails before the agreement is reported there, as any rank's
corruption: every rank raises the same error with every destination unchanged. A rank whose reading
raises anything else reports its error at the agreement. After it, a rank still takes part in every
round whatever fails (sending zeros where a read failed). A rank that dies makes the others' next
collective fail (gloo: the connection closes), so they raise instead of waiting.
"""

from __future__ import annotations

import dataclasses
import math
import os
import threading
from dataclasses import dataclass

import torch
from torch.distributed.checkpoint.metadata import Metadata, MetadataIndex, TensorStorageMetadata
from torch.distributed.checkpoint.planner import LoadItemType, LoadPlan

from ._checksums import location_key, reads_archive_whole
from ._load_outcome import Participants

# Bands of a saved chunk that one rank reads for all (about this many bytes; tile-aligned).
BAND_BYTES = 16 << 20
# At most this many bytes of units read for other ranks are held at once (a round's exchange).
ROUND_BYTES = 16 << 20
# Prefetched ranges reach this far past a band's estimated bytes on either side (torch.save's records
# around the data: the estimate of where the data record starts is off by at most a few KiB).
_PREFETCH_MARGIN = 64 << 10

Box = tuple[tuple[int, ...], tuple[int, ...]]


@dataclass(frozen=True)
class Unit:
    """One box of a saved chunk that one rank reads and every rank in ``receivers`` gets.

    Attributes:
        chunk: the saved chunk (its storage index).
        offsets, lengths: the box within the chunk.
        chunk_sizes: the whole chunk's sizes.
        dtype: the saved dtype.
        reader: the group rank that reads it.
        receivers: the group ranks that need it (sorted; the reader too, where it needs it).
    """

    chunk: MetadataIndex
    offsets: tuple[int, ...]
    lengths: tuple[int, ...]
    chunk_sizes: tuple[int, ...]
    dtype: torch.dtype
    reader: int
    receivers: tuple[int, ...]

    @property
    def nbytes(self) -> int:
        return math.prod(self.lengths) * self.dtype.itemsize

    @property
    def crosses_ranks(self) -> bool:
        return any(r != self.reader for r in self.receivers)


@dataclass(frozen=True)
class Piece:
    """A part of one of this rank's items: ``unit``'s box, at ``at`` within the item's box."""

    unit: int
    at: tuple[int, ...]


@dataclass(frozen=True)
class ReadOnce:
    """A final plan's ``storage_data`` under read-once (NOTE [ Reading every stored byte once across
    the ranks ]): the same units and rounds on every rank, and this rank's items' pieces.

    Attributes:
        participants: the global ranks of the load, in the group's order.
        units: every unit of the load.
        rounds: per round, the ids of the units read in it.
        pieces: per item of this rank's plan, its pieces (None: an item this rank reads itself, a
            bytes item or a chunk written through a stream-transforming extension).
    """

    participants: Participants
    units: tuple[Unit, ...]
    rounds: tuple[tuple[int, ...], ...]
    pieces: tuple[tuple[Piece, ...] | None, ...]


def _chunk_sizes(metadata: Metadata) -> dict[tuple[str, tuple[int, ...]], tuple[tuple[int, ...], torch.dtype]]:
    out = {}
    for fqn, md in metadata.state_dict_metadata.items():
        if isinstance(md, TensorStorageMetadata):
            for chunk in md.chunks:
                out[(fqn, tuple(chunk.offsets))] = (tuple(chunk.sizes), md.properties.dtype)
    return out


def _bands(sizes: tuple[int, ...], itemsize: int, grid, archive_bytes: int) -> list[tuple[int, int]] | None:
    """Dim-0 bands [lo, hi) of a chunk (None: a 0-d chunk, one unit)."""
    if not sizes:
        return None
    rows = sizes[0]
    if grid is None or reads_archive_whole(archive_bytes) or 0 in sizes:
        return [(0, rows)]
    if len(sizes) == 1:  # one matrix row: bands are runs of whole tiles
        align = max(1, grid.tile_bytes // itemsize)
    else:
        inner = math.prod(sizes[1:-1])
        align = grid.tile_rows // math.gcd(grid.tile_rows, inner)
    slice_bytes = math.prod(sizes[1:]) * itemsize
    step = max(align, BAND_BYTES // max(1, slice_bytes) // align * align)
    return [(lo, min(lo + step, rows)) for lo in range(0, rows, step)]


def _clip(box: Box, band: tuple[int, int] | None) -> Box | None:
    offsets, lengths = box
    if band is None:
        return box
    lo, hi = max(offsets[0], band[0]), min(offsets[0] + lengths[0], band[1])
    if lo >= hi:
        return None
    return (lo, *offsets[1:]), (hi - lo, *lengths[1:])


def plan_read_once(plans: list[LoadPlan], participants: Participants, storage_data: dict, metadata: Metadata,
                   checksums) -> list[LoadPlan]:
    """The final plans with a :class:`ReadOnce` schedule each (``checksums``: the parsed ``.checksums``
    or None; its tile grids decide the bands)."""
    world = len(plans)
    sizes_of = _chunk_sizes(metadata)
    # Every chunk's needs: (rank, item index, box) in the chunk's coordinates.
    needs: dict[tuple, list[tuple[int, int, Box]]] = {}
    index_of: dict[tuple, MetadataIndex] = {}
    pieces: list[list] = [[None] * len(plan.items) for plan in plans]
    for rank, plan in enumerate(plans):
        for i, item in enumerate(plan.items):
            info = storage_data[item.storage_index]
            key = (item.storage_index.fqn, tuple(item.storage_index.offset or ()))
            if item.type != LoadItemType.TENSOR or info.transform_descriptors or key not in sizes_of:
                continue
            pieces[rank][i] = []
            if 0 in item.lengths:
                continue  # nothing to read: an empty destination
            needs.setdefault(key, []).append((rank, i, (tuple(item.storage_offsets), tuple(item.lengths))))
            index_of.setdefault(key, item.storage_index)

    # Bands, and the distinct boxes in each (with who needs them, and where in whose item).
    jobs = []  # (bytes, key, band index, [(box, {rank: [(item, at)]})])
    for key, wanted in needs.items():
        sizes, dtype = sizes_of[key]
        info = storage_data[index_of[key]]
        sums = checksums.items.get(location_key(info.relative_path, info.offset)) if checksums is not None else None
        grid = sums.grid if sums is not None else None
        bands = _bands(sizes, dtype.itemsize, grid, info.length)
        for b, band in enumerate(bands if bands is not None else [None]):
            boxes: dict[Box, dict[int, list]] = {}
            for rank, i, box in wanted:
                part = _clip(box, band)
                if part is not None:
                    at = tuple(o - p for o, p in zip(part[0], box[0]))
                    boxes.setdefault(part, {}).setdefault(rank, []).append((i, at))
            if boxes:
                nbytes = sum(math.prod(box[1]) for box in boxes) * dtype.itemsize
                jobs.append((nbytes, key, b, dtype, list(boxes.items())))

    # Readers: a band one rank needs alone is its own read (nothing to send); the others, largest
    # first, go to the least loaded rank that needs them.
    load = [0] * world
    reader_of = {}
    needers_of = [sorted({rank for _, ranks in jobs[j][4] for rank in ranks}) for j in range(len(jobs))]
    for j in range(len(jobs)):
        if len(needers_of[j]) == 1:
            reader_of[j] = needers_of[j][0]
            load[reader_of[j]] += jobs[j][0]
    for j in sorted(range(len(jobs)), key=lambda j: (-jobs[j][0], j)):
        if j not in reader_of:
            reader_of[j] = min(needers_of[j], key=lambda r: (load[r], r))
            load[reader_of[j]] += jobs[j][0]

    # Rounds, per reader in storage order; the units.
    units: list[Unit] = []
    placed = []  # (round or None: read in the last round, job)
    held = [0] * world
    current = [0] * world
    for j in sorted(range(len(jobs)), key=lambda j: (storage_data[index_of[jobs[j][1]]].relative_path,
                                                     storage_data[index_of[jobs[j][1]]].offset, jobs[j][2])):
        _, key, _, dtype, boxes = jobs[j]
        reader = reader_of[j]
        remote = sum(math.prod(box[1]) * dtype.itemsize for box, ranks in boxes if set(ranks) - {reader})
        if not remote:
            placed.append((None, j))  # a reader's own: read last, while the others' bands move
            continue
        if held[reader] and held[reader] + remote > ROUND_BYTES:
            current[reader] += 1
            held[reader] = 0
        held[reader] += remote
        placed.append((current[reader], j))
    last = max(current) if any(k is not None for k, _ in placed) else 0
    rounds: list[list[int]] = [[] for _ in range(last + 1)]
    for k, j in placed:
        _, key, _, dtype, boxes = jobs[j]
        for box, ranks in boxes:
            uid = len(units)
            units.append(Unit(index_of[key], box[0], box[1], sizes_of[key][0], dtype, reader_of[j],
                              tuple(sorted(ranks))))
            rounds[last if k is None else k].append(uid)
            for rank, places in ranks.items():
                for i, at in places:
                    pieces[rank][i].append(Piece(uid, at))

    shared_units, shared_rounds = tuple(units), tuple(tuple(r) for r in rounds)
    return [
        dataclasses.replace(plan, storage_data=ReadOnce(
            participants, shared_units, shared_rounds,
            tuple(tuple(p) if p is not None else None for p in pieces[rank]),
        ))
        for rank, plan in enumerate(plans)
    ]


# File systems a checkpoint on which read-once is the default for (every rank's read of a byte
# would cross the network; page caches are per host).
_NETWORK_FILESYSTEMS = {
    "nfs", "nfs4", "cifs", "smb3", "smbfs", "lustre", "gpfs", "beegfs", "ceph", "glusterfs", "9p",
    "afs", "ocfs2", "gfs2", "pvfs2", "orangefs", "panfs", "wekafs", "virtiofs",
}


def on_network_filesystem(path: str) -> bool:
    """Whether ``path`` lies on a network or FUSE file system (by /proc/self/mounts; False where it
    cannot be told)."""
    try:
        real = os.path.realpath(os.fspath(path))
        with open("/proc/self/mounts") as f:
            mounts = [line.split()[1:3] for line in f if len(line.split()) >= 3]
    except (OSError, TypeError):
        return False
    best, kind = "", ""
    for point, fstype in mounts:
        point = point.replace("\\040", " ")
        if (real == point or real.startswith(point.rstrip("/") + "/")) and len(point) >= len(best):
            best, kind = point, fstype
    return kind in _NETWORK_FILESYSTEMS or kind == "fuse" or kind.startswith("fuse.")


def read_by(units: tuple[Unit, ...], ids, me: int) -> dict[MetadataIndex, list[int]]:
    """The units among ``ids`` that rank ``me`` reads, by chunk (in ``ids`` order)."""
    per_chunk: dict[MetadataIndex, list[int]] = {}
    for u in ids:
        if units[u].reader == me:
            per_chunk.setdefault(units[u].chunk, []).append(u)
    return per_chunk


def prefetch_ranges(units: tuple[Unit, ...], rounds, me: int, storage_data: dict) -> list[tuple[str, int, int]]:
    """(file, offset, length) of what this rank will read, in the order it reads it: per round and
    chunk, the rows its units cover, where they cover those rows whole (else nothing: a part of the
    rows is read by tiles, and prefetching whole rows would read more than the load needs). The data
    record's place in the archive is estimated (torch.save writes it last but for a few small records
    and the zip directory), with a margin either side."""
    out = []
    for ids in rounds:
        for index, ids_of_chunk in read_by(units, ids, me).items():
            mine = [units[u] for u in ids_of_chunk]
            sizes, dtype = mine[0].chunk_sizes, mine[0].dtype
            if not sizes or not mine[0].lengths:
                continue
            lo = min(u.offsets[0] for u in mine)
            hi = max(u.offsets[0] + u.lengths[0] for u in mine)
            slice_bytes = math.prod(sizes[1:]) * dtype.itemsize
            if sum(math.prod(u.lengths) for u in mine) * dtype.itemsize < (hi - lo) * slice_bytes:
                continue
            info = storage_data[index]
            data_start = info.offset + info.length - math.prod(sizes) * dtype.itemsize - 4096
            start = max(info.offset, data_start + lo * slice_bytes - _PREFETCH_MARGIN)
            end = min(info.offset + info.length, data_start + hi * slice_bytes + _PREFETCH_MARGIN)
            if end > start:
                out.append((info.relative_path, start, end - start))
    return out


class Prefetcher:
    """Asks the kernel to read ``ranges`` into the page cache ahead of the load (``posix_fadvise``
    WILLNEED, from a thread of its own: on a network file system the call can wait for the reads it
    starts), so the storage link stays busy while the ranks exchange what they read (NOTE [ Reading
    every stored byte once across the ranks ]). Nothing is read into Python; ``stop`` ends it early."""

    def __init__(self, root, ranges: list[tuple[str, int, int]]):
        self._stop = threading.Event()
        self._thread = None
        if ranges and hasattr(os, "posix_fadvise"):
            self._thread = threading.Thread(target=self._run, args=(os.fspath(root), ranges), daemon=True,
                                            name="torch_shard-prefetch")
            self._thread.start()

    def _run(self, root: str, ranges) -> None:
        fds: dict[str, int] = {}
        try:
            for relative_path, offset, length in ranges:
                if self._stop.is_set():
                    return
                fd = fds.get(relative_path)
                if fd is None:
                    fd = fds[relative_path] = os.open(os.path.join(root, relative_path), os.O_RDONLY)
                os.posix_fadvise(fd, offset, length, os.POSIX_FADV_WILLNEED)
        except OSError:
            return  # only a hint: the load's own reads report what is wrong
        finally:
            for fd in fds.values():
                os.close(fd)

    def stop(self) -> None:
        self._stop.set()


def as_bytes(value: torch.Tensor | None, nbytes: int) -> torch.Tensor:
    """A unit's value as flat uint8 (zeros where its read failed)."""
    if value is None:
        return torch.zeros(nbytes, dtype=torch.uint8)
    return value.contiguous().reshape(-1).view(torch.uint8)


def exchange_round(units: tuple[Unit, ...], ids: list[int], me: int, values: dict, group, device) -> dict[int, torch.Tensor]:
    """Move the units ``ids`` (each crossing ranks) from their readers to their receivers in one
    exchange; returns the units this rank receives, as tensors of their boxes on the CPU."""
    starts, total = [], 0
    for u in ids:
        starts.append(total)
        total += units[u].nbytes
    src_offsets = torch.tensor(starts, dtype=torch.int64).view(-1, 1)
    src_sizes = torch.tensor([units[u].nbytes for u in ids], dtype=torch.int64).view(-1, 1)
    src_owners = [units[u].reader for u in ids]
    targets = [(u, s, r) for u, s in zip(ids, starts) for r in units[u].receivers if r != units[u].reader]
    dst_offsets = torch.tensor([s for _, s, _ in targets], dtype=torch.int64).view(-1, 1)
    dst_sizes = torch.tensor([units[u].nbytes for u, _, _ in targets], dtype=torch.int64).view(-1, 1)
    dst_owners = [r for _, _, r in targets]
    sources = [as_bytes(values.get(u), units[u].nbytes).to(device) for u in ids if units[u].reader == me]
    like = torch.empty(0, dtype=torch.uint8, device=device)
    moved = torch.ops.torch_shard._redistribute(
        sources, like, [total], src_offsets, src_sizes, src_owners, dst_offsets, dst_sizes, dst_owners,
        group.group_name,
    )
    mine = [u for u, _, r in targets if r == me]
    return {u: out.cpu().view(units[u].dtype).view(units[u].lengths) for u, out in zip(mine, moved)}


__all__ = ["BAND_BYTES", "ROUND_BYTES", "Piece", "Prefetcher", "ReadOnce", "Unit", "exchange_round",
           "on_network_filesystem", "plan_read_once", "prefetch_ranges", "read_by"]
