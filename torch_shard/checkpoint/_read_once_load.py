"""One rank's part of a load read once across the ranks (NOTE [ Reading every stored byte once across
the ranks ]): :meth:`ReadOnceLoad.check` before the agreement, :meth:`ReadOnceLoad.deliver` after it.

NOTE [ Read once: check, agree, then read again and deliver ]
A checked load writes no destination before every rank's bytes are checked and agreed. Holding what a
rank receives until then would cost memory as large as its destinations (and a reader would hold what
it read for all); so a read-once load reads twice, on the reading rank only:

1. ``check``: every rank reads its units, round by round in the order the schedule gives (a prefetch
   thread keeps the storage link busy ahead of it), and checks them, keeping nothing: a whole chunk
   is hashed through one scratch buffer (its digest kept), a part is read by the tiles it touches, as
   :func:`read_chunk_boxes` decides. The ranks then agree on the outcome, as for any checked load.
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
from torch.distributed.checkpoint.planner import LoadPlan, LoadPlanner

from ._errors import Corruption
from ._load_outcome import Outcome, flag_device, group_of, this_rank
from ._read_chunk import Deferred, read_again, read_checked_copy
from ._read_once import Prefetcher, ReadOnce, Unit, exchange_round, prefetch_ranges, read_by
from ._timing import reading_again, spent


class ReadOnceLoad:
    """This rank's units and pieces of a :class:`ReadOnce` schedule, checked, then delivered."""

    def __init__(self, reader, plan: LoadPlan, schedule: ReadOnce):
        self.reader, self.plan, self.schedule = reader, plan, schedule
        self.units = schedule.units
        self.me = schedule.participants.ranks.index(this_rank())
        # unit -> [(item index, offsets within the item)], for this rank's items
        self.wanted: dict[int, list[tuple[int, tuple[int, ...]]]] = {}
        for i, pieces in enumerate(schedule.pieces):
            for piece in pieces or ():
                self.wanted.setdefault(piece.unit, []).append((i, piece.at))
        self.checked: dict[int, Deferred] = {}  # whole chunks hashed by check(): their digests

    def _read(self, index: MetadataIndex, ids: list[int], corruptions: list[Corruption], check_only: bool) -> list:
        """Read (and check) the units ``ids`` of one chunk; values per unit (None where failed)."""
        reader = self.reader
        relative_path = reader.storage_data[index].relative_path
        boxes = [(self.units[u].offsets, self.units[u].lengths) for u in ids]
        try:
            source, expected = reader._source(index, boxes)
            values, bad = reader._read_boxes(source, expected, boxes, [False] * len(ids), relative_path,
                                             check_only=check_only)
        except OSError as e:
            place = reader._place(index, relative_path)
            corruptions.append(place.corruption(None, None, None, None, f"cannot be read ({type(e).__name__}: {e})"))
            return [None] * len(ids)
        corruptions.extend(bad)
        return values

    def check(self, outcome: Outcome) -> BaseException | None:
        """Read and check this rank's units, keeping only whole chunks' digests (step 1 of the NOTE);
        what fails goes into ``outcome``. Returns the exception raised, if one was."""
        reader, schedule = self.reader, self.schedule
        try:
            ranges = prefetch_ranges(self.units, schedule.rounds, self.me, reader.storage_data)
        except Exception:  # noqa: BLE001 - a hint only; the reads themselves report any problem
            ranges = []
        prefetcher = Prefetcher(reader.path, ranges)
        try:
            for ids in schedule.rounds:
                for index, mine in read_by(self.units, ids, self.me).items():
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
        schedule = self.schedule
        group = group_of(schedule.participants.ranks)
        device = flag_device(group)
        self.targets: dict[int, torch.Tensor] = {}
        self.left = {i: len(pieces) for i, pieces in enumerate(schedule.pieces) if pieces is not None}
        self.planner = planner
        failure = None
        try:
            for i, count in list(self.left.items()):
                if count == 0:  # nothing to read: an empty destination
                    self._commit(i)
        except Exception as e:  # noqa: BLE001 - raised after the rounds; every rank takes part in each
            failure = e
        for ids in schedule.rounds:
            values: dict[int, object] = {}
            try:
                with reading_again():
                    self._read_round(ids, values, changed)
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
                            self._write(i, at, values[u])
            except Exception as e:  # noqa: BLE001 - as above
                failure = failure or e
            spent("write_s", clock)
        return failure

    def _read_round(self, ids, values: dict, changed: list[Corruption]) -> None:
        reader = self.reader
        for index, mine in read_by(self.units, ids, self.me).items():
            again = []
            for u in mine:
                deferred = self.checked.get(u)
                if deferred is None:
                    again.append(u)
                elif self._only_mine_whole(u):  # straight from the file into the destination
                    (i, _), = self.wanted[u]
                    read_again(deferred, reader._handle(deferred.relative_path), self._target(i), changed)
                    self._placed(i)
                else:
                    values[u] = read_checked_copy(deferred, reader._handle(deferred.relative_path), changed)
            if again:
                found: list[Corruption] = []
                values.update(zip(again, self._read(index, again, found, check_only=False)))
                # They passed the same checks before the agreement: the file changed on disk since.
                changed.extend(dataclasses.replace(
                    c, what=f"{c.what}, which passed before the agreement: the file changed on disk during the "
                            f"load; the destinations may be partly written") for c in found)

    def _only_mine_whole(self, u: int) -> bool:
        unit: Unit = self.units[u]
        places = self.wanted.get(u, ())
        return (unit.receivers == (self.me,) and len(places) == 1
                and tuple(self.plan.items[places[0][0]].lengths) == unit.lengths)

    def _target(self, i: int) -> torch.Tensor:
        target = self.targets.get(i)
        if target is None:
            item = self.plan.items[i]
            target = self.targets[i] = self.planner.resolve_tensor(item).detach()
            if list(target.shape) != list(item.lengths):
                raise AssertionError(f"req {item.storage_index} mismatch sizes {list(target.shape)} vs {list(item.lengths)}")
        return target

    def _write(self, i: int, at: tuple[int, ...], value) -> None:
        if value is None:
            return  # its read failed: reported, raised after the rounds
        self._target(i)[tuple(slice(a, a + n) for a, n in zip(at, value.shape))].copy_(value)
        self._placed(i)

    def _placed(self, i: int) -> None:
        self.left[i] -= 1
        if self.left[i] == 0:
            self._commit(i)

    def _commit(self, i: int) -> None:
        self.planner.commit_tensor(self.plan.items[i], self._target(i))
        self.targets.pop(i, None)
