""":class:`ByteRangeFileSystemReader`: DCP's ``FileSystemReader`` that reads only the bytes a rank
needs from each saved chunk, and checks every byte it hands to the model.

It reads, for each tensor a rank loads, only the bytes of the region it needs from each saved chunk,
instead of every overlapping saved chunk whole. With ``verify=True`` (the default) every byte read
is checked (NOTE [ Verified loads ]); ``verify=False`` is the unchecked reader of NOTE [ Reading
byte ranges of a DCP checkpoint ].

NOTE [ Verified loads ]
Before any data: ``.metadata`` and ``.checksums`` are checked (NOTE [ Checking a checkpoint's
metadata ]); a problem with either raises on every rank when DCP sets the reader up. Then per saved
chunk the reader parses the ``torch.save`` archive's zip directory, checks its small records, the
saved tensor's shape and dtype against ``.metadata``, and the data record's CRC against the one the
writer recorded for this save (``_chunk.open_chunk``). It reads the tensor's bytes one of two ways:
the whole data record, hashed once and checked against its zip CRC-32 and the writer's data CRC, when
the rank needs the whole chunk, the chunk is small (an archive up to 256 KiB: one read of it costs
less than the reads of a part's rows; the writer records no tiles for it), or the checkpoint has no
``.checksums`` (plain DCP checkpoints: a partial read then costs the whole record, as with
``FileSystemReader``, and the reader warns once; only the part's bytes are kept, the record hashed a
run of dim-0 slices at a time); or the tiles its box touches, each checked against the writer's tile
CRC (NOTE [ Block checksums for byte-range reads ]). The archive's directory, pickle and small records
come from read windows (``_archive.FileSource``: a small archive read whole in one read, a bigger
one's first and last bytes), and a pickle ``torch.load`` already made sense of is not unpickled
again. Stream-transformed chunks are checked after decoding. Bytes items are checked
against the writer's CRC-32 and unpickled, as ``DCP``'s planner will unpickle them, so an item that
cannot be (its class gone, a damaged pickle) fails here. The ranks then agree on the outcome (NOTE [
Agreeing on a load's outcome ]), and only when no rank found a problem is any destination written. A
failed check raises :class:`CheckpointCorruptionError`, any other failure
:class:`CheckpointLoadError`, on every rank of the load, with every destination as it was.

NOTE [ Whole chunks are checked, then read again into the destination ]
What is read in part (tiles), decoded, or unpickled is kept in buffers of the reader's own until the
agreement, and so is a whole chunk under 32 MiB. A bigger chunk a rank needs whole (every chunk of a
load into the layout it was saved in) is not: before the agreement it is only hashed, read a piece at
a time through one scratch buffer that stays in the cache; after it, it is read again from the file
straight into the destination (a contiguous CPU tensor of the saved dtype; anything else through one
buffer and ``copy_``), each piece hashed again as it lands. Staging a big chunk costs fresh memory as
large as the chunk (the kernel zeroes every page of it) and one more copy, which made a checked load
slower than DCP's ``FileSystemReader``; the second read comes from the page cache the first one
filled. Under 32 MiB glibc's allocator hands out memory it recycles (its mmap threshold grows to at
most 32 MiB), so staging costs no fresh pages there and one read is cheaper than two (measured when
this was chosen: 4 ranks, 16 MiB chunks: staged 1.17x FSR, read twice 1.33-1.43x; 2 ranks, 32 MiB
chunks: staged 1.15x, read twice 0.67-0.84x). The hash of the second read must equal the first: it
differs only when the file changed on disk between the two (another job saving into the same
directory during the load). The rank that sees it raises :class:`CheckpointCorruptionError` naming
the chunk, and DCP's own gathering of every rank's ``read_data`` outcome (the collective that ends its
read step) makes every rank of ``dcp.load`` raise (``torch_shard.checkpoint.load``: that same error),
with no round of ours; the destinations may be partly written in that case alone, and the error says
so.

What a checkpoint without ``.checksums`` (any ``FileSystemWriter``'s) cannot catch: a chunk or file
from another save, or another rank's chunk, whose archive is intact and of the right shape and dtype
(its zip CRC-32s prove only that each record is consistent with itself), and a ``.metadata`` that
still unpickles, into other but well-formed metadata (offsets of chunks that still tile the tensor,
file offsets that still land on archives of the right shape).

NOTE [ Reading byte ranges of a DCP checkpoint ]
``FileSystemWriter`` stores every tensor chunk with ``torch.save`` into a ``.distcp`` file and records
the chunk's (file, offset, length) in the checkpoint's metadata. ``torch.save`` writes a zip archive
whose tensor bytes sit uncompressed in one record, in the tensor's memory order. Loading that
archive with ``map_location="meta"`` reads only the archive's directory and its pickle (a few KB) and
gives a meta tensor with the chunk's size, dtype and strides; torch records the byte offset of the
data record in the storage's ``_checkpoint_offset``. For a contiguous saved chunk, the region a read
item asks for (``storage_offsets`` / ``lengths``) is then a set of equally long byte runs: the
innermost dim's run, extended over every trailing dim the region covers whole. The reader reads
exactly those runs (``preadv`` on an unbuffered handle; rows with holes no wider than themselves, up
to 2 KiB, in one read with the holes, and a small archive whole, from read windows) straight into the
destination tensor's memory when it is a contiguous CPU tensor, else into one buffer copied into it.

Anything else goes through ``FileSystemReader``'s own path unchanged: non-tensor items, chunks
written through stream-transforming extensions (compression, encryption), non-contiguous saved
chunks, archives whose data offset torch does not report, and big-endian hosts. A row-chunked
tensor loaded into columns therefore reads about a quarter of the tensor per rank instead of all of
it.
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import io
import itertools
import sys
import time
import warnings
from dataclasses import dataclass

import torch
from torch.distributed.checkpoint.filesystem import FileSystemReader
from torch.distributed.checkpoint.metadata import Metadata, TensorStorageMetadata
from torch.distributed.checkpoint.planner import LoadItemType, LoadPlan, LoadPlanner, ReadItem
from torch.futures import Future

from . import _metadata
from ._agreement import LocalRank, Outcome, Participants, exchange, this_rank
from ._archive import Archive, BytesSource, FileSource, Source, _SourceFile, read_archive
from ._checksums import location_key, reads_archive_whole
from ._chunk import (
    Expected,
    ItemPlace,
    as_saved_tensor,
    boxes_readable_whole,
    check_whole,
    hash_record_into,
    needs_the_bytes,
    open_chunk,
    piece_scratch,
    read_box_by_tiles,
    read_boxes_of_whole,
    read_bytes_item,
    read_record,
    read_whole,
)
from ._errors import CheckpointCorruptionError, CheckpointLoadError, Corruption
from ._timing import LoadTimings, recording, spent

__all__ = ["ByteRangeFileSystemReader"]

# Checkpoints this process has warned about (NOTE [ Verified loads ]: partial reads of a checkpoint
# without .checksums read whole chunks).
_warned_whole_reads: set[str] = set()

# Whole chunks from this size on are checked, then read again into the destination; smaller ones are
# staged (NOTE [ Whole chunks are checked, then read again into the destination ]).
_READ_TWICE_FROM = 32 << 20


@dataclass(frozen=True)
class _Deferred:
    """A whole chunk checked before the agreement and read into its destination after it (NOTE [
    Whole chunks are checked, then read again into the destination ]): where it lies, and the CRC-32
    its bytes had."""

    relative_path: str
    base: int
    length: int
    archive: Archive
    crc: int
    place: ItemPlace


def usable_in_place(archive: Archive, expected: Expected) -> bool:
    """Whether a whole chunk can be checked now and read into its destination later: its bytes are
    in this host's byte order and its check needs only their CRC-32."""
    return archive.in_host_order and not needs_the_bytes(expected)


def _contiguous_strides(shape) -> list[int]:
    strides, acc = [], 1
    for length in reversed(shape):
        strides.append(acc)
        acc *= length
    return list(reversed(strides))


def _writable_view(tensor: torch.Tensor) -> memoryview | None:
    """A writable byte view of a contiguous CPU tensor's memory (None if it has none)."""
    nbytes = tensor.numel() * tensor.element_size()
    if nbytes == 0 or tensor.device.type != "cpu" or not tensor.is_contiguous():
        return None
    return memoryview((ctypes.c_char * nbytes).from_address(tensor.data_ptr())).cast("B")


def _reads_whole(info, expected: Expected, items: list[ReadItem]) -> bool:
    """Whether a chunk's data will be read whole: it is small (``reads_archive_whole``), every item is
    the whole chunk, or it has no tile CRCs to read a part by."""
    return (
        reads_archive_whole(info.length)
        or expected.sums is None
        or expected.sums.grid is None
        or all(expected.sizes is not None and tuple(item.lengths) == expected.sizes for item in items)
    )


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
    """

    def __init__(self, path, _extension_registry=None, *, verify: bool = True, checksums: bool = True) -> None:
        super().__init__(path, _extension_registry)
        self.verify = verify
        self.use_checksums = checksums
        self._checked: _metadata.Checked | None = None
        self._metadata: Metadata | None = None
        #: Where the last checked load's time went on this rank (read, check, agree, write).
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
        return [dataclasses.replace(p, storage_data=Participants(ranks)) for p in plans]

    def read_data(self, plan: LoadPlan, planner: LoadPlanner) -> Future[None]:
        if not self.verify:
            return self._read_unverified(plan, planner)
        participants = plan.storage_data if isinstance(plan.storage_data, Participants) else None
        outcome = Outcome(this_rank())
        staged: list[tuple[ReadItem, object]] = []
        failure: BaseException | None = None
        self.timings = LoadTimings()
        with recording(self.timings):
            try:
                self._stage(plan, planner, staged, outcome.corruptions)
            except Exception as e:  # noqa: BLE001 - reported to every rank, raised below
                failure = e
                outcome.error = f"{type(e).__name__}: {e}"
        clock = time.perf_counter()
        outcomes = exchange(outcome, participants)
        clock = self._spent("agree_s", clock)
        corruptions = [c for o in outcomes for c in o.corruptions]
        if corruptions:
            raise CheckpointCorruptionError(str(self.path), corruptions)
        failed = [f"rank {o.rank}: {o.error}" if o.rank is not None else o.error for o in outcomes if o.error]
        if failed:
            raise CheckpointLoadError(
                str(self.path),
                f"torch_shard.checkpoint: loading '{self.path}' failed, so nothing was loaded: {'; '.join(failed)}",
            ) from failure
        # Every rank read, checked and decoded everything: now write the destinations, the last read
        # first (its bytes are the likeliest to be still in the cache; the regions do not overlap).
        # Whole chunks are read again into them (NOTE [ Whole chunks are checked, then read again into
        # the destination ]).
        changed: list[Corruption] = []
        with contextlib.ExitStack() as opened:
            handles: dict[str, object] = {}
            for item, value in reversed(staged):
                if isinstance(value, io.BytesIO):
                    planner.load_bytes(item, value)
                    continue
                target = planner.resolve_tensor(item).detach()
                if isinstance(value, _Deferred):
                    self._read_again(value, target, handles, opened, changed)
                else:
                    target.copy_(value)
                planner.commit_tensor(item, target)
        self._spent("write_s", clock)
        if changed:
            raise CheckpointCorruptionError(str(self.path), changed)
        done: Future[None] = Future()
        done.set_result(None)
        return done

    def _read_again(self, deferred: _Deferred, target: torch.Tensor, handles: dict, opened, corruptions) -> None:
        """Read a whole chunk checked before the agreement into ``target``, hashing it again."""
        relative_path = deferred.relative_path
        try:
            raw = handles.get(relative_path)
            if raw is None:
                stream = opened.enter_context(self.fs.create_stream(self.fs.concat_path(self.path, relative_path), "rb"))
                raw = handles[relative_path] = getattr(stream, "raw", stream)
            source = FileSource(raw, deferred.base, deferred.length)
            archive, record = deferred.archive, deferred.archive.data
            view = _writable_view(target) if target.dtype == archive.meta.dtype and archive.contiguous else None
            if view is not None and len(view) == record.size:
                found = hash_record_into(source, record, view)
            else:
                buffer, found = read_record(source, record)
                if found == deferred.crc:
                    target.copy_(as_saved_tensor(buffer, archive))
        except OSError as e:
            corruptions.append(deferred.place.corruption(
                None, None, None, None,
                f"cannot be read again after it was checked ({type(e).__name__}: {e}); the destinations may be partly written",
            ))
            return
        if found != deferred.crc:
            corruptions.append(deferred.place.corruption(
                source, record.data_offset, deferred.crc, found,
                f"record '{record.name}' changed on disk during the load (it was checked, then read again "
                f"into the destination); the destinations may be partly written",
            ))

    def _spent(self, field: str, since: float) -> float:
        now = time.perf_counter()
        setattr(self.timings, field, getattr(self.timings, field) + now - since)
        return now

    def _stage(self, plan: LoadPlan, planner: LoadPlanner, staged: list, corruptions: list[Corruption]) -> None:
        """Read, check and decode every item of ``plan``: into buffers of our own, or for whole chunks
        only hashed (``staged`` gets a :class:`_Deferred`)."""
        self._scratch: memoryview | None = None  # for chunks read twice; made by the first
        per_file: dict[str, dict[int, list[ReadItem]]] = {}
        for item in plan.items:
            info = self.storage_data[item.storage_index]
            per_file.setdefault(info.relative_path, {}).setdefault(info.offset, []).append(item)
        for relative_path, chunks in per_file.items():
            path = self.fs.concat_path(self.path, relative_path)
            with contextlib.ExitStack() as opened:
                try:
                    stream = opened.enter_context(self.fs.create_stream(path, "rb"))
                except OSError as e:  # a missing or unreadable data file: every item in it is lost
                    for items in chunks.values():
                        what = f"cannot be read ({type(e).__name__}: {e})"
                        corruptions.append(self._place(items[0], relative_path).corruption(None, None, None, None, what))
                    continue
                # Unbuffered positioned reads: a buffered reader fetches a full buffer around each of
                # the archive directory's small reads.
                raw = getattr(stream, "raw", stream)
                for offset in sorted(chunks):
                    self._stage_chunk(stream, raw, relative_path, chunks[offset], planner, staged, corruptions)

    def _place(self, item: ReadItem, relative_path: str) -> ItemPlace:
        index = item.storage_index
        return ItemPlace(index.fqn, tuple(index.offset) if index.offset is not None else None, relative_path, this_rank())

    def _expected(self, item: ReadItem, place: ItemPlace) -> Expected:
        info = self.storage_data[item.storage_index]
        checked = self._checked
        sums = None
        if checked is not None and checked.checksums is not None:
            sums = checked.checksums.items.get(location_key(info.relative_path, info.offset))
        md = self._metadata.state_dict_metadata.get(item.storage_index.fqn)
        if isinstance(md, TensorStorageMetadata):
            chunk = next(c for c in md.chunks if tuple(c.offsets) == place.chunk_offsets)
            return Expected(place, tuple(chunk.sizes), md.properties.dtype, sums)
        return Expected(place, None, None, sums)

    def _stage_chunk(self, stream, raw, relative_path, items, planner, staged, corruptions) -> None:
        info = self.storage_data[items[0].storage_index]
        place = self._place(items[0], relative_path)
        expected = self._expected(items[0], place)
        source: Source
        try:
            if info.transform_descriptors:
                decoded = self.transforms.transform_load_stream(
                    items[0], info.transform_descriptors, self._slice_file(stream, info)
                ).read(-1)
                source = BytesSource(decoded, info.offset)
            else:
                source = FileSource(raw, info.offset, info.length, windows=_reads_whole(info, expected, items))
            if items[0].type == LoadItemType.BYTE_IO:
                self._stage_bytes(source, expected, items, staged, corruptions)
            else:
                self._stage_tensor(source, expected, items, planner, staged, corruptions, relative_path)
        except OSError as e:  # a truncated file, a failed decode: the item is damaged
            corruptions.append(place.corruption(None, None, None, None, f"cannot be read ({type(e).__name__}: {e})"))

    def _stage_bytes(self, source, expected, items, staged, corruptions) -> None:
        data, bad = read_bytes_item(source, expected)
        if bad:
            corruptions.extend(bad)
            return
        # Unpickled here as DCP's planner will (torch.load, weights_only=False), so an item that
        # cannot be fails before any destination is written.
        clock = time.perf_counter()
        try:
            torch.load(io.BytesIO(data), weights_only=False)
        except Exception as e:
            raise RuntimeError(f"bytes item '{expected.place.fqn}' cannot be unpickled ({type(e).__name__}: {e})") from e
        finally:
            spent("check_s", clock)
        staged.extend((item, io.BytesIO(data)) for item in items)

    def _stage_tensor(self, source, expected, items, planner, staged, corruptions, relative_path) -> None:
        clock = time.perf_counter()
        archive, bad = open_chunk(source, expected)
        spent("read_s", clock)
        if archive is None:
            corruptions.extend(bad)
            return
        usable = archive.in_host_order and (
            expected.sums is not None and expected.sums.grid is not None
        )
        whole = None
        parts: list[ReadItem] = []
        for item in items:
            target = planner.resolve_tensor(item).detach()
            lengths = list(item.lengths)
            if list(target.shape) != lengths:
                raise AssertionError(f"req {item.storage_index} mismatch sizes {list(target.shape)} vs {lengths}")
            is_whole = lengths == list(archive.meta.shape)
            if usable and not is_whole and 0 not in lengths and not reads_archive_whole(source.length):
                value, bad = read_box_by_tiles(source, archive, expected.sums, item.storage_offsets, lengths, expected.place)
                corruptions.extend(bad)
            elif (
                is_whole
                and archive.data.size >= _READ_TWICE_FROM
                and isinstance(source, FileSource)
                and usable_in_place(archive, expected)
            ):
                if self._scratch is None:
                    self._scratch = piece_scratch()
                found, bad = check_whole(source, archive, expected, self._scratch)
                corruptions.extend(bad)
                if bad:
                    return
                value = _Deferred(relative_path, source.base, source.length, archive, found, expected.place)
            else:
                if not is_whole and expected.sums is None:
                    self._warn_whole_reads()
                if not is_whole and whole is None and boxes_readable_whole(archive, expected, source.length):
                    parts.append(item)  # read below, with the chunk's other parts, in one pass
                    continue
                if whole is None:
                    buffer, bad = read_whole(source, archive, expected)
                    corruptions.extend(bad)
                    if bad:
                        return
                    whole = self._as_tensor(buffer, archive, source)
                box = tuple(slice(o, o + n) for o, n in zip(item.storage_offsets, lengths))
                value = whole if is_whole else whole[box]
            staged.append((item, value))
        if parts:
            values, bad = read_boxes_of_whole(
                source, archive, expected, [(list(item.storage_offsets), list(item.lengths)) for item in parts]
            )
            corruptions.extend(bad)
            if not bad:
                staged.extend(zip(parts, values))

    @staticmethod
    def _as_tensor(buffer, archive, source) -> torch.Tensor:
        if archive.in_host_order:
            return as_saved_tensor(buffer, archive)
        # Another byte order: torch.load swaps the bytes (the CRC was of the stored bytes).
        return torch.load(_SourceFile(source), map_location="cpu", weights_only=True)

    def _warn_whole_reads(self) -> None:
        key = str(self.path)
        if key in _warned_whole_reads:
            return
        _warned_whole_reads.add(key)
        warnings.warn(
            f"torch_shard.checkpoint: '{key}' has no .checksums, so ByteRangeFileSystemReader reads every "
            f"saved chunk it needs a part of whole, to check it against its zip CRC-32 (as many bytes as "
            f"FileSystemReader). Save with torch_shard.checkpoint.ChecksumFileSystemWriter to read and "
            f"check only the bytes a load needs.",
            stacklevel=2,
        )

    def _read_unverified(self, plan: LoadPlan, planner: LoadPlanner) -> Future[None]:
        """NOTE [ Reading byte ranges of a DCP checkpoint ]: straight into the destinations, unchecked."""
        fallback: list[ReadItem] = []
        per_file: dict[str, list[ReadItem]] = {}
        for item in plan.items:
            info = self.storage_data[item.storage_index]
            if item.type != LoadItemType.TENSOR or info.transform_descriptors or sys.byteorder != "little":
                fallback.append(item)
            else:
                per_file.setdefault(info.relative_path, []).append(item)

        for relative_path, items in per_file.items():
            path = self.fs.concat_path(self.path, relative_path)
            items.sort(key=lambda item: self.storage_data[item.storage_index].offset)
            sources: dict[int, tuple[FileSource, Archive] | None] = {}
            with self.fs.create_stream(path, "rb") as stream:
                # Headers and ranges go through the unbuffered handle: a buffered reader would fetch
                # a full buffer around each of the archive directory's small reads.
                raw = getattr(stream, "raw", stream)
                for item in items:
                    info = self.storage_data[item.storage_index]
                    if info.offset not in sources:
                        sources[info.offset] = self._open_unverified(raw, info)
                    opened = sources[info.offset]
                    if opened is None:
                        fallback.append(item)
                    else:
                        self._read_region(*opened, item, planner)

        if fallback:
            super().read_data(LoadPlan(fallback), planner)
        done: Future[None] = Future()
        done.set_result(None)
        return done

    @staticmethod
    def _open_unverified(raw, info) -> tuple[FileSource, Archive] | None:
        """The saved chunk's archive, when its data are a contiguous little-endian record (else None:
        DCP's own reader reads it). A small archive is read whole, in one read."""
        source = FileSource(raw, info.offset, info.length, windows=reads_archive_whole(info.length))
        try:
            archive = read_archive(source)
        except Exception:  # noqa: BLE001 - not a torch.save archive this reader understands
            return None
        if not archive.contiguous or not archive.in_host_order:
            return None
        return source, archive

    def _read_region(self, source: FileSource, archive: Archive, item: ReadItem, planner: LoadPlanner) -> None:
        target = planner.resolve_tensor(item).detach()
        lengths = list(item.lengths)
        if list(target.shape) != lengths:
            raise AssertionError(f"req {item.storage_index} mismatch sizes {list(target.shape)} vs {lengths}")
        meta = archive.meta
        if target.numel() > 0:
            shape, element_size, dtype = list(meta.shape), meta.element_size(), meta.dtype
            ndim = len(shape)
            strides = _contiguous_strides(shape)
            start = sum(o * s for o, s in zip(item.storage_offsets, strides)) * element_size
            # The run: the innermost dim's length, extended over trailing dims covered whole.
            k, run = ndim - 1, (lengths[-1] if ndim else 1)
            while k > 0 and lengths[k] == shape[k]:
                k -= 1
                run *= lengths[k]
            run_bytes = run * element_size
            # Straight into the target when it is contiguous CPU memory of the saved dtype; otherwise
            # into one buffer that copy_ converts, as FileSystemReader's copy_ does.
            view = _writable_view(target) if target.dtype == dtype else None
            buffer = None
            if view is None:
                buffer = bytearray(target.numel() * element_size)
                view = memoryview(buffer)
            position, base = 0, archive.data.data_offset
            for index in itertools.product(*(range(n) for n in lengths[:k])):
                offset = start + sum(i * s for i, s in zip(index, strides)) * element_size
                source.read_into(view[position : position + run_bytes], base + offset)
                position += run_bytes
            if buffer is not None:
                target.copy_(torch.frombuffer(buffer, dtype=dtype).view(lengths))
        planner.commit_tensor(item, target)
