"""Helpers for the Python-side agreements that remain: error codes for init_from_local_shards'
metadata exchange and content fingerprints of specs that shard themselves.

The data ops agree in C++ (see NOTE [ Agreed exchange ] in csrc/comm/exchange.cpp).
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

_ERROR_CLASSES: list[type[BaseException]] = [
    ValueError,
    TypeError,
    RuntimeError,
    NotImplementedError,
    IndexError,
    AttributeError,
    KeyError,
]


def _error_code(error: BaseException | None) -> int:
    if error is None:
        return 0
    for code, cls in enumerate(_ERROR_CLASSES, start=1):
        if isinstance(error, cls):
            return code
    return len(_ERROR_CLASSES) + 1


def _error_class(code: int) -> type[BaseException]:
    return _ERROR_CLASSES[code - 1] if 1 <= code <= len(_ERROR_CLASSES) else RuntimeError


def fingerprint(*parts: bytes | str | int | Sequence[int]) -> int:
    """A signed 64-bit digest, equal across processes for equal inputs (unlike ``hash``)."""
    digest = hashlib.blake2b(digest_size=8)
    for part in parts:
        if isinstance(part, bytes):
            digest.update(part)
        elif isinstance(part, str):
            digest.update(part.encode())
        elif isinstance(part, int):
            digest.update(part.to_bytes(16, "little", signed=True))
        else:
            digest.update(b"[" + b",".join(str(int(v)).encode() for v in part) + b"]")
        digest.update(b"|")
    return int.from_bytes(digest.digest(), "little", signed=True)
