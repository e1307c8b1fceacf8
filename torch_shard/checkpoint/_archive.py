"""The records of one ``torch.save`` archive (one DCP chunk), read through byte ranges.

NOTE [ The checksums a DCP chunk already carries ]
``FileSystemWriter`` stores each tensor chunk as a ``torch.save`` zip archive. Each zip record (the
pickle ``data.pkl``, the tensor's bytes ``data/0``, a few small bookkeeping records) is stored
uncompressed and its CRC-32 sits in the archive's central directory, computed by ``torch.save`` from
the bytes in memory. ``torch.load`` never checks them (its zip reader runs with CRC checks off), so a
flipped byte loads silently. This module finds the records (Python's ``zipfile`` parses the
directory, zip64 included) and checks a record's CRC-32 when the record is read whole. An archive
written with ``torch.serialization.set_crc32_options(False)`` records a CRC of 0: such a record is
reported as unchecked, not as corrupted.
"""

from __future__ import annotations

import io
import os
import struct
import sys
import zipfile
import zlib
from collections.abc import Callable
from dataclasses import dataclass

import torch

from ._timing import read_from_storage

# A zip local file header is 30 bytes; the name and extra-field lengths sit at bytes 26 and 28.
_LOCAL_HEADER = struct.Struct("<4s22xHH")


class Source:
    """A read-only byte range (one chunk's archive) that answers positioned reads."""

    def __init__(self, length: int):
        self.length = length

    def read_into(self, buffer: memoryview, offset: int) -> None:
        """Fill ``buffer`` from ``offset`` (relative to the archive's start)."""
        raise NotImplementedError

    def file_offset(self, offset: int) -> int:
        """The byte offset in the checkpoint file of archive offset ``offset`` (for messages)."""
        return offset

    def read(self, offset: int, length: int) -> bytes:
        buffer = bytearray(length)
        self.read_into(memoryview(buffer), offset)
        return bytes(buffer)

    def read_rows(self, buffer: memoryview, offset: int, stride: int, width: int, count: int) -> None:
        """Fill ``buffer`` with ``count`` runs of ``width`` bytes, the first at ``offset``, each
        ``stride`` bytes after the one before (a column block of a row-major matrix)."""
        for i in range(count):
            self.read_into(buffer[i * width : (i + 1) * width], offset + i * stride)


class FileSource(Source):
    """An archive at ``base`` .. ``base + length`` of an open file, read with ``preadv`` (no read-ahead).

    With ``windows`` (for an archive whose data will be read whole anyway), small reads (the zip
    directory, the pickle, the bookkeeping records: a few dozen per archive) are served from windows
    read whole on first touch: the whole archive when it is small (a small chunk then costs one
    system call), else its first and last bytes, where ``torch.save`` puts every record but the
    tensor's data. Without, every read reads exactly its bytes (a load that needs a part of the data
    reads no more).
    """

    def __init__(self, handle, base: int, length: int, windows: bool = False):
        super().__init__(length)
        self.handle, self.base, self._windowed = handle, base, windows
        self._windows: dict[int, memoryview] = {}  # start -> bytes read from there

    def read_into(self, buffer: memoryview, offset: int) -> None:
        if offset < 0 or offset + len(buffer) > self.length:
            raise OSError(f"read of {len(buffer)} bytes at {offset} is outside the saved chunk ({self.length} bytes)")
        window = self._window(offset, len(buffer))
        if window is not None:
            start, data = window
            buffer[:] = data[offset - start : offset - start + len(buffer)]
            return
        _read_exact(self.handle, buffer, self.base + offset)

    def _window(self, offset: int, n: int) -> tuple[int, memoryview] | None:
        """A read window holding ``offset`` .. ``offset + n``: one read already, or, for a small read,
        the window it falls in, read now (None: read directly)."""
        window = self._loaded(offset, offset + n)
        if window is not None or not self._windowed or n >= _SMALL_READ:
            return window
        if self.length <= _WHOLE_ARCHIVE:
            start, end = 0, self.length
        elif offset >= self.length - _TAIL_WINDOW:
            start, end = self.length - _TAIL_WINDOW, self.length
        elif offset + n <= _HEAD_WINDOW:
            start, end = 0, _HEAD_WINDOW
        else:
            return None
        data = memoryview(bytearray(end - start))
        _read_exact(self.handle, data, self.base + start)
        self._windows[start] = data
        return start, data

    def _loaded(self, offset: int, end: int) -> tuple[int, memoryview] | None:
        """A window already read that holds ``offset`` .. ``end``."""
        return next(((s, d) for s, d in self._windows.items() if s <= offset and end <= s + len(d)), None)

    def file_offset(self, offset: int) -> int:
        return self.base + offset

    def read_rows(self, buffer: memoryview, offset: int, stride: int, width: int, count: int) -> None:
        if count <= 0:
            return
        last = offset + (count - 1) * stride + width
        if offset < 0 or last > self.length:
            raise OSError(f"read of {count} rows up to byte {last} is outside the saved chunk ({self.length} bytes)")
        window = self._loaded(offset, last)
        if window is not None:
            start, data = window
            _copy_rows(data, offset - start, stride, width, count, buffer)
            return
        fileno = self.handle.fileno() if hasattr(os, "preadv") and hasattr(self.handle, "fileno") else None
        if fileno is None:
            super().read_rows(buffer, offset, stride, width, count)
            return
        if stride - width <= min(width, _HOLE_UP_TO):
            # Small holes, no bigger than the rows: one read of a run of rows (holes too) costs less
            # than a read per row, for at most twice the bytes.
            per_read = max(1, _ROWS_READ_UP_TO // stride)
            scratch = memoryview(bytearray(min(count, per_read) * stride))
            for first in range(0, count, per_read):
                n = min(per_read, count - first)
                span = scratch[: (n - 1) * stride + width]
                _read_exact(self.handle, span, self.base + offset + first * stride)
                _copy_rows(span, 0, stride, width, n, buffer[first * width : (first + n) * width])
            return
        # One system call per row, no Python frames between them (a column block of a 16 Ki-row chunk
        # is 16 Ki rows); a short read, rare on a regular file, finishes through _read_exact.
        pread, at, short = os.preadv, self.base + offset, 0
        for i in range(count):
            row = buffer[i * width : (i + 1) * width]
            if pread(fileno, [row], at) != width:
                _read_exact(self.handle, row, at)
                short += width
            at += stride
        read_from_storage(count * width - short)


def _copy_rows(source: memoryview, offset: int, stride: int, width: int, count: int, out: memoryview) -> None:
    """Copy ``count`` runs of ``width`` bytes, ``stride`` apart from ``offset`` of ``source``, into ``out``
    back to back (one strided copy)."""
    data = torch.frombuffer(source, dtype=torch.uint8)
    rows = data.as_strided((count, width), (stride, 1), offset)
    torch.frombuffer(out, dtype=torch.uint8)[: count * width].view(count, width).copy_(rows)


# FileSource.read_rows reads a run of rows in one read where the holes between them are no wider than
# the rows and than _HOLE_UP_TO bytes (a hole that small costs less to read than a system call; a much
# wider one costs more in extra bytes and the copy out than the call it saves), at most
# _ROWS_READ_UP_TO bytes a read.
_HOLE_UP_TO = 2 * 1024
_ROWS_READ_UP_TO = 4 << 20


# FileSource's read windows: an archive up to _WHOLE_ARCHIVE bytes is read whole at its first small
# read (under _SMALL_READ bytes); a bigger one's first _HEAD_WINDOW and last _TAIL_WINDOW bytes (its
# pickle and bookkeeping records before the data, its directory and last records after it).
_WHOLE_ARCHIVE = 1 << 20
_SMALL_READ = 64 * 1024
_HEAD_WINDOW = 4096
_TAIL_WINDOW = 16 * 1024


class BytesSource(Source):
    """An archive held in memory (what a stream-transforming extension decoded)."""

    def __init__(self, data: bytes, base: int):
        super().__init__(len(data))
        self.data, self.base = memoryview(data), base

    def read_into(self, buffer: memoryview, offset: int) -> None:
        if offset < 0 or offset + len(buffer) > self.length:
            raise OSError(f"read of {len(buffer)} bytes at {offset} is outside the decoded chunk")
        buffer[:] = self.data[offset : offset + len(buffer)]

    def file_offset(self, offset: int) -> int:
        return self.base  # the decoded bytes have no position in the file; name the stored item's


def _read_exact(handle, buffer: memoryview, offset: int) -> None:
    """Fill ``buffer`` from ``offset`` of the file behind ``handle``."""
    done = 0
    fileno = handle.fileno() if hasattr(os, "preadv") and hasattr(handle, "fileno") else None
    while done < len(buffer):
        if fileno is not None:
            got = os.preadv(fileno, [buffer[done:]], offset + done)
        else:
            handle.seek(offset + done)
            got = handle.readinto(buffer[done:])
        if not got:
            raise OSError(f"unexpected end of checkpoint file at byte {offset + done}")
        done += got
    read_from_storage(done)


class _SourceFile(io.RawIOBase):
    """A seekable file object over a :class:`Source` (for ``zipfile`` and ``torch.load``)."""

    def __init__(self, source: Source):
        self.source, self.position = source, 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self.position

    def seek(self, offset: int, whence: int = 0) -> int:
        base = {0: 0, 1: self.position, 2: self.source.length}[whence]
        self.position = max(0, base + offset)
        return self.position

    def readinto(self, buffer) -> int:
        n = max(0, min(len(buffer), self.source.length - self.position))
        if n:
            self.source.read_into(memoryview(buffer).cast("B")[:n], self.position)
        self.position += n
        return n


@dataclass(frozen=True)
class Record:
    """One zip record: where its bytes start in the archive, how many, and their recorded CRC-32.

    ``checked_by`` names the hash a check of the record's bytes computes: ``"crc32"``, compared with
    ``crc``; or, for a tensor's data record in a checkpoint with ``.checksums``, that file's algorithm,
    compared with the digest the writer recorded (``_saved_item.open_chunk`` sets it; ``_digest.py``)."""

    name: str
    data_offset: int
    size: int
    crc: int
    checked_by: str = "crc32"

    @property
    def has_crc(self) -> bool:
        """False for a non-empty record saved with CRC computation off (its CRC field is 0)."""
        return self.crc != 0 or self.size == 0


@dataclass(frozen=True)
class Archive:
    """A chunk's archive: its records and, for a tensor, the saved tensor's layout."""

    records: tuple[Record, ...]
    meta: torch.Tensor | None  # the saved tensor on the meta device (sizes, strides, dtype)
    data: Record | None  # the record holding the tensor's storage
    little_endian: bool

    @property
    def in_host_order(self) -> bool:
        """Whether the stored bytes are in this host's byte order (usable as they are)."""
        return self.little_endian and sys.byteorder == "little"

    @property
    def contiguous(self) -> bool:
        """Whether the saved tensor is its whole storage in row-major order (byte ranges apply)."""
        m = self.meta
        return (
            m is not None
            and self.data is not None
            and m.is_contiguous()
            and m.storage_offset() == 0
            and self.data.size == m.numel() * m.element_size()
        )


def read_archive(source: Source, with_tensor: bool = True) -> Archive:
    """Parse a chunk's zip directory (and, for a tensor, its pickle on the meta device).

    Raises whatever ``zipfile`` or ``torch.load`` raise for an archive they cannot parse.
    """
    with zipfile.ZipFile(_SourceFile(source)) as zf:
        infos = zf.infolist()
    records = []
    for info in infos:
        if info.compress_type != zipfile.ZIP_STORED:
            raise zipfile.BadZipFile(f"record '{info.filename}' is compressed; torch.save stores records")
        _, name_len, extra_len = _LOCAL_HEADER.unpack(source.read(info.header_offset, _LOCAL_HEADER.size))
        start = info.header_offset + _LOCAL_HEADER.size + name_len + extra_len
        records.append(Record(info.filename, start, info.file_size, info.CRC))
    meta = data = None
    little = True
    if with_tensor:
        meta, data = _saved_tensor(source, records)
        order = next((r for r in records if r.name.endswith("/byteorder")), None)
        if order is not None:
            little = source.read(order.data_offset, order.size) == b"little"
    return Archive(tuple(records), meta, data, little)


# What torch.load made of a pickle (``data.pkl``), by its bytes: the saved tensor on the meta device
# and its storage's record name under the archive's folder (None: not a plain tensor). The chunks of
# one checkpoint share a handful of pickles (every chunk of a shape, every parameter of a layer
# type), and unpickling one costs more than reading a small chunk.
_PICKLES: dict[bytes, tuple[torch.Tensor | None, str | None]] = {}
_PICKLES_KEPT = 4096


def _saved_tensor(source: Source, records: list[Record]) -> tuple[torch.Tensor | None, Record | None]:
    """The tensor an archive holds, on the meta device, and its data record (None, None for anything
    else)."""
    pickle_record = next((r for r in records if r.name.endswith("data.pkl")), None)
    if pickle_record is None:
        raise zipfile.BadZipFile("archive holds no data.pkl")
    folder = pickle_record.name[: -len("data.pkl")]
    key = source.read(pickle_record.data_offset, pickle_record.size) if pickle_record.size <= 1 << 16 else None
    known = _PICKLES.get(key) if key is not None else None
    if known is None:
        loaded = torch.load(_SourceFile(source), map_location="meta", weights_only=True)
        meta, name = None, None
        if type(loaded) is torch.Tensor:
            at = getattr(loaded.untyped_storage(), "_checkpoint_offset", None)
            record = next((r for r in records if r.data_offset == at), None)
            meta, name = loaded, (record.name[len(folder):] if record is not None and record.name.startswith(folder) else None)
        known = (meta, name)
        if key is not None:
            if len(_PICKLES) >= _PICKLES_KEPT:
                _PICKLES.clear()
            _PICKLES[key] = known
    meta, name = known
    if meta is None or name is None:
        return meta, None
    return meta, next((r for r in records if r.name == folder + name), None)


def _fastest_crc32() -> tuple[Callable, str]:
    """The fastest CRC-32 (zlib's polynomial, as zip records use) installed: zlib-ng's or ISA-L's (SIMD,
    several times the standard library's speed, and they let go of the GIL while hashing), else the
    standard library's zlib. All give the same values."""
    try:
        from zlib_ng.zlib_ng import crc32 as ng_crc32

        return ng_crc32, "zlib_ng"
    except ImportError:
        pass
    try:
        from isal.isal_zlib import crc32 as isal_crc32

        return isal_crc32, "isal"
    except ImportError:
        pass
    return zlib.crc32, "zlib"


_crc32, CRC32_BACKEND = _fastest_crc32()


def crc32(data, value: int = 0) -> int:
    """CRC-32 (zlib's, as zip records use) of a bytes-like object or a contiguous CPU tensor, continuing
    from ``value``."""
    if isinstance(data, torch.Tensor):
        if data.dtype != torch.uint8 or data.dim() != 1:
            data = data.reshape(-1).view(torch.uint8)
        data = data.numpy() if data.numel() else b""
    return _crc32(data, value) & 0xFFFFFFFF
