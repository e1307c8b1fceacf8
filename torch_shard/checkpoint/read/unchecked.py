"""``ByteRangeFileSystemReader(verify=False)``: the bytes a rank needs, straight into its destinations,
unchecked.

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

import itertools
import sys

import torch
from torch.distributed.checkpoint.planner import LoadItemType, LoadPlan, LoadPlanner, ReadItem

from .._archive import Archive, FileSource, read_archive
from .._checksums import reads_archive_whole
from .chunk import destination, writable_view
from .source import ChunkSource


def read_unchecked(chunks: ChunkSource, plan: LoadPlan, planner: LoadPlanner) -> list[ReadItem]:
    """Read ``plan``'s tensor items straight into their destinations; returns the items left to
    ``FileSystemReader``'s own path (see the NOTE)."""
    fallback: list[ReadItem] = []
    per_file: dict[str, list[ReadItem]] = {}
    for item in plan.items:
        info = chunks.storage_data[item.storage_index]
        if item.type != LoadItemType.TENSOR or info.transform_descriptors or sys.byteorder != "little":
            fallback.append(item)
        else:
            per_file.setdefault(info.relative_path, []).append(item)

    for relative_path, items in per_file.items():
        items.sort(key=lambda item: chunks.storage_data[item.storage_index].offset)
        sources: dict[int, tuple[FileSource, Archive] | None] = {}
        with chunks.stream(relative_path) as stream:
            # Headers and ranges go through the unbuffered handle: a buffered reader would fetch a
            # full buffer around each of the archive directory's small reads.
            raw = getattr(stream, "raw", stream)
            for item in items:
                info = chunks.storage_data[item.storage_index]
                if info.offset not in sources:
                    sources[info.offset] = _open(raw, info)
                opened = sources[info.offset]
                if opened is None:
                    fallback.append(item)
                else:
                    _read_region(*opened, item, planner)
    return fallback


def _open(raw, info) -> tuple[FileSource, Archive] | None:
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


def _contiguous_strides(shape) -> list[int]:
    strides, acc = [], 1
    for length in reversed(shape):
        strides.append(acc)
        acc *= length
    return list(reversed(strides))


def _read_region(source: FileSource, archive: Archive, item: ReadItem, planner: LoadPlanner) -> None:
    target = destination(planner, item)
    lengths = list(item.lengths)
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
        # Straight into the target when it is contiguous CPU memory of the saved dtype; otherwise into
        # one buffer that copy_ converts, as FileSystemReader's copy_ does.
        view = writable_view(target) if target.dtype == dtype else None
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
