"""Where a checked load's time goes: :attr:`ByteRangeFileSystemReader.timings`.

The reading and checking functions add what they spend to the :class:`LoadTimings` of the load in
progress on their thread (none while no load is recorded, e.g. in ``verify``): a clock read per piece
of at least a row, so the cost is nothing next to the work measured.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass


@dataclass
class LoadTimings:
    """Seconds one checked load spent, on this rank.

    Attributes:
        read_s: reading checkpoint bytes into the reader's own buffers (and parsing archives).
        check_s: hashing what was read (XXH3-64 or CRC-32) and comparing with what the checkpoint recorded, and
            unpickling bytes items.
        exchange_s: handing bytes read for other ranks over the process group (read-once loads).
        agree_s: the ranks' agreement on the outcome (NOTE [ Agreeing on a load's outcome ]).
        write_s: copying the checked buffers into the destinations.
        read_bytes: bytes this rank read from the checkpoint's data files (the load's reads of
            stored chunks; ``.metadata`` and ``.checksums`` are not counted), each byte once.
        reread_bytes: bytes read a second time after the agreement, straight into a destination (a
            whole chunk of 32 MiB or more, checked first: NOTE [ Whole chunks are checked, then read
            again into the destination ]), which the first read left in the page cache.
    """

    read_s: float = 0.0
    check_s: float = 0.0
    exchange_s: float = 0.0
    agree_s: float = 0.0
    write_s: float = 0.0
    read_bytes: int = 0
    reread_bytes: int = 0


_local = threading.local()


@contextmanager
def recording(timings: LoadTimings) -> Iterator[LoadTimings]:
    """Add what the reading functions spend on this thread to ``timings`` while the block runs."""
    previous = getattr(_local, "timings", None)
    _local.timings = timings
    try:
        yield timings
    finally:
        _local.timings = previous


def spent(field: str, since: float) -> float:
    """Add the time since ``since`` (a ``time.perf_counter()``) to ``field`` of the load being
    recorded; returns the clock now, the start of whatever comes next."""
    now = time.perf_counter()
    timings = getattr(_local, "timings", None)
    if timings is not None:
        setattr(timings, field, getattr(timings, field) + now - since)
    return now


def read_from_storage(nbytes: int) -> None:
    """Count ``nbytes`` read from a checkpoint data file into the load being recorded."""
    timings = getattr(_local, "timings", None)
    if timings is not None:
        if getattr(_local, "again", False):
            timings.reread_bytes += nbytes
        else:
            timings.read_bytes += nbytes


@contextmanager
def reading_again() -> Iterator[None]:
    """Count what is read while the block runs as read again (``reread_bytes``)."""
    previous = getattr(_local, "again", False)
    _local.again = True
    try:
        yield
    finally:
        _local.again = previous
