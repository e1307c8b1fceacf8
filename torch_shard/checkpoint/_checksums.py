"""Block checksums of saved tensor chunks, and the ``.checksums`` file that holds them.

NOTE [ Block checksums for byte-range reads ]
A whole record's digest checks only a record read whole. ``ByteRangeFileSystemReader`` reads a part
of a chunk (a row-chunked tensor loaded into columns reads a quarter of every row), so a writer that
wants those reads checked records digests of small blocks as well. The blocks follow the tensor's
layout, not the file's: the chunk's bytes are viewed as a matrix with one row per index of all but
the last dim and ``shape[-1] * element_size`` bytes per row, and cut into tiles of a sixteenth of a
row (a power of two from ``MIN_TILE_ROW_BYTES`` to ``MAX_TILE_ROW_BYTES`` bytes) by enough rows to
make about ``TILE_BYTES``. A read of any box then reads whole tiles: at most one tile's width more
per row on each side and one tile's height more on each side of the rows, and nothing more when the
box's edges fall on tile edges: a chunk loaded in up to 16 column blocks reads exactly its blocks
(a 4096-column float32 matrix split into quarters of columns reads its quarter; so does a 64-column
embedding table, in 64-byte tiles), narrower blocks read at most a 64-byte tile more per row side. A
tile's digest (XXH3-64, NOTE [ Which hash .checksums records ]) is over its bytes taken row by row.
One 8-byte digest per 64 KiB keeps the table at 1/8192 of the data, and a tile is big enough that
the per-tile Python work stays small next to hashing it. The grid is recorded with the digests, so a
reader follows whatever grid a writer chose.

NOTE [ What .checksums binds to one save ]
A zip record's CRC-32 proves only that the record is self-consistent: a chunk (or a whole ``.distcp``
file) copied from an older save of the same model, or two ranks' chunks swapped, pass it. So the
writer records, for every saved item, what THIS save wrote, computed from the data in memory (what
it hands to ``torch.save``, so a byte that changes on its way to the disk or later is caught): the
digest of the item's stored data (a bytes item's bytes; a tensor chunk's storage, which is the
archive's data record), and for row-major chunks the tile digests above, all XXH3-64 (NOTE [ Which
hash .checksums records ]). A load checks every byte it hands to the model against these, whole
reads against the data digest (one pass of XXH3; the record's zip CRC-32 is not computed: the
digest of what this save wrote checks more), partial reads against the tiles; the archive's small
records (the pickle, the bookkeeping) are still checked against their zip CRC-32s. The file also
holds the SHA-256 of the ``.metadata`` file's bytes as the writer put it in place (``_metadata.py``):
a ``.metadata`` that still unpickles after damage, into moved offsets or sizes, is caught. And it
checks itself: its last member is the XXH3-64 of every byte before it (``check``), so a damaged
``.checksums`` is reported as such, not as damaged data. ``.checksums`` is written before
``.metadata`` is renamed into place; both carry the save's id, and a ``.checksums`` of another save
(a crash between the two, or a later save by a writer that records none) is an error, never silently
ignored.

A load reads ``.checksums`` whole on every rank, so reading it costs what reading ``.metadata`` does
and no more: the check is over the bytes as they are (no re-encoding), and an item's entry is decoded
only when a rank reads that item. Only version 4 is read (versions 1 to 3 recorded CRC-32s and were
never released); a file of another version or algorithm is refused with a message that says how to
load without it.
"""

from __future__ import annotations

import json
import math
import re
import struct
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass

import torch

from ._digest import ALGORITHM, HEX_DIGITS, digest, digest_bytes

MIN_TILE_ROW_BYTES = 64
MAX_TILE_ROW_BYTES = 1024
TILE_BYTES = 64 * 1024
FORMAT = "torch_shard.checksums"
# The one version read (1 to 3, CRC-32s, were never released).
VERSION = 4
# ByteRangeFileSystemReader reads a chunk whose archive is at most READ_WHOLE_UP_TO bytes whole, in one
# read, even where a load needs a part of it (a read per row of a part of a small chunk costs more),
# and checks it against its data digest; so the writer records no tile digests for a chunk that small: its
# data with room for the archive's other records (a few hundred bytes: the pickle, the bookkeeping).
READ_WHOLE_UP_TO = 256 * 1024
_ARCHIVE_RECORDS_UP_TO = 4096


def reads_archive_whole(archive_bytes: int) -> bool:
    """Whether a reader reads a chunk's archive of this many bytes whole."""
    return archive_bytes <= READ_WHOLE_UP_TO


def tiles_worth_recording(data_bytes: int) -> bool:
    """Whether a chunk with this many data bytes gets tile digests (its archive may be read in parts)."""
    return data_bytes + _ARCHIVE_RECORDS_UP_TO > READ_WHOLE_UP_TO


# A file ends with its check: `,"check":"` 16 hex digits `"}`, the digest of every byte before it.
_CHECK_TAIL = re.compile(rb',"check":"([0-9a-f]{%d})"\}' % HEX_DIGITS)
_CHECK_TAIL_BYTES = 12 + HEX_DIGITS
_DIGEST_BYTES = HEX_DIGITS // 2


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


def band_digests(band: torch.Tensor, grid: TileGrid, scratch: torch.Tensor | None = None) -> list[int]:
    """Digests of the tiles in ``band``: a uint8 matrix of whole tile rows' bytes whose columns start
    on a tile edge and hold whole tiles (the last may end at the row's end).

    Tiles narrower than the band are gathered into ``scratch`` (a flat uint8 buffer reused from band
    to band, so the bytes are copied into memory that stays in the cache rather than into pages
    allocated afresh for each band), then hashed with one call per tile."""
    h, width = band.shape
    if h == 0 or width == 0:
        return []
    tb = grid.tile_bytes
    if width == tb or (width == grid.row_bytes and grid.tile_cols == 1):
        return [digest(band.contiguous())]
    full = width // tb
    out = []
    if full:
        n = h * full * tb
        if scratch is None or scratch.numel() < n:
            scratch = torch.empty(n, dtype=torch.uint8)
        scratch[:n].view(full, h, tb).copy_(band[:, : full * tb].reshape(h, full, tb).transpose(0, 1))
        flat = memoryview(scratch[:n].numpy())
        step = h * tb
        out = [digest_bytes(flat[i * step : (i + 1) * step]) for i in range(full)]
    if width > full * tb:
        out.append(digest(band[:, full * tb :].contiguous()))
    return out


def band_scratch(grid: TileGrid) -> torch.Tensor:
    """A buffer :func:`band_digests` can gather any band of ``grid`` into."""
    return torch.empty(min(grid.rows, grid.tile_rows) * grid.row_bytes, dtype=torch.uint8)


def tensor_tile_digests(tensor: torch.Tensor, whole=None) -> tuple[TileGrid, list[int]]:
    """The tile grid of a contiguous CPU tensor and its tiles' digests, tile rows first.

    ``whole``, a running hash (``_digest.hasher()``), is handed the tensor's bytes in order, a band
    of tile rows at a time just before its tiles are hashed (while the band is in the cache): the
    tensor's digest costs no second pass over memory."""
    grid = TileGrid.for_chunk(tensor.shape, tensor.element_size())
    flat = tensor.reshape(-1).view(torch.uint8)
    if grid.count == 0:
        if whole is not None and flat.numel():
            whole.update(flat.numpy())
        return grid, []
    matrix = flat.view(grid.rows, grid.row_bytes)
    scratch = band_scratch(grid) if grid.tile_cols > 1 else None
    digests: list[int] = []
    for start in range(0, grid.rows, grid.tile_rows):
        band = matrix[start : start + grid.tile_rows]
        if whole is not None:
            whole.update(band.reshape(-1).numpy())
        digests.extend(band_digests(band, grid, scratch))
    return grid, digests


def saved_storage_bytes(tensor: torch.Tensor) -> torch.Tensor:
    """The bytes ``torch.save`` writes as ``tensor``'s data record: its whole storage, as uint8."""
    storage = tensor.untyped_storage()
    return torch.empty(0, dtype=torch.uint8).set_(storage, 0, (storage.nbytes(),))


@dataclass(frozen=True)
class ItemChecksums:
    """What the writer recorded for one saved item (NOTE [ What .checksums binds to one save ]).

    Attributes:
        fqn: the item's fully qualified name.
        digest: the XXH3-64 of the item's stored data: a bytes item's bytes, a tensor chunk's storage
            (its archive's data record).
        grid: a row-major tensor chunk's tiles (None for bytes items and other layouts).
        tile_digests: the tiles' XXH3-64s, tile rows first.
    """

    fqn: str
    digest: int
    grid: TileGrid | None = None
    tile_digests: tuple[int, ...] = ()

    def to_json(self) -> dict:
        out: dict = {"fqn": self.fqn, "digest": f"{self.digest:0{HEX_DIGITS}x}"}
        if self.grid is not None:
            g = self.grid
            out["tiles"] = [g.rows, g.row_bytes, g.tile_rows, g.tile_bytes]
            out["tile_digests"] = struct.pack(f">{len(self.tile_digests)}Q", *self.tile_digests).hex()
        return out

    @classmethod
    def from_json(cls, data: Mapping) -> ItemChecksums:
        fqn = data["fqn"]
        if not isinstance(fqn, str):
            raise ValueError("an item's fqn is not a string")
        grid = TileGrid(*(int(v) for v in data["tiles"])) if "tiles" in data else None
        text = data["digest"]
        if not isinstance(text, str) or len(text) != HEX_DIGITS:
            raise ValueError(f"item '{fqn}' has a malformed digest")
        tiles = _unpack_digests(data["tile_digests"]) if grid is not None else ()
        if grid is not None and len(tiles) != grid.count:
            raise ValueError(f"item '{fqn}' has {len(tiles)} tile digests for {grid.count} tiles")
        return cls(fqn, int(text, 16), grid, tiles)


def _unpack_digests(text: str) -> tuple[int, ...]:
    raw = bytes.fromhex(text)
    if len(raw) % _DIGEST_BYTES:
        raise ValueError("a digest list is not a whole number of digests")
    return struct.unpack(f">{len(raw) // _DIGEST_BYTES}Q", raw)


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

    def __init__(self, raw: Mapping):
        self._raw, self._decoded = raw, {}

    def __getitem__(self, key: str) -> ItemChecksums:
        found = self._decoded.get(key)
        if found is None:
            value = self._raw[key]
            try:
                found = ItemChecksums.from_json(value)
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
        version: the format version (:data:`VERSION`).
        save_id: the id of the save that wrote it (compared with ``.metadata``'s).
        metadata_digest: the SHA-256 (hex) of the ``.metadata`` file's bytes.
        items: what was recorded per saved item, by :func:`location_key`.
    """

    version: int
    save_id: str | None
    metadata_digest: str
    items: Mapping[str, ItemChecksums]


def encode_items(items: Mapping[str, ItemChecksums]) -> str:
    """Entries of a ``.checksums`` file's ``items``, as JSON members without the braces: a rank encodes
    its own items, and the coordinator joins the ranks' parts (:func:`dump`) without decoding them."""
    return json.dumps({key: value.to_json() for key, value in items.items()}, separators=(",", ":"))[1:-1]


def dump(save_id: str | None, metadata_sha256: str, item_parts: Iterable[str]) -> bytes:
    """The ``.checksums`` file's bytes, its items the :func:`encode_items` parts joined: a JSON body
    whose last member, ``check``, is the digest of every byte before it."""
    body = {
        "format": FORMAT,
        "version": VERSION,
        "algorithm": ALGORITHM,
        "save_id": save_id,
        "metadata": metadata_sha256,
    }
    items = ",".join(part for part in item_parts if part)
    head = json.dumps(body, separators=(",", ":")).encode()[:-1] + b',"items":{' + items.encode() + b"}"
    return head + b',"check":"%0*x"}' % (HEX_DIGITS, digest(head))


def parse(data: bytes) -> ChecksumsFile:
    """Parse a ``.checksums`` file.

    Raises:
        ValueError: naming what is wrong, when the file is not valid JSON, not this format, of another
            version or algorithm, fails its own check or holds malformed entries (an entry is decoded,
            and so found malformed, when it is first read: see ``_Entries``).
    """
    tail = _CHECK_TAIL.fullmatch(data[-_CHECK_TAIL_BYTES:]) if isinstance(data, bytes) else None
    if tail is not None:  # the check is over the bytes as they are
        found = b"%0*x" % (HEX_DIGITS, digest(memoryview(data)[:-_CHECK_TAIL_BYTES]))
        if tail.group(1) != found:
            raise ValueError(f"fails its own check (check {tail.group(1).decode()!r}, the bytes before it "
                             f"hash to {found.decode()})")
    try:
        body = json.loads(data)
    except (ValueError, UnicodeDecodeError) as e:
        raise ValueError(f"is not valid JSON ({e})") from None
    if not isinstance(body, dict) or body.get("format") != FORMAT:
        raise ValueError(f"is not a {FORMAT} file")
    version = body.get("version")
    if version != VERSION or body.get("algorithm") != ALGORITHM:
        raise ValueError(f"has version {version!r} / algorithm {body.get('algorithm')!r}; this torch_shard "
                         f"reads version {VERSION} of {ALGORITHM}")
    if tail is None:
        raise ValueError("does not end with its own check")
    try:
        raw = body["items"]
        if not isinstance(raw, dict):
            raise TypeError("items is not an object")
        save_id, metadata_digest = body.get("save_id"), body.get("metadata")
        if (save_id is not None and not isinstance(save_id, str)) or not isinstance(metadata_digest, str):
            raise ValueError("save_id or metadata is not a string")
    except (KeyError, TypeError, ValueError) as e:
        raise ValueError(f"holds a malformed entry ({type(e).__name__}: {e})") from None
    return ChecksumsFile(version, save_id, metadata_digest, _Entries(raw))
