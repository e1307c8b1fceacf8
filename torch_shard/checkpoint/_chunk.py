"""Reading one saved tensor chunk (or a box of it) with every byte checked against a checksum.

Two ways, chosen per read (see NOTE [ The checksums a DCP chunk already carries ] and NOTE [ Block
checksums for byte-range reads ]): the whole data record, checked against its zip CRC-32; or the
tiles a box touches, checked against the writer's block CRCs. Both return the bytes in memory of
their own (never the destination's) plus the checks that failed; the caller decides what to do.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ._archive import Archive, Record, Source, crc32
from ._checksums import ChunkChecksums, TileGrid, band_crcs, band_scratch
from ._errors import Corruption


@dataclass(frozen=True)
class ItemPlace:
    """Names a saved item in messages: its fqn, chunk offsets and file."""

    fqn: str
    chunk_offsets: tuple[int, ...] | None
    file: str
    rank: int | None = None

    def corruption(self, source: Source, offset: int, expected, found, what: str) -> Corruption:
        return Corruption(
            self.fqn, self.chunk_offsets, self.file, source.file_offset(offset), expected, found, what, self.rank
        )


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


# Whole records are read and hashed a piece at a time, each piece hashed while it is in the cache.
_PIECE = 1 << 20


def read_record(source: Source, record: Record, place: ItemPlace) -> tuple[torch.Tensor, list[Corruption]]:
    """A record's bytes (uint8) and, if its CRC-32 is recorded and differs, the corruption. The CRC
    is of the bytes in the returned buffer: what is checked is what the caller hands on."""
    buffer = torch.empty(record.size, dtype=torch.uint8)
    view = memoryview(buffer.numpy()).cast("B") if record.size else memoryview(b"")
    found = 0
    for at in range(0, record.size, _PIECE):
        piece = view[at : at + _PIECE]
        source.read_into(piece, record.data_offset + at)
        if record.has_crc:
            found = crc32(piece, found)
    if not record.has_crc or found == record.crc:
        return buffer, []
    return buffer, [place.corruption(source, record.data_offset, record.crc, found, f"record '{record.name}'")]


def check_tiles_of_whole(buffer: torch.Tensor, archive: Archive, sums: ChunkChecksums, source: Source,
                         place: ItemPlace) -> list[Corruption]:
    """Check a whole data record's bytes against the writer's tile CRCs."""
    grid = sums.grid
    matrix = buffer.view(grid.rows, grid.row_bytes)
    bad = []
    scratch = band_scratch(grid)
    for band, start in enumerate(range(0, grid.rows, grid.tile_rows)):
        found = band_crcs(matrix[start : start + grid.tile_rows], grid, scratch)
        bad += _compare_band(found, sums, grid, band, 0, start, archive, source, place)
    return bad


def tiles_usable(archive: Archive, sums: ChunkChecksums | None) -> bool:
    """Whether block CRCs can check a byte range of this chunk (a contiguous tensor whose recorded
    tile grid is the one its layout gives)."""
    if sums is None or sums.grid is None or not archive.contiguous:
        return False
    m = archive.meta
    return sums.grid == TileGrid.for_chunk(m.shape, m.element_size()) and len(sums.crcs) == sums.grid.count


def read_box_by_tiles(
    source: Source, archive: Archive, sums: ChunkChecksums, offsets, lengths, place: ItemPlace
) -> tuple[torch.Tensor, list[Corruption]]:
    """The box ``offsets`` / ``lengths`` of the chunk (its saved dtype), read as the whole tiles it
    touches, each checked against its CRC-32."""
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
    for band, height in zip(bands, heights):
        part = window[at : at + height]
        first = band * grid.tile_rows
        if whole_rows:  # the band's rows are one run of the record
            source.read_into(memoryview(part.numpy()).cast("B"), base + first * grid.row_bytes)
        else:
            view = memoryview(part.numpy()).cast("B")
            width = w1 - w0
            for i in range(height):
                source.read_into(view[i * width : (i + 1) * width], base + (first + i) * grid.row_bytes + w0)
        found = band_crcs(part, grid, scratch)
        bad += _compare_band(found, sums, grid, band, w0 // grid.tile_bytes, first, archive, source, place, w0)
        at += height
    # Where each box row sits in the window: bands are sorted and only the chunk's last can be short.
    lookup = torch.zeros(bands[-1] + 1, dtype=torch.int64)
    lookup[torch.tensor(bands)] = torch.arange(len(bands))
    index = lookup[rows // grid.tile_rows] * grid.tile_rows + rows % grid.tile_rows
    picked = window.index_select(0, index)[:, c0 - w0 : c1 - w0].contiguous()
    return picked.view(-1).view(meta.dtype).view(lengths), bad


def _compare_band(found, sums, grid, band, first_col, first_row, archive, source, place, w0=0) -> list[Corruption]:
    bad = []
    for j, crc in enumerate(found):
        k = band * grid.tile_cols + first_col + j
        if crc != sums.crcs[k]:
            offset = archive.data.data_offset + first_row * grid.row_bytes + w0 + j * grid.tile_bytes
            what = f"block {k} of {grid.count} (rows {first_row}.., bytes {w0 + j * grid.tile_bytes}.. of each row)"
            bad.append(place.corruption(source, offset, sums.crcs[k], crc, what))
    return bad


def as_saved_tensor(buffer: torch.Tensor, archive: Archive) -> torch.Tensor:
    """The saved tensor over a whole data record's bytes (little-endian archives)."""
    m = archive.meta
    if m.numel() == 0:
        return torch.empty(m.shape, dtype=m.dtype)
    return buffer.view(m.dtype).as_strided(m.shape, m.stride(), m.storage_offset())
