"""Agree before moving data: one tiny all-gather tells every rank every other rank's verdict.

A data op that raises on one rank while the others enter a collective hangs the group. So each data
op first exchanges a few int64s: whether this rank's arguments failed their local checks (and with
which exception class), plus values every rank must agree on (src rank, layout fingerprints, ...).
Then all ranks raise together, or all go ahead.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

import torch

from . import _C  # noqa: F401

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


def agree(
    process_group,
    device: torch.device,
    op: str,
    error: BaseException | None,
    values: Sequence[int] = (),
) -> list[list[int]]:
    """Exchange (error status, *values) with every rank of ``process_group``; raise on all ranks if
    any rank reported an error. Returns every rank's ``values`` (rank-major) for the caller to compare.

    The rank whose checks failed raises its own exception; the others raise the same exception class
    naming that rank.
    """
    row = [_error_code(error), *[int(v) for v in values]]
    flat = torch.ops.torch_shard._exchange_header(row, process_group.group_name, device)
    width = len(row)
    rows = [list(flat[r * width : (r + 1) * width]) for r in range(len(flat) // width)]
    if error is not None:
        raise error
    for rank, other in enumerate(rows):
        if other[0] != 0:
            raise _error_class(other[0])(
                f"{op}: rank {rank} of the process group rejected its arguments; every rank stops "
                f"here instead of waiting for it (see the error raised on rank {rank})"
            )
    return [other[1:] for other in rows]
