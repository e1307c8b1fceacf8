"""One rank's part of a load read once across the ranks (NOTE [ Reading every stored byte once across
the ranks ]): :meth:`ReadOnceLoad.check` before the agreement, :meth:`ReadOnceLoad.deliver` after it.

NOTE [ Read once: check, agree, then read again and deliver ]
A checked load writes no destination before every rank's bytes are checked and agreed. Holding what a
rank receives until then would cost memory as large as its destinations (and a reader would hold what
it read for all); so a read-once load reads twice, on the reading rank only:

1. ``check``: every rank reads its units, round by round in the order the schedule gives (a prefetch
   thread keeps the storage link busy ahead of it), and checks them, keeping nothing: a whole chunk
   is hashed through one scratch buffer (its digest kept), a part is read by the tiles it touches, as
   ``read_chunk_boxes`` decides. The ranks then agree on the outcome, as for any checked load.
2. ``deliver``: round by round, each reader reads its units again, from its host's page cache that
   the first read filled (so storage sees each byte once; the second read is counted as
   ``reread_bytes``), checks them again, moves the units that cross ranks in one exchange, and every
   rank copies each unit it receives straight into its destination, committing an item when its last
   piece lands. A whole chunk only its reader needs goes from the file straight into the destination.

So a rank's memory beyond its destinations is one round of units (``ROUND_BYTES`` of what it reads
for others, and what it receives in that round) and the exchange's buffers for it. A unit whose second
read differs from the first (the file changed on disk during the load) is sent as zeros and raises
:class:`CheckpointCorruptionError` on the rank that read it, and DCP's gathering of every rank's
``read_data`` outcome makes every rank raise; the destinations may then be partly written, as the
error says, the one case where they may.
"""

from __future__ import annotations

import dataclasses
import time

import torch
from torch.distributed.checkpoint.metadata import MetadataIndex
from torch.distributed.checkpoint.planner import LoadPlan, LoadPlanner, ReadItem

from .._errors import Corruption
from .._load_outcome import Outcome, flag_device, group_of, this_rank
from .._timing import reading_again, spent
from .chunk import Deferred, destination, read_again, read_checked_copy
from .exchange import exchange_round
from .prefetch import Prefetcher, prefetch_ranges
from .schedule import Piece, Place, ReadOnce
from .source import ChunkSource


class ReadOnceLoad:
    """This rank's units and pieces of a :class:`ReadOnce` schedule, checked, then delivered.

    Args:
        chunks: the load's saved chunks, read through it.
        plan: this rank's final plan (its items, in the order of ``schedule.pieces``).
        schedule: the plan's ``storage_data``.
    """

    def __init__(self, chunks: ChunkSource, plan: LoadPlan, schedule: ReadOnce):
        self.chunks = chunks
        self.items = plan.items
        self.schedule = schedule
        self.units = schedule.units
        self.me = schedule.participants.ranks.index(this_rank())
        # unit -> where its box lands in this rank's items
        self.wanted: dict[int, list[Place]] = {}
        for i, pieces in enumerate(schedule.pieces):
            for piece in pieces or ():
                self.wanted.setdefault(piece.unit, []).append((i, piece.at))
        self.checked: dict[int, Deferred] = {}  # whole chunks hashed by check(): their digests

    def check(self, outcome: Outcome) -> BaseException | None:
        """Read and check this rank's units, keeping only whole chunks' digests (step 1 of the NOTE);
        what fails goes into ``outcome``. Returns the exception raised, if one was."""
        try:
            ranges = prefetch_ranges(self.schedule, self.me, self.chunks.storage_data)
        except Exception:  # noqa: BLE001 - a hint only; the reads themselves report any problem
            ranges = []
        prefetcher = Prefetcher(self.chunks.path, ranges)
        try:
            for ids in self.schedule.rounds:
                for index, mine in self.schedule.read_by(ids, self.me).items():
                    values = self._read(index, mine, outcome.corruptions, check_only=True)
                    self.checked.update((u, v) for u, v in zip(mine, values) if isinstance(v, Deferred))
        except Exception as e:  # noqa: BLE001 - reported to every rank at the agreement
            outcome.error = outcome.error or f"{type(e).__name__}: {e}"
            return e
        finally:
            prefetcher.stop()
        return None

    def deliver(self, planner: LoadPlanner, changed: list[Corruption]) -> BaseException | None:
        """Read this rank's units again, exchange them and write every piece of this rank's items into
        its destination (step 2 of the NOTE). Takes part in every round whatever fails (zeros go where
        a read failed); returns the first exception raised, and puts what changed on disk in
        ``changed``."""
        group = group_of(self.schedule.participants.ranks)
        device = flag_device(group)
        destinations = Destinations(self.items, self.schedule.pieces, planner)
        failure = None
        try:
            destinations.commit_empty()
        except Exception as e:  # noqa: BLE001 - raised after the rounds; every rank takes part in each
            failure = e
        for ids in self.schedule.rounds:
            values: dict[int, object] = {}
            try:
                with reading_again():
                    self._read_round(ids, values, destinations, changed)
            except Exception as e:  # noqa: BLE001 - raised after the rounds; every rank takes part in each
                failure = failure or e
            crossing = [u for u in ids if self.units[u].crosses_ranks]
            if crossing:
                clock = time.perf_counter()
                values.update(exchange_round(self.units, crossing, self.me, values, group, device))
                spent("exchange_s", clock)
            clock = time.perf_counter()
            try:
                for u in ids:
                    if u in values:
                        for i, at in self.wanted.get(u, ()):
                            destinations.write(i, at, values[u])
            except Exception as e:  # noqa: BLE001 - as above
                failure = failure or e
            spent("write_s", clock)
        return failure

    def _read_round(self, ids, values: dict, destinations: Destinations, changed: list[Corruption]) -> None:
        """Read this rank's units of one round again into ``values``; a whole chunk only this rank
        needs goes straight into its destination instead."""
        for index, mine in self.schedule.read_by(ids, self.me).items():
            again = []
            for u in mine:
                deferred = self.checked.get(u)
                if deferred is None:
                    again.append(u)
                    continue
                handle = self.chunks.handle(deferred.relative_path)
                whole_item = self._only_mine_whole(u)
                if whole_item is not None:  # straight from the file into the destination
                    read_again(deferred, handle, destinations.target(whole_item), changed)
                    destinations.placed(whole_item)
                else:
                    values[u] = read_checked_copy(deferred, handle, changed)
            if again:
                found: list[Corruption] = []
                values.update(zip(again, self._read(index, again, found)))
                # They passed the same checks before the agreement: the file changed on disk since.
                changed.extend(dataclasses.replace(
                    c, what=f"{c.what}, which passed before the agreement: the file changed on disk during the "
                            f"load; the destinations may be partly written") for c in found)

    def _read(self, index: MetadataIndex, ids: list[int], corruptions: list[Corruption], check_only: bool = False) -> list:
        """Read (and check) the units ``ids`` of one chunk; values per unit (None where failed). No unit
        is deferred by size: with ``check_only`` every whole chunk is hashed anyway, and after the
        agreement a unit's value is what is sent or written."""
        boxes = [(self.units[u].offsets, self.units[u].lengths) for u in ids]
        return self.chunks.read_boxes(index, boxes, [False] * len(ids), corruptions, check_only=check_only)

    def _only_mine_whole(self, u: int) -> int | None:
        """The item unit ``u`` fills whole, where this rank alone needs it, in one item (else None)."""
        unit = self.units[u]
        places = self.wanted.get(u, ())
        if unit.receivers != (self.me,) or len(places) != 1:
            return None
        (i, _), = places
        return i if tuple(self.items[i].lengths) == unit.lengths else None


class Destinations:
    """The destination tensors of this rank's items under read-once, filled piece by piece: an item is
    committed to the planner when its last piece lands (an empty one at once)."""

    def __init__(self, items: list[ReadItem], pieces: tuple[tuple[Piece, ...] | None, ...], planner: LoadPlanner):
        self.items = items
        self.planner = planner
        self.targets: dict[int, torch.Tensor] = {}  # resolved, not yet committed
        self.left = {i: len(p) for i, p in enumerate(pieces) if p is not None}  # pieces still to land

    def commit_empty(self) -> None:
        for i, count in list(self.left.items()):
            if count == 0:  # nothing to read: an empty destination
                self._commit(i)

    def target(self, i: int) -> torch.Tensor:
        target = self.targets.get(i)
        if target is None:
            target = self.targets[i] = destination(self.planner, self.items[i])
        return target

    def write(self, i: int, at: tuple[int, ...], value) -> None:
        if value is None:
            return  # its read failed: reported, raised after the rounds
        self.target(i)[tuple(slice(a, a + n) for a, n in zip(at, value.shape))].copy_(value)
        self.placed(i)

    def placed(self, i: int) -> None:
        self.left[i] -= 1
        if self.left[i] == 0:
            self._commit(i)

    def _commit(self, i: int) -> None:
        self.planner.commit_tensor(self.items[i], self.target(i))
        self.targets.pop(i, None)
