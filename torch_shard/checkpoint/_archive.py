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
import zipfile
import zlib
from collections.abc import Callable
from dataclasses import dataclass

import torch

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
    """An archive at ``base`` .. ``base + length`` of an open file, read with ``preadv`` (no read-ahead)."""

    def __init__(self, handle, base: int, length: int):
        super().__init__(length)
        self.handle, self.base = handle, base

    def read_into(self, buffer: memoryview, offset: int) -> None:
        if offset < 0 or offset + len(buffer) > self.length:
            raise OSError(f"read of {len(buffer)} bytes at {offset} is outside the saved chunk ({self.length} bytes)")
        _read_exact(self.handle, buffer, self.base + offset)

    def file_offset(self, offset: int) -> int:
        return self.base + offset

    def read_rows(self, buffer: memoryview, offset: int, stride: int, width: int, count: int) -> None:
        if count <= 0:
            return
        last = offset + (count - 1) * stride + width
        if offset < 0 or last > self.length:
            raise OSError(f"read of {count} rows up to byte {last} is outside the saved chunk ({self.length} bytes)")
        fileno = self.handle.fileno() if hasattr(os, "preadv") and hasattr(self.handle, "fileno") else None
        if fileno is None:
            super().read_rows(buffer, offset, stride, width, count)
            return
        # One system call per row, no Python frames between them (a column block of a 16 Ki-row chunk
        # is 16 Ki rows); a short read, rare on a regular file, finishes through _read_exact.
        pread, at = os.preadv, self.base + offset
        for i in range(count):
            row = buffer[i * width : (i + 1) * width]
            if pread(fileno, [row], at) != width:
                _read_exact(self.handle, row, at)
            at += stride


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
    """One zip record: where its bytes start in the archive, how many, and their recorded CRC-32."""

    name: str
    data_offset: int
    size: int
    crc: int

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
        loaded = torch.load(_SourceFile(source), map_location="meta", weights_only=True)
        if type(loaded) is torch.Tensor:
            meta = loaded
            at = getattr(meta.untyped_storage(), "_checkpoint_offset", None)
            data = next((r for r in records if r.data_offset == at), None)
        order = next((r for r in records if r.name.endswith("/byteorder")), None)
        if order is not None:
            little = source.read(order.data_offset, order.size) == b"little"
    return Archive(tuple(records), meta, data, little)


def _fastest_crc32() -> tuple[Callable, str]:
    """The fastest CRC-32 (zlib's polynomial, as zip records use) installed: zlib-ng's or ISA-L's (SIMD,
    several GB/s per core, and they let go of the GIL while hashing), else the standard library's
    zlib (about 1-2 GB/s). All give the same values."""
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
        data = data.reshape(-1).view(torch.uint8).numpy() if data.numel() else b""
    return _crc32(data, value) & 0xFFFFFFFF
