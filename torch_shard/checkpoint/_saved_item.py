"""Reading one saved item (a tensor chunk, a box of one, or a bytes item) with every byte checked.

The reader and the offline verifier both go through here, so a load and ``verify`` check the same
things. :func:`open_chunk` parses a chunk's archive and checks everything but its data (the small
records against their zip CRC-32s, the saved tensor against the chunk ``.metadata`` records); then the
data record is checked whole, hashed once: with ``.checksums``, by the writer's hash (XXH3-64)
compared with the digest this save recorded; without, by CRC-32 compared with the zip record's
(NOTE [ The checksums a DCP chunk already carries ], NOTE [ What .checksums binds to one save ],
NOTE [ Which hash .checksums records ]): :func:`check_whole` through a one-piece scratch buffer,
keeping nothing, or :func:`read_whole` into memory of its own; or :func:`read_box_by_tiles` reads the
tiles a box touches, each checked against the writer's tile digests (NOTE [ Block checksums for
byte-range reads ]). None of them writes a destination; each returns the checks that failed, and the
caller decides.

A whole record's *digest*, what :func:`check_whole`, :func:`hash_record_into` and :func:`read_record`
return, is of the hash its data record's ``checked_by`` names: the ``.checksums`` algorithm's (an
unsigned 64-bit int) for an archive :func:`open_chunk` opened with the writer's checksums, the zip
CRC-32 (an unsigned 32-bit int) otherwise; so two hashes of one record, before and after, compare.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass

import torch

from ._archive import Archive, Record, Source, crc32, read_archive
from ._checksums import ItemChecksums, band_digests, reads_archive_whole
from ._digest import ALGORITHM, ZIP_CRC32, digest, hasher
from ._errors import Corruption
from ._timing import spent


@dataclass(frozen=True)
class ItemPlace:
    """Names a saved item in messages: its fqn, chunk offsets and file."""

    fqn: str
    chunk_offsets: tuple[int, ...] | None
    file: str
    rank: int | None = None

    def corruption(self, source: Source | None, offset: int | None, expected, found, what: str) -> Corruption:
        at = source.file_offset(offset) if source is not None and offset is not None else None
        return Corruption(self.fqn, self.chunk_offsets, self.file, at, expected, found, what, self.rank)


@dataclass(frozen=True)
class Expected:
    """What the checkpoint's ``.metadata`` and ``.checksums`` say one saved item is.

    Attributes:
        place: the item, for messages.
        sizes: a tensor chunk's sizes (None for a bytes item).
        dtype: the tensor's dtype (None for a bytes item).
        sums: what the writer recorded for it (None: the checkpoint has no ``.checksums``).
    """

    place: ItemPlace
    sizes: tuple[int, ...] | None = None
    dtype: torch.dtype | None = None
    sums: ItemChecksums | None = None


def check_small_records(source: Source, archive: Archive, place: ItemPlace) -> list[Corruption]:
    """Check every record but the tensor's data whole (the pickle that gives the tensor its shape and
    dtype, and the bookkeeping records: a few hundred bytes)."""
    bad = []
    for record in archive.records:
        if record is archive.data or not record.has_crc:
            continue
        found = crc32(source.read(record.data_offset, record.size))
        if found != record.crc:
            bad.append(place.corruption(source, record.data_offset, record.crc, found, f"record '{record.name}'"))
    return bad


def open_chunk(source: Source, expected: Expected) -> tuple[Archive | None, list[Corruption]]:
    """Parse a tensor chunk's archive and check all but its data bytes; None when they cannot be read
    (the corruptions say why). With the writer's checksums (``expected.sums``), the archive's data
    record is checked by their hash (its ``checked_by``), not by its zip CRC-32."""
    place, sums = expected.place, expected.sums
    try:
        archive = read_archive(source)
    except Exception as e:  # noqa: BLE001 - a garbled or missing archive is a corrupted chunk
        return None, [place.corruption(source, 0, None, None, f"unreadable torch.save archive ({type(e).__name__}: {e})")]
    bad = check_small_records(source, archive, place)
    if bad:
        return None, bad
    meta = archive.meta
    if meta is None or archive.data is None:
        return None, [place.corruption(source, 0, None, None, "archive holds no tensor data record")]
    if tuple(meta.shape) != tuple(expected.sizes) or meta.dtype != expected.dtype:
        return None, [place.corruption(
            source, 0, None, None,
            f"holds a {list(meta.shape)} {meta.dtype} tensor where .metadata records a "
            f"{list(expected.sizes)} {expected.dtype} chunk",
        )]
    if sums is not None:
        if sums.grid is not None and not tiles_usable(archive, sums):
            return None, [place.corruption(source, 0, None, None, "the .checksums entry does not match the saved chunk's layout")]
        archive = _checked_by(archive, ALGORITHM)
    return archive, []


def _checked_by(archive: Archive, algorithm: str) -> Archive:
    """``archive`` with its data record checked by ``algorithm`` (see ``Record.checked_by``)."""
    if archive.data.checked_by == algorithm:
        return archive
    data = dataclasses.replace(archive.data, checked_by=algorithm)
    records = tuple(data if r is archive.data else r for r in archive.records)
    return dataclasses.replace(archive, records=records, data=data)


def _data_record(archive: Archive, expected: Expected) -> Record:
    """The data record as a whole check of ``expected`` hashes it: by the writer's algorithm where
    there are checksums, else by its zip CRC-32."""
    return _checked_by(archive, ALGORITHM if expected.sums is not None else ZIP_CRC32).data


# Whole records are read and hashed a piece at a time, each piece hashed while it is in the cache.
_PIECE = 1 << 20


def piece_scratch() -> memoryview:
    """A buffer of one piece for :func:`hash_record`, reused across records (it stays in the cache)."""
    return memoryview(bytearray(_PIECE))


def _hash_pieces(source: Source, record: Record, piece_at, piece_bytes: int = _PIECE, then=None) -> int:
    """Read ``record`` ``piece_bytes`` at a time into ``piece_at(offset, length)`` and return the digest
    (by ``record.checked_by``) of what was read, each piece hashed (then handed to ``then(offset,
    piece)``) while it is in the cache."""
    running = hasher(record.checked_by)
    clock = time.perf_counter()
    for at in range(0, record.size, piece_bytes):
        piece = piece_at(at, min(piece_bytes, record.size - at))
        source.read_into(piece, record.data_offset + at)
        clock = spent("read_s", clock)
        running.update(piece)
        clock = spent("check_s", clock)
        if then is not None:
            then(at, piece)
            clock = spent("read_s", clock)
    return running.intdigest()


def hash_record_into(source: Source, record: Record, view: memoryview) -> int:
    """Read ``record`` into ``view`` (exactly its size) and return the digest of what was read, by the
    hash ``record.checked_by`` names (as :func:`check_whole` of the archive :func:`open_chunk` gave
    returns it): what is hashed is what lands in ``view``."""
    return _hash_pieces(source, record, lambda at, n: view[at : at + n])


def hash_record(source: Source, record: Record, scratch: memoryview) -> int:
    """The digest (by ``record.checked_by``) of ``record``'s bytes, read through ``scratch`` (see
    :func:`piece_scratch`), keeping none of them."""
    return _hash_pieces(source, record, lambda at, n: scratch[:n])


def read_record(source: Source, record: Record) -> tuple[torch.Tensor, int]:
    """A record's bytes (uint8, in memory of their own) and their digest (by ``record.checked_by``):
    what is hashed is what the caller hands on."""
    buffer = torch.empty(record.size, dtype=torch.uint8)
    view = memoryview(buffer.numpy()).cast("B") if record.size else memoryview(b"")
    return buffer, hash_record_into(source, record, view)


def _whole_problems(found: int, source: Source, record: Record, expected: Expected) -> list[Corruption]:
    """What is wrong with a whole data record whose bytes hash to ``found`` (by ``record.checked_by``):
    compared with the writer's data digest where there are checksums, else with the zip CRC-32."""
    place, sums = expected.place, expected.sums
    if sums is not None:
        if found != sums.digest:
            return [place.corruption(
                source, record.data_offset, sums.digest, found,
                f"record '{record.name}' is not the data this save wrote",
            )]
        return []
    if record.has_crc and found != record.crc:
        return [place.corruption(source, record.data_offset, record.crc, found, f"record '{record.name}'")]
    return []


def check_whole(source: Source, archive: Archive, expected: Expected, scratch: memoryview) -> tuple[int, list[Corruption]]:
    """Check the chunk's data record whole as :func:`read_whole` does, keeping none of its bytes;
    returns their digest (the module's docstring) and what is wrong."""
    record = _data_record(archive, expected)
    found = hash_record(source, record, scratch)
    return found, _whole_problems(found, source, record, expected)


def read_whole(source: Source, archive: Archive, expected: Expected) -> tuple[torch.Tensor, list[Corruption]]:
    """The chunk's data record whole (uint8), checked against the writer's data digest (with
    ``.checksums``) or the zip CRC-32 (without)."""
    record = _data_record(archive, expected)
    buffer, found = read_record(source, record)
    return buffer, _whole_problems(found, source, record, expected)


# A chunk whose dim-0 slices are bigger than this is not read in parts of whole slices.
_SLICES_UP_TO = 8 << 20


def boxes_readable_whole(archive: Archive, expected: Expected, archive_bytes: int) -> bool:
    """Whether :func:`read_boxes_of_whole` can read boxes of this chunk: a contiguous tensor with
    dims, in this host's byte order, big enough that a staged whole copy would cost (a small archive is
    in memory already), with dim-0 slices of at most 8 MiB."""
    m = archive.meta
    return (
        archive.contiguous
        and archive.in_host_order
        and m.dim() >= 1
        and m.numel() > 0
        and not reads_archive_whole(archive_bytes)
        and m.numel() // m.shape[0] * m.element_size() <= _SLICES_UP_TO
    )


def read_boxes_of_whole(source: Source, archive: Archive, expected: Expected,
                        boxes: list[tuple[list[int], list[int]]]) -> tuple[list[torch.Tensor], list[Corruption]]:
    """Boxes (offsets, lengths) of a chunk whose data record is checked whole as :func:`read_whole`
    checks it, keeping only the boxes' bytes: the record is read a run of dim-0 slices at a time into
    one buffer that stays in the cache, hashed there, and the boxes' parts of it copied out. Where
    :func:`boxes_readable_whole` holds."""
    m = archive.meta
    shape = list(m.shape)
    slice_bytes = m.numel() // shape[0] * m.element_size()
    piece_bytes = max(1, _PIECE // slice_bytes) * slice_bytes
    scratch = torch.empty(piece_bytes, dtype=torch.uint8)
    outs = [torch.empty(lengths, dtype=m.dtype) for _, lengths in boxes]

    def copy_out(at: int, piece: memoryview) -> None:
        r0 = at // slice_bytes
        rows = torch.frombuffer(piece, dtype=m.dtype).view([len(piece) // slice_bytes, *shape[1:]])
        for (offsets, lengths), out in zip(boxes, outs):
            lo, hi = max(r0, offsets[0]), min(r0 + rows.shape[0], offsets[0] + lengths[0])
            if lo < hi:
                inner = tuple(slice(o, o + n) for o, n in zip(offsets[1:], lengths[1:]))
                out[lo - offsets[0] : hi - offsets[0]].copy_(rows[(slice(lo - r0, hi - r0), *inner)])

    view = memoryview(scratch.numpy())
    record = _data_record(archive, expected)
    found = _hash_pieces(source, record, lambda at, n: view[:n], piece_bytes, copy_out)
    return outs, _whole_problems(found, source, record, expected)


def read_bytes_item(source: Source, expected: Expected) -> tuple[bytes, list[Corruption]]:
    """A bytes item's bytes, checked against the writer's digest when there is one."""
    data = source.read(0, source.length)
    sums = expected.sums
    if sums is not None:
        found = digest(data)
        if found != sums.digest:
            return data, [expected.place.corruption(source, 0, sums.digest, found, "bytes item")]
    return data, []


def tiles_usable(archive: Archive, sums: ItemChecksums | None) -> bool:
    """Whether tile digests can check a byte range of this chunk (a contiguous tensor whose recorded
    tile grid fits its layout)."""
    if sums is None or sums.grid is None or not archive.contiguous:
        return False
    m = archive.meta
    return sums.grid.fits(m.shape, m.element_size()) and len(sums.tile_digests) == sums.grid.count


def read_box_by_tiles(
    source: Source, archive: Archive, sums: ItemChecksums, offsets, lengths, place: ItemPlace
) -> tuple[torch.Tensor, list[Corruption]]:
    """The box ``offsets`` / ``lengths`` of the chunk (its saved dtype), read as the whole tiles it
    touches, each checked against its digest. The result may be a view of the tiles read (not
    contiguous)."""
    meta, grid, e = archive.meta, sums.grid, archive.meta.element_size()
    shape, lengths = list(meta.shape), list(lengths)
    if meta.dim() == 0 or 0 in lengths:
        raise ValueError("read_box_by_tiles needs a box with elements of a tensor with dims")
    # The byte columns of the box in each row, widened to tile edges.
    c0, c1 = offsets[-1] * e, (offsets[-1] + lengths[-1]) * e
    w0 = c0 // grid.tile_bytes * grid.tile_bytes
    w1 = min(-(-c1 // grid.tile_bytes) * grid.tile_bytes, grid.row_bytes)
    # The matrix rows the box covers, in the box's order (Horner over all but the last dim).
    rows = torch.zeros((), dtype=torch.int64)
    for d in range(meta.dim() - 1):
        rows = rows.unsqueeze(-1) * shape[d] + torch.arange(offsets[d], offsets[d] + lengths[d])
    rows = rows.reshape(-1)
    bands = torch.unique(rows // grid.tile_rows).tolist()
    heights = [min(grid.tile_rows, grid.rows - b * grid.tile_rows) for b in bands]
    window = torch.empty(sum(heights), w1 - w0, dtype=torch.uint8)
    base = archive.data.data_offset
    bad: list[Corruption] = []
    at = 0
    whole_rows = w0 == 0 and w1 == grid.row_bytes
    scratch = torch.empty(grid.tile_rows * (w1 - w0), dtype=torch.uint8)
    width = w1 - w0
    clock = time.perf_counter()
    for band, height in zip(bands, heights):
        part = window[at : at + height]
        first = band * grid.tile_rows
        if whole_rows:  # the band's rows are one run of the record
            source.read_into(memoryview(part.numpy()).cast("B"), base + first * grid.row_bytes)
        else:
            view = memoryview(part.numpy()).cast("B")
            source.read_rows(view, base + first * grid.row_bytes + w0, grid.row_bytes, width, height)
        clock = spent("read_s", clock)
        found = band_digests(part, grid, scratch)
        bad += _compare_band(found, sums, grid, band, w0 // grid.tile_bytes, first, archive, source, place, w0)
        clock = spent("check_s", clock)
        at += height
    columns = slice(c0 - w0, c1 - w0)
    first_row, count = int(rows[0]), rows.numel()
    if int(rows[-1]) - first_row + 1 == count:
        # The box's rows are one run of the chunk's (every 2-D box): a view of the window, no copy.
        start = first_row - bands[0] * grid.tile_rows
        return window[start : start + count, columns].view(meta.dtype).view(lengths), bad
    # Where each box row sits in the window: bands are sorted and only the chunk's last can be short.
    lookup = torch.zeros(bands[-1] + 1, dtype=torch.int64)
    lookup[torch.tensor(bands)] = torch.arange(len(bands))
    index = lookup[rows // grid.tile_rows] * grid.tile_rows + rows % grid.tile_rows
    picked = window.index_select(0, index)[:, columns].contiguous()
    return picked.view(-1).view(meta.dtype).view(lengths), bad


def _compare_band(found, sums, grid, band, first_col, first_row, archive, source, place, w0=0) -> list[Corruption]:
    bad = []
    for j, value in enumerate(found):
        k = band * grid.tile_cols + first_col + j
        if value != sums.tile_digests[k]:
            offset = archive.data.data_offset + first_row * grid.row_bytes + w0 + j * grid.tile_bytes
            what = f"block {k} of {grid.count} (rows {first_row}.., bytes {w0 + j * grid.tile_bytes}.. of each row)"
            bad.append(place.corruption(source, offset, sums.tile_digests[k], value, what))
    return bad


def as_saved_tensor(buffer: torch.Tensor, archive: Archive) -> torch.Tensor:
    """The saved tensor over a whole data record's bytes (little-endian archives)."""
    m = archive.meta
    if m.numel() == 0:
        return torch.empty(m.shape, dtype=m.dtype)
    return buffer.view(m.dtype).as_strided(m.shape, m.stride(), m.storage_offset())
