"""How one saved tensor chunk is read for a checked load: :func:`read_chunk_boxes`, the one place that
decides it, for the boxes of the chunk a load needs (each rank's own, or every rank's under read-once).

NOTE [ Whole chunks are checked, then read again into the destination ]
What is read in part (tiles), decoded, or unpickled is kept in buffers of the reader's own until the
agreement, and so is a whole chunk under 32 MiB. A bigger chunk a rank needs whole (every chunk of a
load into the layout it was saved in) is not: before the agreement it is only hashed, read a piece at
a time through one scratch buffer that stays in the cache; after it, it is read again from the file
straight into the destination (a contiguous CPU tensor of the saved dtype; anything else through one
buffer and ``copy_``), each piece hashed again as it lands. Staging a big chunk costs fresh memory as
large as the chunk (the kernel zeroes every page of it) and one more copy, more than the second read,
which comes from the page cache the first one filled. The threshold (``_READ_TWICE_FROM``) is glibc's mmap threshold, which grows to at most
32 MiB: below it the allocator recycles blocks, so staging costs no fresh pages and is the cheaper
path; above it every staging buffer is fresh memory the kernel zeroes, and reading twice wins
(``bench/bench_read_twice.py``; the figures are in docs/performance.md, "Figures behind design
choices"). Another allocator moves the crossover: rerun the bench there.

The hash of the second read must equal the first: it differs only when the file changed on disk
between the two (another job saving into the same directory during the load). The
rank that sees it raises :class:`CheckpointCorruptionError` naming the chunk, and DCP's own gathering
of every rank's ``read_data`` outcome (the collective that ends its read step) makes every rank of
``dcp.load`` raise; the destinations may be partly written in that case alone, and the error says so.
"""

from __future__ import annotations

import ctypes
import warnings
from dataclasses import dataclass

import torch

from .._archive import Archive, FileSource, Source, _SourceFile
from .._checksums import reads_archive_whole
from .._errors import Corruption
from .._saved_item import (
    Expected,
    ItemPlace,
    as_saved_tensor,
    boxes_readable_whole,
    check_whole,
    hash_record_into,
    piece_scratch,
    read_box_by_tiles,
    read_boxes_of_whole,
    read_record,
    read_whole,
)
from .._timing import reading_again

# Whole chunks from this size on are checked, then read again into the destination; smaller ones are
# staged (NOTE [ Whole chunks are checked, then read again into the destination ]).
_READ_TWICE_FROM = 32 << 20

# Checkpoints this process has warned about (a partial read of a checkpoint without .checksums reads
# whole chunks).
_warned_whole_reads: set[str] = set()

Box = tuple[tuple[int, ...], tuple[int, ...]]  # (offsets, lengths) within a saved chunk


@dataclass(frozen=True)
class Deferred:
    """A whole chunk checked before the agreement and read into its destination after it (NOTE [
    Whole chunks are checked, then read again into the destination ]): where it lies, and the digest
    its bytes had."""

    relative_path: str
    base: int
    length: int
    archive: Archive
    digest: int
    place: ItemPlace


def reads_whole(length: int, expected: Expected, boxes: list[Box]) -> bool:
    """Whether a chunk's data will be read whole: it is small (``reads_archive_whole``), every box is
    the whole chunk, or it has no tile digests to read a part by. (The archive's read windows follow.)"""
    return (
        reads_archive_whole(length)
        or expected.sums is None
        or expected.sums.grid is None
        or all(expected.sizes is not None and tuple(lengths) == tuple(expected.sizes) for _, lengths in boxes)
    )


def read_chunk_boxes(
    source: Source,
    archive: Archive,
    expected: Expected,
    boxes: list[Box],
    may_defer: list[bool],
    relative_path: str,
    checkpoint: str,
    scratch: dict,
    check_only: bool = False,
) -> tuple[list[torch.Tensor | Deferred | None], list[Corruption]]:
    """Read and check ``boxes`` of an opened chunk (see ``open_chunk``); returns a value per box (a
    tensor of the saved dtype, or a :class:`Deferred` where ``may_defer`` allows: a whole big chunk
    read straight into its destination after the agreement) and what failed its check (a box whose
    bytes failed gets None). Decides, for the chunk: a box that is part of a chunk with tile digests
    is read as the tiles it touches; a whole chunk of ``_READ_TWICE_FROM`` bytes and more may be
    deferred; anything else comes from the whole record, checked once (the boxes copied out of it a
    run of dim-0 slices at a time where ``boxes_readable_whole``, else from a staged copy). With
    ``check_only`` every whole chunk is only hashed (a :class:`Deferred`, whatever its size), and
    what else is read is only worth its check (the caller drops it)."""
    meta = archive.meta
    by_tiles = archive.in_host_order and expected.sums is not None and expected.sums.grid is not None
    values: list = [None] * len(boxes)
    bad: list[Corruption] = []
    whole: torch.Tensor | None = None
    parts: list[int] = []
    for k, (offsets, lengths) in enumerate(boxes):
        is_whole = list(lengths) == list(meta.shape)
        if by_tiles and not is_whole and 0 not in lengths and not reads_archive_whole(source.length):
            values[k], found = read_box_by_tiles(source, archive, expected.sums, offsets, lengths, expected.place)
            if found:
                values[k] = None
                bad += found
        elif (
            is_whole
            and (check_only or (may_defer[k] and archive.data.size >= _READ_TWICE_FROM))
            and isinstance(source, FileSource)
            and archive.in_host_order  # its bytes go into the destination as they are
        ):
            if "piece" not in scratch:  # one scratch buffer for the whole load
                scratch["piece"] = piece_scratch()
            digest, found = check_whole(source, archive, expected, scratch["piece"])
            if found:
                return values, bad + found
            values[k] = Deferred(relative_path, source.base, source.length, archive, digest, expected.place)
        else:
            if not is_whole and expected.sums is None:
                _warn_whole_reads(checkpoint)
            if not is_whole and whole is None and boxes_readable_whole(archive, expected, source.length):
                parts.append(k)  # read below, with the chunk's other parts, in one pass
                continue
            if whole is None:
                buffer, found = read_whole(source, archive, expected)
                if found:
                    return values, bad + found
                whole = _as_tensor(buffer, archive, source)
            box = tuple(slice(o, o + n) for o, n in zip(offsets, lengths))
            values[k] = whole if is_whole else whole[box]
    if parts:
        read, found = read_boxes_of_whole(source, archive, expected, [(list(boxes[k][0]), list(boxes[k][1])) for k in parts])
        if found:
            return values, bad + found
        for k, value in zip(parts, read):
            values[k] = value
    return values, bad


def _as_tensor(buffer: torch.Tensor, archive: Archive, source: Source) -> torch.Tensor:
    if archive.in_host_order:
        return as_saved_tensor(buffer, archive)
    # Another byte order: torch.load swaps the bytes (the digest was of the stored bytes).
    return torch.load(_SourceFile(source), map_location="cpu", weights_only=True)


def _warn_whole_reads(key: str) -> None:
    if key in _warned_whole_reads:
        return
    _warned_whole_reads.add(key)
    warnings.warn(
        f"torch_shard.checkpoint: '{key}' has no .checksums, so ByteRangeFileSystemReader reads every "
        f"saved chunk it needs a part of whole, to check it against its zip CRC-32 (as many bytes as "
        f"FileSystemReader). Save with torch_shard.checkpoint.ChecksumFileSystemWriter to read and "
        f"check only the bytes a load needs.",
        stacklevel=4,
    )


def destination(planner, item) -> torch.Tensor:
    """The tensor ``planner`` resolves ``item`` to, detached; an AssertionError where its shape is not the
    item's (as ``FileSystemReader`` raises)."""
    target = planner.resolve_tensor(item).detach()
    if list(target.shape) != list(item.lengths):
        raise AssertionError(f"req {item.storage_index} mismatch sizes {list(target.shape)} vs {list(item.lengths)}")
    return target


def writable_view(tensor: torch.Tensor) -> memoryview | None:
    """A writable byte view of a contiguous CPU tensor's memory (None if it has none)."""
    nbytes = tensor.numel() * tensor.element_size()
    if nbytes == 0 or tensor.device.type != "cpu" or not tensor.is_contiguous():
        return None
    return memoryview((ctypes.c_char * nbytes).from_address(tensor.data_ptr())).cast("B")


def _read_checked_again(deferred: Deferred, raw, read, corruptions: list[Corruption], into: str = "") -> tuple[bool, object]:
    """Read a whole chunk checked before the agreement again through the file handle ``raw``, as
    ``read(source, record)`` does (it returns ``(value, digest)``), and compare the digest with the
    first read's: ``(True, value)`` where they are equal, else ``(False, None)`` and a corruption (the
    file changed on disk, or cannot be read any more); ``into`` says where the bytes went."""
    record = deferred.archive.data
    with reading_again():
        try:
            source = FileSource(raw, deferred.base, deferred.length)
            value, found = read(source, record)
        except OSError as e:
            corruptions.append(deferred.place.corruption(
                None, None, None, None,
                f"cannot be read again after it was checked ({type(e).__name__}: {e}); the destinations may be partly written",
            ))
            return False, None
    if found != deferred.digest:
        corruptions.append(deferred.place.corruption(
            source, record.data_offset, deferred.digest, found,
            f"record '{record.name}' changed on disk during the load (it was checked, then read again{into}); "
            f"the destinations may be partly written",
        ))
        return False, None
    return True, value


def read_checked_copy(deferred: Deferred, raw, corruptions: list[Corruption]) -> torch.Tensor | None:
    """A whole chunk checked before the agreement, read again into memory of its own and hashed; None
    (and a corruption) where its bytes are not the ones checked. (A chunk is deferred only in this
    host's byte order: its bytes are the tensor's as they are.)"""
    ok, buffer = _read_checked_again(deferred, raw, read_record, corruptions)
    return as_saved_tensor(buffer, deferred.archive) if ok else None


def read_again(deferred: Deferred, raw, target: torch.Tensor, corruptions: list[Corruption]) -> None:
    """Read a whole chunk checked before the agreement into ``target`` through the file handle
    ``raw``, hashing it again; a different digest (the file changed on disk) is a corruption."""
    archive = deferred.archive
    view = writable_view(target) if target.dtype == archive.meta.dtype and archive.contiguous else None
    if view is not None and len(view) == archive.data.size:
        # Straight into the destination: what is hashed is what lands there.
        _read_checked_again(deferred, raw, lambda source, record: (None, hash_record_into(source, record, view)),
                            corruptions, " into the destination")
        return
    ok, buffer = _read_checked_again(deferred, raw, read_record, corruptions, " into the destination")
    if ok:
        target.copy_(as_saved_tensor(buffer, archive))
