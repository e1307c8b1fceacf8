"""The hash ``.checksums`` records (NOTE [ Which hash .checksums records ]), and the zip CRC-32 beside it.

NOTE [ Which hash .checksums records ]
A checked load hashes every byte it hands to the model, so the hash sets how fast a load can be.
``.checksums`` records XXH3-64 (``xxhash``, a dependency): non-cryptographic, like the zip CRC-32
it replaces for checkpoints that have ``.checksums`` (neither resists a forger; both catch damaged,
stale, swapped or misplaced bytes, XXH3's 64 bits with a 2**-64 chance of a miss per hash against
CRC-32's 2**-32), and fast on any x86-64 CPU (SSE2/AVX2/AVX-512, dispatched at run time since xxhash
4.1), where a CRC-32 is fast only with carry-less multiply in wide vectors (VPCLMULQDQ) and
zlib-ng. Of the hashes ``bench/bench_hash.py`` compares (XXH3-64, zlib-ng and stdlib CRC-32, CRC32C,
XXH64), XXH3-64 is the fastest in the cache, from memory and over tiles, and it stays fast on CPUs
without VPCLMULQDQ, where zlib-ng's CRC-32 falls far behind (figures in docs/performance.md,
"Checkpoints"). XXH3-128 is as fast but doubles the table.

A check of a whole record with ``.checksums`` needs only this hash (the record's zip CRC-32 is not
computed too); a checkpoint without ``.checksums`` (plain DCP) is checked against its zip CRC-32s
(NOTE [ The checksums a DCP chunk already carries ]).
"""

from __future__ import annotations

import torch
import xxhash

from ._archive import crc32

# The .checksums algorithm: its name in the file, and the hex digits of one digest there.
ALGORITHM = "xxh3_64"
HEX_DIGITS = 16
# What a record is checked by without .checksums: its zip CRC-32 (Record.checked_by).
ZIP_CRC32 = "crc32"


def _buffer(data):
    """A bytes-like view of ``data`` (a bytes-like object or a contiguous CPU tensor), no copy."""
    if isinstance(data, torch.Tensor):
        if data.dtype != torch.uint8 or data.dim() != 1:
            data = data.reshape(-1).view(torch.uint8)
        return data.numpy() if data.numel() else b""
    return data


def digest(data) -> int:
    """The XXH3-64 of a bytes-like object or a contiguous CPU tensor's bytes."""
    return xxhash.xxh3_64_intdigest(_buffer(data))


# The XXH3-64 of a bytes-like object, without digest's look at its type (a tile check calls it per 64 KiB).
digest_bytes = xxhash.xxh3_64_intdigest


class _Crc32:
    """A running zip CRC-32 with the interface of an ``xxhash`` hasher."""

    def __init__(self):
        self.value = 0

    def update(self, data) -> None:
        self.value = crc32(data, self.value)

    def intdigest(self) -> int:
        return self.value


def hasher(algorithm: str = ALGORITHM):
    """A running hash (``update(bytes-like)``, ``intdigest()``) of ``algorithm``: :data:`ALGORITHM` or
    :data:`ZIP_CRC32`."""
    if algorithm == ALGORITHM:
        return xxhash.xxh3_64()
    if algorithm == ZIP_CRC32:
        return _Crc32()
    raise ValueError(f"unknown hash algorithm {algorithm!r}")
