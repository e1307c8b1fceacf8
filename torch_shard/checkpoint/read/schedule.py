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
* Readers. The units of one band are read together by one rank (read as ``chunk.read_chunk_boxes``
  reads any chunk: one reading of the band's bytes). A band only one rank needs is that rank's read
  (a load into the saved layout moves nothing); the others go, largest first, to the least loaded
  rank that needs them, so bytes read are balanced over the ranks that share them, and no rank reads
  what it would only send (a rank that needs nothing reads nothing).
* Rounds. Each reader reads its bands in rounds of at most ``ROUND_BYTES`` of units for other ranks
  (a band larger than that alone); after each round the units that cross ranks move in one
  ``torch_shard._redistribute`` exchange over the load's group (a 1-D byte layout: each unit's bytes
  owned by its reader, held by each rank that needs it; ``exchange.py``). A load whose units all stay
  on their reader (every rank loads the layout it saved) exchanges nothing. A reader's bands that no
  other rank needs are read in the last round, so the bands others wait for are read and moved first.
  So that the storage link does not idle while the ranks exchange, a thread asks the kernel to read
  ahead every band this rank will read, in order (``prefetch.py``: ``posix_fadvise`` WILLNEED, bands
  read whole only, with a margin of 64 KiB either side for the data record's estimated place), and
  the reads find them in the page cache.

Each reader checks its units before the ranks agree and reads them again (from its host's page
cache) to deliver them after (NOTE [ Read once: check, agree, then read again and deliver ],
``read/read_once.py``), so bytes read from storage, summed over the ranks, are the union of what the
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
from dataclasses import dataclass, field

import torch
from torch.distributed.checkpoint.metadata import Metadata, MetadataIndex, TensorStorageMetadata
from torch.distributed.checkpoint.planner import LoadItemType, LoadPlan, ReadItem

from .._checksums import location_key, reads_archive_whole
from .._load_outcome import Participants
from .chunk import Box

# Bands of a saved chunk that one rank reads for all (about this many bytes; tile-aligned).
BAND_BYTES = 16 << 20
# At most this many bytes of units read for other ranks are held at once (a round's exchange).
ROUND_BYTES = 16 << 20

#: Where a part of a unit lands: (the item's index in its rank's plan, offsets within the item's box).
Place = tuple[int, tuple[int, ...]]


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

    def read_alone(self, items: list[ReadItem]) -> list[ReadItem]:
        """The items of this rank's plan that it reads itself, outside the schedule."""
        return [item for item, pieces in zip(items, self.pieces) if pieces is None]

    def read_by(self, ids, me: int) -> dict[MetadataIndex, list[int]]:
        """The units among ``ids`` that rank ``me`` reads, by chunk (in ``ids`` order)."""
        per_chunk: dict[MetadataIndex, list[int]] = {}
        for u in ids:
            if self.units[u].reader == me:
                per_chunk.setdefault(self.units[u].chunk, []).append(u)
        return per_chunk


@dataclass
class _Needed:
    """A saved chunk that ranks need parts of: ``wanted`` holds (rank, item index, box in the chunk's
    coordinates), in the order of the plans."""

    index: MetadataIndex
    sizes: tuple[int, ...]
    dtype: torch.dtype
    wanted: list[tuple[int, int, Box]] = field(default_factory=list)


@dataclass
class _Band:
    """One band of a saved chunk and the distinct boxes ranks need in it: what one reader reads.

    Attributes:
        chunk: the chunk it is a band of.
        storage_order: (file, offset of the chunk in it, band number): where it lies, to read bands
            in the order of the files.
        boxes: each distinct box, with who needs it and where it lands in each of their items.
        reader: the group rank that reads it (None until the readers are chosen).
    """

    chunk: _Needed
    storage_order: tuple[str, int, int]
    boxes: dict[Box, dict[int, list[Place]]]
    reader: int | None = None

    def box_bytes(self, box: Box) -> int:
        return math.prod(box[1]) * self.chunk.dtype.itemsize

    @property
    def nbytes(self) -> int:
        return sum(self.box_bytes(box) for box in self.boxes)

    @property
    def needers(self) -> list[int]:
        return sorted({rank for ranks in self.boxes.values() for rank in ranks})

    @property
    def remote_bytes(self) -> int:
        """The bytes of its boxes some rank other than its reader needs."""
        return sum(self.box_bytes(box) for box, ranks in self.boxes.items() if set(ranks) - {self.reader})


def plan_read_once(plans: list[LoadPlan], participants: Participants, storage_data: dict, metadata: Metadata,
                   checksums) -> list[LoadPlan]:
    """The final plans with a :class:`ReadOnce` schedule each (``checksums``: the parsed ``.checksums``
    or None; its tile grids decide the bands)."""
    world = len(plans)
    pieces: list[list[list[Piece] | None]] = [[None] * len(plan.items) for plan in plans]
    needed = _needed(plans, storage_data, metadata, pieces)
    bands = _bands_needed(needed, storage_data, checksums)
    _choose_readers(bands, world)
    units, rounds = _units_in_rounds(bands, world, pieces)
    return [
        dataclasses.replace(plan, storage_data=ReadOnce(
            participants, units, rounds, tuple(tuple(p) if p is not None else None for p in pieces[rank]),
        ))
        for rank, plan in enumerate(plans)
    ]


def _needed(plans: list[LoadPlan], storage_data: dict, metadata: Metadata, pieces: list) -> list[_Needed]:
    """Every saved chunk's needs, in the order the plans first need them. An item the schedule
    serves gets an empty list of pieces (its entry in ``pieces`` stays None otherwise)."""
    sizes_of = {}
    for fqn, md in metadata.state_dict_metadata.items():
        if isinstance(md, TensorStorageMetadata):
            for chunk in md.chunks:
                sizes_of[(fqn, tuple(chunk.offsets))] = (tuple(chunk.sizes), md.properties.dtype)
    needed: dict[tuple, _Needed] = {}
    for rank, plan in enumerate(plans):
        for i, item in enumerate(plan.items):
            info = storage_data[item.storage_index]
            key = (item.storage_index.fqn, tuple(item.storage_index.offset or ()))
            if item.type != LoadItemType.TENSOR or info.transform_descriptors or key not in sizes_of:
                continue
            pieces[rank][i] = []
            if 0 in item.lengths:
                continue  # nothing to read: an empty destination
            if key not in needed:
                needed[key] = _Needed(item.storage_index, *sizes_of[key])
            needed[key].wanted.append((rank, i, (tuple(item.storage_offsets), tuple(item.lengths))))
    return list(needed.values())


def _bands_needed(needed: list[_Needed], storage_data: dict, checksums) -> list[_Band]:
    """The bands of every needed chunk that some rank needs a part of, and the distinct boxes in each."""
    bands = []
    for chunk in needed:
        info = storage_data[chunk.index]
        sums = checksums.items.get(location_key(info.relative_path, info.offset)) if checksums is not None else None
        grid = sums.grid if sums is not None else None
        rows = _bands(chunk.sizes, chunk.dtype.itemsize, grid, info.length)
        for b, band in enumerate(rows if rows is not None else [None]):
            boxes: dict[Box, dict[int, list[Place]]] = {}
            for rank, i, box in chunk.wanted:
                part = _clip(box, band)
                if part is not None:
                    at = tuple(o - p for o, p in zip(part[0], box[0]))
                    boxes.setdefault(part, {}).setdefault(rank, []).append((i, at))
            if boxes:
                bands.append(_Band(chunk, (info.relative_path, info.offset, b), boxes))
    return bands


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


def _choose_readers(bands: list[_Band], world: int) -> None:
    """A band one rank needs alone is its own read (nothing to send); the others, largest first (the
    sort is stable: ties keep the bands' order), go to the least loaded rank that needs them."""
    load = [0] * world
    for band in bands:
        if len(band.needers) == 1:
            band.reader = band.needers[0]
            load[band.reader] += band.nbytes
    for band in sorted(bands, key=lambda band: -band.nbytes):
        if band.reader is None:
            band.reader = min(band.needers, key=lambda r: (load[r], r))
            load[band.reader] += band.nbytes


def _units_in_rounds(bands: list[_Band], world: int, pieces: list) -> tuple[tuple[Unit, ...], tuple[tuple[int, ...], ...]]:
    """The units, and the rounds they are read in: per reader in storage order, a new round where its
    bytes for other ranks would pass ``ROUND_BYTES``; a reader's bands no other rank needs in the last
    round. Each unit's pieces go into ``pieces``."""
    in_round: list[tuple[int | None, _Band]] = []  # (round, band); None: read in the last round
    held = [0] * world
    current = [0] * world
    for band in sorted(bands, key=lambda band: band.storage_order):
        remote = band.remote_bytes
        if not remote:
            in_round.append((None, band))  # a reader's own: read last, while the others' bands move
            continue
        if held[band.reader] and held[band.reader] + remote > ROUND_BYTES:
            current[band.reader] += 1
            held[band.reader] = 0
        held[band.reader] += remote
        in_round.append((current[band.reader], band))
    last = max(current) if any(k is not None for k, _ in in_round) else 0
    units: list[Unit] = []
    rounds: list[list[int]] = [[] for _ in range(last + 1)]
    for k, band in in_round:
        chunk = band.chunk
        for (offsets, lengths), ranks in band.boxes.items():
            uid = len(units)
            units.append(Unit(chunk.index, offsets, lengths, chunk.sizes, chunk.dtype, band.reader, tuple(sorted(ranks))))
            rounds[last if k is None else k].append(uid)
            for rank, places in ranks.items():
                for i, at in places:
                    pieces[rank][i].append(Piece(uid, at))
    return tuple(units), tuple(tuple(r) for r in rounds)


__all__ = ["BAND_BYTES", "ROUND_BYTES", "Piece", "ReadOnce", "Unit", "plan_read_once"]
