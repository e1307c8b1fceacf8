"""Block checksums of saved tensor chunks, and the ``.checksums`` file that holds them.

NOTE [ Block checksums for byte-range reads ]
A zip record's CRC-32 checks only a record read whole. ``ByteRangeFileSystemReader`` reads a part of
a chunk (a row-chunked tensor loaded into columns reads a quarter of every row), so a writer that
wants those reads checked records CRC-32s of small blocks as well. The blocks follow the tensor's
layout, not the file's: the chunk's bytes are viewed as a matrix with one row per index of all but
the last dim and ``shape[-1] * element_size`` bytes per row, and cut into tiles of a sixteenth of a
row (a power of two from ``MIN_TILE_ROW_BYTES`` to ``MAX_TILE_ROW_BYTES`` bytes) by enough rows to
make about ``TILE_BYTES``. A read of any box then reads whole tiles: at most one tile's width more
per row on each side and one tile's height more on each side of the rows, and nothing more when the
box's edges fall on tile edges: a chunk loaded in up to 16 column blocks reads exactly its blocks
(a 4096-column float32 matrix split into quarters of columns reads its quarter; so does a 64-column
embedding table, in 64-byte tiles), narrower blocks read at most a 64-byte tile more per row side. A
tile's CRC-32 is over its bytes taken row by row. One 4-byte CRC per 64 KiB keeps the table at
1/16384 of the data, and a tile is big enough that the per-tile Python work stays small next to
hashing it. The grid is recorded with the CRCs, so a reader follows whatever grid a writer chose.

NOTE [ What .checksums binds to one save ]
A zip record's CRC-32 proves only that the record is self-consistent: a chunk (or a whole ``.distcp``
file) copied from an older save of the same model, or two ranks' chunks swapped, pass it. So the
writer records, for every saved item, what THIS save wrote, computed from the data in memory (what
it hands to ``torch.save``, so a byte that changes on its way to the disk or later is caught): the
CRC-32 of the item's stored data (a bytes item's bytes; a tensor chunk's storage, which is the
archive's data record), and for row-major chunks the tile CRCs above. A load checks every byte it
hands to the model against these, whole reads against the data CRC (one pass: the same hash is
compared with the zip record's CRC), partial reads against the tiles. The file also holds the SHA-256
of the ``.metadata`` file's bytes as the writer put it in place (``_metadata.py``): a ``.metadata``
that still unpickles after damage, into moved offsets or sizes, is caught. And it checks itself: its
last member is a CRC-32 of every byte before it (``check``), so a damaged ``.checksums`` is reported
as such, not as damaged data. ``.checksums`` is written before ``.metadata`` is renamed into place;
both carry the save's id, and a ``.checksums`` of another save (a crash between the two, or a later
save by a writer that records none) is an error, never silently ignored.

A load reads ``.checksums`` whole on every rank, so reading it costs what reading ``.metadata`` does
and no more: the check is over the bytes as they are (no re-encoding), and an item's entry is decoded
only when a rank reads that item. Versions 1 and 2 (earlier torch_shard releases) are still read:
version 2's check is over a re-encoded canonical body and its digest is of the metadata's content
(``_metadata.legacy_digest``); version 1 has neither, nor data CRCs.
"""

from __future__ import annotations

import json
import math
import re
import struct
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass

import torch

from ._archive import crc32

MIN_TILE_ROW_BYTES = 64
MAX_TILE_ROW_BYTES = 1024
TILE_BYTES = 64 * 1024
FORMAT = "torch_shard.checksums"
VERSION = 3
# Versions 1 and 2 (earlier torch_shard) are still read: see ChecksumsFile.
READABLE_VERSIONS = (1, 2, 3)
# ByteRangeFileSystemReader reads a chunk whose archive is at most READ_WHOLE_UP_TO bytes whole, in one
# read, even where a load needs a part of it (a read per row of a part of a small chunk costs more),
# and checks it against its data CRC; so the writer records no tile CRCs for a chunk that small: its
# data with room for the archive's other records (a few hundred bytes: the pickle, the bookkeeping).
READ_WHOLE_UP_TO = 256 * 1024
_ARCHIVE_RECORDS_UP_TO = 4096


def reads_archive_whole(archive_bytes: int) -> bool:
    """Whether a reader reads a chunk's archive of this many bytes whole."""
    return archive_bytes <= READ_WHOLE_UP_TO


def tiles_worth_recording(data_bytes: int) -> bool:
    """Whether a chunk with this many data bytes gets tile CRCs (its archive may be read in parts)."""
    return data_bytes + _ARCHIVE_RECORDS_UP_TO > READ_WHOLE_UP_TO


# A version-3 file ends with its check: `,"check":"` 8 hex digits `"}`, a CRC-32 of every byte before it.
_CHECK_TAIL = re.compile(rb',"check":"([0-9a-f]{8})"\}')
_CHECK_TAIL_BYTES = 20


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
        tile_bytes = MIN_TILE_ROW_BYTES
        while tile_bytes < MAX_TILE_ROW_BYTES and tile_bytes * 2 * 16 <= row_bytes:
            tile_bytes *= 2
        tile_bytes = max(1, min(row_bytes, tile_bytes))
        return cls(rows, row_bytes, max(1, TILE_BYTES // tile_bytes), tile_bytes)

    def fits(self, shape, element_size: int) -> bool:
        """Whether this grid can be the grid of a chunk of ``shape``: its rows and row width, and
        tiles whole elements wide (any writer's choice of tile size is read)."""
        shape = list(shape)
        rows = math.prod(shape[:-1]) if shape else 1
        row_bytes = (shape[-1] if shape else 1) * element_size
        return (
            (self.rows, self.row_bytes) == (rows, row_bytes)
            and self.tile_rows >= 1
            and 1 <= self.tile_bytes <= max(1, row_bytes)
            and (self.tile_bytes % element_size == 0 or self.tile_bytes == row_bytes)
        )

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


def saved_storage_bytes(tensor: torch.Tensor) -> torch.Tensor:
    """The bytes ``torch.save`` writes as ``tensor``'s data record: its whole storage, as uint8."""
    storage = tensor.untyped_storage()
    return torch.empty(0, dtype=torch.uint8).set_(storage, 0, (storage.nbytes(),))


@dataclass(frozen=True)
class ItemChecksums:
    """What the writer recorded for one saved item (NOTE [ What .checksums binds to one save ]).

    Attributes:
        fqn: the item's fully qualified name.
        crc: CRC-32 of the item's stored data: a bytes item's bytes, a tensor chunk's storage (its
            archive's data record). None only in version-1 files' tensor entries.
        grid: a row-major tensor chunk's tiles (None for bytes items and other layouts).
        tile_crcs: the tiles' CRC-32s, tile rows first.
    """

    fqn: str
    crc: int | None
    grid: TileGrid | None = None
    tile_crcs: tuple[int, ...] = ()

    def to_json(self) -> dict:
        out: dict = {"fqn": self.fqn, "crc": f"{self.crc:08x}"}
        if self.grid is not None:
            g = self.grid
            out["tiles"] = [g.rows, g.row_bytes, g.tile_rows, g.tile_bytes]
            out["tile_crcs"] = struct.pack(f">{len(self.tile_crcs)}I", *self.tile_crcs).hex()
        return out

    @classmethod
    def from_json(cls, data: Mapping, version: int) -> ItemChecksums:
        fqn = data["fqn"]
        if not isinstance(fqn, str):
            raise ValueError("an item's fqn is not a string")
        grid = TileGrid(*(int(v) for v in data["tiles"])) if "tiles" in data else None
        if version == 1:  # "crc": the tiles' CRCs, or a bytes item's one CRC
            crcs = _unpack_crcs(data["crc"])
            if grid is None:
                if len(crcs) != 1:
                    raise ValueError(f"bytes item '{fqn}' has {len(crcs)} CRCs")
                return cls(fqn, crcs[0])
            return cls(fqn, None, grid, crcs)
        crc = int(data["crc"], 16)
        tiles = _unpack_crcs(data["tile_crcs"]) if grid is not None else ()
        if grid is not None and len(tiles) != grid.count:
            raise ValueError(f"item '{fqn}' has {len(tiles)} tile CRCs for {grid.count} tiles")
        return cls(fqn, crc, grid, tiles)


def _unpack_crcs(text: str) -> tuple[int, ...]:
    raw = bytes.fromhex(text)
    if len(raw) % 4:
        raise ValueError("a CRC list is not a whole number of CRC-32s")
    return struct.unpack(f">{len(raw) // 4}I", raw)


def location_key(relative_path: str, offset: int) -> str:
    """The key of a saved item in the ``.checksums`` file: where it is stored."""
    return f"{relative_path}:{offset}"


def checksums_file_name(rank: int | None = None) -> str:
    """``.checksums`` beside ``.metadata`` (``__<rank>.checksums`` beside ``__<rank>.metadata``)."""
    return ".checksums" if rank is None else f"__{rank}.checksums"


class _Entries(Mapping):
    """A parsed file's entries by :func:`location_key`, each decoded on first use (a rank decodes the
    entries of the items it reads, not every rank's).

    Raises:
        ValueError: on access to an entry that is malformed (a file that passed its own check, so
            written so by its writer).
    """

    def __init__(self, raw: Mapping, version: int):
        self._raw, self._version, self._decoded = raw, version, {}

    def __getitem__(self, key: str) -> ItemChecksums:
        found = self._decoded.get(key)
        if found is None:
            value = self._raw[key]
            try:
                found = ItemChecksums.from_json(value, self._version)
            except (KeyError, TypeError, ValueError, AttributeError, struct.error) as e:
                raise ValueError(f"holds a malformed entry for '{key}' ({type(e).__name__}: {e})") from None
            self._decoded[key] = found
        return found

    def __contains__(self, key: object) -> bool:
        return key in self._raw

    def __iter__(self) -> Iterator[str]:
        return iter(self._raw)

    def __len__(self) -> int:
        return len(self._raw)


@dataclass(frozen=True)
class ChecksumsFile:
    """A parsed ``.checksums``.

    Attributes:
        version: the format version (1: no metadata digest, tile CRCs only for tensor chunks; 2: the
            digest of the metadata's content).
        save_id: the id of the save that wrote it (compared with ``.metadata``'s).
        metadata_digest: version 3: the SHA-256 (hex) of the ``.metadata`` file's bytes; version 2:
            ``_metadata.legacy_digest`` of its content; None in version 1.
        items: what was recorded per saved item, by :func:`location_key`.
    """

    version: int
    save_id: str | None
    metadata_digest: str | None
    items: Mapping[str, ItemChecksums]


def _canonical(body: Mapping) -> bytes:
    """Version 2's checked form of a body: re-encoded with sorted keys."""
    return json.dumps(body, separators=(",", ":"), sort_keys=True).encode()


def encode_items(items: Mapping[str, ItemChecksums]) -> str:
    """Entries of a ``.checksums`` file's ``items``, as JSON members without the braces: a rank encodes
    its own items, and the coordinator joins the ranks' parts (:func:`dump`) without decoding them."""
    return json.dumps({key: value.to_json() for key, value in items.items()}, separators=(",", ":"))[1:-1]


def dump(save_id: str | None, metadata_sha256: str, item_parts: Iterable[str]) -> bytes:
    """The ``.checksums`` file's bytes, its items the :func:`encode_items` parts joined: a JSON body
    whose last member, ``check``, is a CRC-32 of every byte before it."""
    body = {
        "format": FORMAT,
        "version": VERSION,
        "algorithm": "crc32",
        "save_id": save_id,
        "metadata": metadata_sha256,
    }
    items = ",".join(part for part in item_parts if part)
    head = json.dumps(body, separators=(",", ":")).encode()[:-1] + b',"items":{' + items.encode() + b"}"
    return head + b',"check":"%08x"}' % crc32(head)


def parse(data: bytes) -> ChecksumsFile:
    """Parse a ``.checksums`` file.

    Raises:
        ValueError: naming what is wrong, when the file is not valid JSON, not this format, of an
            unknown version, fails its own check or holds malformed entries (an entry of a version-3
            file is decoded, and so found malformed, when it is first read: see ``_Entries``).
    """
    tail = _CHECK_TAIL.fullmatch(data[-_CHECK_TAIL_BYTES:]) if isinstance(data, bytes) else None
    if tail is not None:  # version 3 (or later): the check is over the bytes as they are
        found = crc32(data[:-_CHECK_TAIL_BYTES])
        if tail.group(1) != b"%08x" % found:
            raise ValueError(f"fails its own check (check {tail.group(1).decode()!r}, the bytes before it "
                             f"hash to {found:08x})")
    try:
        body = json.loads(data)
    except (ValueError, UnicodeDecodeError) as e:
        raise ValueError(f"is not valid JSON ({e})") from None
    if not isinstance(body, dict) or body.get("format") != FORMAT:
        raise ValueError(f"is not a {FORMAT} file")
    version = body.get("version")
    if version not in READABLE_VERSIONS or body.get("algorithm") != "crc32":
        raise ValueError(f"has version {version!r} / algorithm {body.get('algorithm')!r}; this torch_shard "
                         f"reads versions {list(READABLE_VERSIONS)} of crc32")
    if version >= 3 and tail is None:
        raise ValueError("does not end with its own check")
    if version == 2:
        check = body.pop("check", None)
        found = crc32(_canonical(body))
        if not isinstance(check, str) or check != f"{found:08x}":
            raise ValueError(f"fails its own check (check {check!r}, its body's crc32 is {found:08x})")
    try:
        raw = body["items"]
        if not isinstance(raw, dict):
            raise TypeError("items is not an object")
        items: Mapping[str, ItemChecksums]
        if version >= 3:
            items = _Entries(raw, version)
        else:
            items = {str(key): ItemChecksums.from_json(value, version) for key, value in raw.items()}
        save_id = body.get("save_id")
        digest = body.get("metadata") if version >= 2 else None
        if (save_id is not None and not isinstance(save_id, str)) or (version >= 2 and not isinstance(digest, str)):
            raise ValueError("save_id or metadata is not a string")
    except (KeyError, TypeError, ValueError, AttributeError, struct.error) as e:
        raise ValueError(f"holds a malformed entry ({type(e).__name__}: {e})") from None
    return ChecksumsFile(version, save_id, digest, items)
