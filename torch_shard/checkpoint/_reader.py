""":class:`ByteRangeFileSystemReader`: DCP's ``FileSystemReader`` that reads only the bytes a rank
needs from each saved chunk, and checks every byte it hands to the model; with ``read_once``, every
stored byte any rank needs is read by one rank only (``read/schedule.py``).

The reader picks how a load reads; the ways of reading live in ``read/`` (its ``__init__.py`` maps
them), and each takes its bytes through the one ``read.source.ChunkSource`` the reader makes per
load: ``read/unchecked.py`` (``verify=False``), ``read/staged.py`` (this rank's own items of a
checked load) and ``read/read_once.py`` (the items a read-once schedule serves).

It reads, for each tensor a rank loads, only the bytes of the region it needs from each saved chunk,
instead of every overlapping saved chunk whole. With ``verify=True`` (the default) every byte read
is checked (NOTE [ Verified loads ]); ``verify=False`` is the unchecked reader of NOTE [ Reading
byte ranges of a DCP checkpoint ] (``read/unchecked.py``).

NOTE [ Verified loads ]
Before any data: ``.metadata`` and ``.checksums`` are checked (NOTE [ Checking a checkpoint's
metadata ]); a problem with either raises on every rank when DCP sets the reader up. Then per saved
chunk the reader parses the ``torch.save`` archive's zip directory, checks its small records against
their zip CRC-32s and the saved tensor's shape and dtype against ``.metadata`` (``_saved_item.open_chunk``),
and reads the bytes it needs as ``read/chunk.py``'s ``read_chunk_boxes`` decides: the whole data record,
checked against the writer's XXH3-64 digest where the checkpoint has a ``.checksums``, else against
its zip CRC-32 (plain DCP checkpoints: a partial read then costs the whole record, as with
``FileSystemReader``, and the reader warns once), when the rank needs the whole chunk, the chunk is
small (an archive up to 256 KiB: one read of it costs less than the reads of a part's rows; the
writer records no tiles for it) or has no tile digests; or the tiles its box touches, each checked
against the writer's tile digest (NOTE [ Block checksums for byte-range reads ]). The archive's
directory, pickle and small records come from read windows (``_archive.FileSource``: a small archive
read whole in one read, a bigger one's first and last bytes). Stream-transformed chunks are checked
after decoding. Bytes items are checked against the writer's digest and unpickled, as ``DCP``'s
planner will unpickle them, so an item that cannot be (its class gone, a damaged pickle) fails here.
The ranks then agree on the outcome (NOTE [ Agreeing on a load's outcome ]), and only when no rank
found a problem is any destination written. A failed check raises :class:`CheckpointCorruptionError`,
any other failure :class:`CheckpointLoadError`, on every rank of the load, with every destination as
it was.

What a checkpoint without ``.checksums`` (any ``FileSystemWriter``'s) cannot catch: a chunk or file
from another save, or another rank's chunk, whose archive is intact and of the right shape and dtype
(its zip CRC-32s prove only that each record is consistent with itself), and a ``.metadata`` that
still unpickles, into other but well-formed metadata (offsets of chunks that still tile the tensor,
file offsets that still land on archives of the right shape).

NOTE [ When read-once is on ]
``read_once=None`` (the default) turns it on when the checkpoint lies on a network or FUSE file system
(NFS, Lustre, GPFS, sshfs, ...: ``read/mounts.py``), where every rank's read of a
byte crosses the network, and off on a local one, where ranks on one host share its page cache and
handing bytes over the process group costs more than reading them again (docs/performance.md,
"Checkpoints from shared storage"). The coordinator decides, so every rank of a load does the same.
"""

from __future__ import annotations

import contextlib
import dataclasses

from torch.distributed.checkpoint.filesystem import FileSystemReader
from torch.distributed.checkpoint.metadata import Metadata
from torch.distributed.checkpoint.planner import LoadPlan, LoadPlanner
from torch.futures import Future

from . import _metadata
from ._errors import CheckpointCorruptionError, CheckpointLoadError, Corruption
from ._load_outcome import LocalRank, Outcome, Participants, agree, this_rank
from ._timing import LoadTimings, recording
from .read.mounts import on_network_filesystem
from .read.read_once import ReadOnceLoad
from .read.schedule import ReadOnce, plan_read_once
from .read.source import ChunkSource
from .read.staged import OwnReads
from .read.unchecked import read_unchecked

__all__ = ["ByteRangeFileSystemReader"]


class ByteRangeFileSystemReader(FileSystemReader):
    """A ``FileSystemReader`` that reads only the bytes each rank needs from each saved chunk, and
    checks them.

    Use it wherever ``torch.distributed.checkpoint.FileSystemReader`` is used::

        dcp.load(state_dict, storage_reader=ByteRangeFileSystemReader(path))

    It reads checkpoints written by ``FileSystemWriter`` (from any library: torch_shard, DTensor,
    ``torch.distributed._shard``, plain tensors) and by :class:`ChecksumFileSystemWriter`. With
    ``verify=True`` every byte handed to the model is checked, against what the writer recorded for
    this save where the checkpoint has a ``.checksums`` (``ChecksumFileSystemWriter``), else against
    the zip CRC-32s every chunk carries; ``.metadata`` and ``.checksums`` are checked too. A failed
    check raises :class:`CheckpointCorruptionError`, any other failure of the load
    :class:`CheckpointLoadError`, on every rank, with no destination changed (NOTE [ Verified loads ];
    ``dcp.load`` wraps them in its ``CheckpointException``, which :func:`torch_shard.checkpoint.load`
    unwraps).

    Args:
        path: the checkpoint directory.
        _extension_registry: as for ``FileSystemReader`` (stream-transforming extensions).
        verify: check every byte read (default); False reads straight into the destination tensors
            with no checks.
        checksums: use the checkpoint's ``.checksums`` (default); False checks the data against their
            zip CRC-32s alone, as for a checkpoint without one (for a checkpoint whose ``.checksums``
            is damaged).
        read_once: read every stored byte that any rank needs on one rank only, and hand it to the
            others over the load's process group (NOTE [ Reading every stored byte once across the
            ranks ]); None (default): on where the checkpoint lies on a network or FUSE file system
            (NOTE [ When read-once is on ]). Needs ``verify=True``.

    Raises:
        ValueError: ``read_once=True`` with ``verify=False``.
    """

    def __init__(self, path, _extension_registry=None, *, verify: bool = True, checksums: bool = True,
                 read_once: bool | None = None) -> None:
        super().__init__(path, _extension_registry)
        if read_once and not verify:
            raise ValueError("ByteRangeFileSystemReader: read_once=True needs verify=True (read-once hands "
                             "every rank bytes another rank checked)")
        self.verify = verify
        self.use_checksums = checksums
        self.read_once = read_once
        self._checked: _metadata.Checked | None = None
        self._metadata: Metadata | None = None
        #: Where the last checked load's time went on this rank (read, check, exchange, agree, write),
        #: and how many bytes it read from the checkpoint's data files.
        self.timings = LoadTimings()

    def read_metadata(self, *args, **kwargs) -> Metadata:
        if not self.verify:
            return super().read_metadata(*args, **kwargs)
        rank = kwargs.get("rank")
        read = super().read_metadata
        self._checked = _metadata.read_checked(self, lambda: read(*args, **kwargs), rank,
                                               use_checksums=self.use_checksums)
        metadata = self._checked.metadata
        if metadata is None or self._checked.problems:
            # DCP raises what read_metadata raises as a bare message; an empty stand-in (never the
            # damaged metadata, which DCP's planner would trip over) takes the load on to
            # set_up_storage_reader, which raises the corruption itself, on every rank.
            return Metadata(state_dict_metadata={}, storage_data={})
        return metadata

    def set_up_storage_reader(self, metadata: Metadata, is_coordinator: bool, *args, **kwargs) -> None:
        if self.verify and self._checked is not None and self._checked.problems:
            raise CheckpointCorruptionError(str(self.path), self._checked.problems)
        super().set_up_storage_reader(metadata, is_coordinator, *args, **kwargs)
        self._metadata = metadata

    def prepare_local_plan(self, plan: LoadPlan) -> LoadPlan:
        plan = super().prepare_local_plan(plan)
        return dataclasses.replace(plan, storage_data=LocalRank(this_rank()))

    def prepare_global_plan(self, plans: list[LoadPlan]) -> list[LoadPlan]:
        plans = super().prepare_global_plan(plans)
        ranks = tuple(p.storage_data.rank if isinstance(p.storage_data, LocalRank) else None for p in plans)
        participants = Participants(ranks)
        if self._reads_once(ranks):
            checksums = self._checked.checksums if self._checked is not None else None
            return plan_read_once(plans, participants, self.storage_data, self._metadata, checksums)
        return [dataclasses.replace(p, storage_data=participants) for p in plans]

    def _reads_once(self, ranks: tuple) -> bool:
        if not self.verify or len(ranks) <= 1 or None in ranks or self._metadata is None:
            return False
        return self.read_once if self.read_once is not None else on_network_filesystem(self.path)

    def read_data(self, plan: LoadPlan, planner: LoadPlanner) -> Future[None]:
        if not self.verify:
            with contextlib.ExitStack() as opened:
                fallback = read_unchecked(self._chunks(opened), plan, planner)
            if fallback:
                super().read_data(LoadPlan(fallback), planner)
            return _done()
        schedule = plan.storage_data if isinstance(plan.storage_data, ReadOnce) else None
        participants = schedule.participants if schedule is not None else plan.storage_data
        if not isinstance(participants, Participants):
            participants = None
        outcome = Outcome(this_rank())
        self.timings = LoadTimings()
        with recording(self.timings), contextlib.ExitStack() as opened:
            chunks = self._chunks(opened)
            own = OwnReads(chunks, plan.items if schedule is None else schedule.read_alone(plan.items))
            failure = own.check(outcome)
            once = None
            if schedule is not None:
                try:
                    once = ReadOnceLoad(chunks, plan, schedule)
                except Exception as e:  # noqa: BLE001 - as for own reads: every rank raises at the agreement
                    failure = failure or e
                    outcome.error = outcome.error or f"{type(e).__name__}: {e}"
            if once is not None:
                failure = once.check(outcome) or failure
            agree(outcome, participants, str(self.path), failure)
            # Every rank read, checked and decoded everything: now write the destinations. A read-once
            # load's deliveries first: every rank takes part in each of their exchanges, whatever fails
            # in them; a failure in the writes of this rank's own items then keeps no rank waiting.
            # Whole chunks are read again into their destinations (NOTE [ Whole chunks are checked,
            # then read again into the destination ]).
            changed: list[Corruption] = []
            late = once.deliver(planner, changed) if once is not None else None
            own.write(planner, changed)  # deliver counts its own exchange and write time
        if changed:
            raise CheckpointCorruptionError(str(self.path), changed)
        if late is not None:
            raise CheckpointLoadError(
                str(self.path),
                f"torch_shard.checkpoint: loading '{self.path}' failed after every rank's bytes were checked; "
                f"the destinations may be partly written: {type(late).__name__}: {late}",
            ) from late
        return _done()

    def _chunks(self, opened: contextlib.ExitStack) -> ChunkSource:
        """The checkpoint's saved chunks for one load, its files held open by ``opened``."""
        checksums = self._checked.checksums if self._checked is not None else None
        return ChunkSource(fs=self.fs, path=self.path, storage_data=self.storage_data, opened=opened,
                           transforms=self.transforms, slice_file=self._slice_file, metadata=self._metadata,
                           checksums=checksums)


def _done() -> Future[None]:
    done: Future[None] = Future()
    done.set_result(None)
    return done
