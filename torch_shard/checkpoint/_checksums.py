"""Block checksums of saved tensor chunks, and the ``.checksums`` file that holds them.

NOTE [ Block checksums for byte-range reads ]
A zip record's CRC-32 checks only a record read whole. ``ByteRangeFileSystemReader`` reads a part of
a chunk (a row-chunked tensor loaded into columns reads a quarter of every row), so a writer that
wants those reads checked records CRC-32s of small blocks as well. The blocks follow the tensor's
layout, not the file's: the chunk's bytes are viewed as a matrix with one row per index of all but
the last dim and ``shape[-1] * element_size`` bytes per row, and cut into tiles of at most
``TILE_ROW_BYTES`` bytes of each row by enough rows to make about ``TILE_BYTES``. A read of any box
then reads whole tiles: at most one tile's width more per row on each side and one tile's height
more on each side of the rows, and nothing more when the box's edges fall on tile edges (a
4096-column float32 matrix split into quarters of columns reads exactly its quarter). A tile's
CRC-32 is over its bytes taken row by row. One 4-byte CRC per 64 KiB keeps the table at 1/16384 of
the data, and a tile is big enough that the per-tile Python work stays small next to hashing it.

The writer computes the CRCs from the tensor in memory (what it hands to ``torch.save``), so a byte
that changes on its way to the disk or later is caught. They go, with the save's id, into one JSON
file ``.checksums`` beside ``.metadata``, written before ``.metadata``; DCP's own readers ignore it,
and a reader ignores a ``.checksums`` left by an earlier save into the same directory (its id
differs from the metadata's).
"""

from __future__ import annotations

import json
import math
import struct
from dataclasses import dataclass

import torch

from ._archive import crc32

TILE_ROW_BYTES = 1024
TILE_BYTES = 64 * 1024
FORMAT = "torch_shard.checksums"
VERSION = 1


@dataclass(frozen=True)
class TileGrid:
    """The tiles of a chunk: its bytes as ``rows`` x ``row_bytes``, cut into ``tile_rows`` x ``tile_bytes``."""

    rows: int
    row_bytes: int
    tile_rows: int
    tile_bytes: int

    @classmethod
    def for_chunk(cls, shape, element_size: int) -> TileGrid:
        shape = list(shape)
        rows = math.prod(shape[:-1]) if shape else 1
        row_bytes = (shape[-1] if shape else 1) * element_size
        tile_bytes = max(1, min(row_bytes, TILE_ROW_BYTES))
        return cls(rows, row_bytes, max(1, TILE_BYTES // tile_bytes), tile_bytes)

    @property
    def tile_cols(self) -> int:
        return -(-self.row_bytes // self.tile_bytes)

    @property
    def count(self) -> int:
        if self.rows == 0 or self.row_bytes == 0:
            return 0
        return -(-self.rows // self.tile_rows) * self.tile_cols


def band_crcs(band: torch.Tensor, grid: TileGrid, scratch: torch.Tensor | None = None) -> list[int]:
    """CRC-32s of the tiles in ``band``: a uint8 matrix of whole tile rows' bytes whose columns start
    on a tile edge and hold whole tiles (the last may end at the row's end).

    Tiles narrower than the band are gathered into ``scratch`` (a flat uint8 buffer reused from band
    to band, so the bytes are copied into memory that stays in the cache rather than into pages
    allocated afresh for each band), then hashed with one CRC call per tile."""
    h, width = band.shape
    if h == 0 or width == 0:
        return []
    tb = grid.tile_bytes
    if width == tb or (width == grid.row_bytes and grid.tile_cols == 1):
        return [crc32(band.contiguous())]
    full = width // tb
    out = []
    if full:
        n = h * full * tb
        if scratch is None or scratch.numel() < n:
            scratch = torch.empty(n, dtype=torch.uint8)
        scratch[:n].view(full, h, tb).copy_(band[:, : full * tb].reshape(h, full, tb).transpose(0, 1))
        flat = memoryview(scratch[:n].numpy())
        step = h * tb
        out = [crc32(flat[i * step : (i + 1) * step]) for i in range(full)]
    if width > full * tb:
        out.append(crc32(band[:, full * tb :].contiguous()))
    return out


def band_scratch(grid: TileGrid) -> torch.Tensor:
    """A buffer :func:`band_crcs` can gather any band of ``grid`` into."""
    return torch.empty(min(grid.rows, grid.tile_rows) * grid.row_bytes, dtype=torch.uint8)


def tensor_tile_crcs(tensor: torch.Tensor) -> tuple[TileGrid, list[int]]:
    """The tile grid of a contiguous CPU tensor and its tiles' CRC-32s, tile rows first."""
    grid = TileGrid.for_chunk(tensor.shape, tensor.element_size())
    if grid.count == 0:
        return grid, []
    matrix = tensor.reshape(-1).view(torch.uint8).view(grid.rows, grid.row_bytes)
    scratch = band_scratch(grid) if grid.tile_cols > 1 else None
    crcs: list[int] = []
    for start in range(0, grid.rows, grid.tile_rows):
        crcs.extend(band_crcs(matrix[start : start + grid.tile_rows], grid, scratch))
    return grid, crcs


@dataclass(frozen=True)
class ChunkChecksums:
    """What the writer recorded for one saved item."""

    fqn: str
    grid: TileGrid | None  # tensor chunks: the tiles; None for bytes items
    crcs: tuple[int, ...]  # tiles' CRC-32s, or the bytes item's one CRC-32

    def to_json(self) -> dict:
        out: dict = {"fqn": self.fqn, "crc": struct.pack(f">{len(self.crcs)}I", *self.crcs).hex()}
        if self.grid is not None:
            g = self.grid
            out["tiles"] = [g.rows, g.row_bytes, g.tile_rows, g.tile_bytes]
        return out

    @classmethod
    def from_json(cls, data: dict) -> ChunkChecksums:
        raw = bytes.fromhex(data["crc"])
        grid = TileGrid(*data["tiles"]) if "tiles" in data else None
        return cls(data["fqn"], grid, struct.unpack(f">{len(raw) // 4}I", raw))


def location_key(relative_path: str, offset: int) -> str:
    """The key of a saved item in the ``.checksums`` file: where it is stored."""
    return f"{relative_path}:{offset}"


def checksums_file_name(rank: int | None = None) -> str:
    """``.checksums`` beside ``.metadata`` (``__<rank>.checksums`` beside ``__<rank>.metadata``)."""
    return ".checksums" if rank is None else f"__{rank}.checksums"


def dump(save_id: str | None, items: dict[str, ChunkChecksums]) -> bytes:
    body = {
        "format": FORMAT,
        "version": VERSION,
        "algorithm": "crc32",
        "save_id": save_id,
        "items": {key: value.to_json() for key, value in items.items()},
    }
    return json.dumps(body, separators=(",", ":")).encode()


def load(data: bytes, save_id: str | None) -> dict[str, ChunkChecksums] | None:
    """The recorded checksums, or None when the file belongs to another save (or another format)."""
    body = json.loads(data)
    if body.get("format") != FORMAT or body.get("version") != VERSION or body.get("algorithm") != "crc32":
        return None
    if save_id is not None and body.get("save_id") != save_id:
        return None
    return {key: ChunkChecksums.from_json(value) for key, value in body["items"].items()}


def read_for(fs, path, metadata, rank: int | None = None) -> dict[str, ChunkChecksums] | None:
    """The ``.checksums`` of the checkpoint at ``path`` whose metadata is ``metadata``, if any."""
    file = fs.concat_path(path, checksums_file_name(rank))
    if not fs.exists(file):
        return None
    with fs.create_stream(file, "rb") as stream:
        data = stream.read()
    storage_meta = getattr(metadata, "storage_meta", None)
    return load(data, getattr(storage_meta, "save_id", None))
