"""Prefetching what a rank will read under read-once: :func:`prefetch_ranges` says what, in the order it
is read, and :class:`Prefetcher` asks the kernel for it from a thread of its own, so the storage link
stays busy while the ranks exchange (NOTE [ Reading every stored byte once across the ranks ])."""

from __future__ import annotations

import math
import os
import threading

from .schedule import ReadOnce

# Prefetched ranges reach this far past a band's estimated bytes on either side (torch.save's records
# around the data: the estimate of where the data record starts is off by at most a few KiB).
_PREFETCH_MARGIN = 64 << 10


def prefetch_ranges(schedule: ReadOnce, me: int, storage_data: dict) -> list[tuple[str, int, int]]:
    """(file, offset, length) of what this rank will read, in the order it reads it: per round and
    chunk, the rows its units cover, where they cover those rows whole (else nothing: a part of the
    rows is read by tiles, and prefetching whole rows would read more than the load needs). The data
    record's place in the archive is estimated (torch.save writes it last but for a few small records
    and the zip directory), with a margin either side."""
    out = []
    for ids in schedule.rounds:
        for index, ids_of_chunk in schedule.read_by(ids, me).items():
            mine = [schedule.units[u] for u in ids_of_chunk]
            sizes, dtype = mine[0].chunk_sizes, mine[0].dtype
            if not sizes or not mine[0].lengths:
                continue
            lo = min(u.offsets[0] for u in mine)
            hi = max(u.offsets[0] + u.lengths[0] for u in mine)
            slice_bytes = math.prod(sizes[1:]) * dtype.itemsize
            if sum(math.prod(u.lengths) for u in mine) * dtype.itemsize < (hi - lo) * slice_bytes:
                continue
            info = storage_data[index]
            data_start = info.offset + info.length - math.prod(sizes) * dtype.itemsize - 4096
            start = max(info.offset, data_start + lo * slice_bytes - _PREFETCH_MARGIN)
            end = min(info.offset + info.length, data_start + hi * slice_bytes + _PREFETCH_MARGIN)
            if end > start:
                out.append((info.relative_path, start, end - start))
    return out


class Prefetcher:
    """Asks the kernel to read ``ranges`` into the page cache ahead of the load (``posix_fadvise``
    WILLNEED, from a thread of its own: on a network file system the call can wait for the reads it
    starts), so the storage link stays busy while the ranks exchange what they read (NOTE [ Reading
    every stored byte once across the ranks ]). Nothing is read into Python; ``stop`` ends it early."""

    def __init__(self, root, ranges: list[tuple[str, int, int]]):
        self._stop = threading.Event()
        self._thread = None
        if ranges and hasattr(os, "posix_fadvise"):
            self._thread = threading.Thread(target=self._run, args=(os.fspath(root), ranges), daemon=True,
                                            name="torch_shard-prefetch")
            self._thread.start()

    def _run(self, root: str, ranges) -> None:
        fds: dict[str, int] = {}
        try:
            for relative_path, offset, length in ranges:
                if self._stop.is_set():
                    return
                fd = fds.get(relative_path)
                if fd is None:
                    fd = fds[relative_path] = os.open(os.path.join(root, relative_path), os.O_RDONLY)
                os.posix_fadvise(fd, offset, length, os.POSIX_FADV_WILLNEED)
        except OSError:
            return  # only a hint: the load's own reads report what is wrong
        finally:
            for fd in fds.values():
                os.close(fd)

    def stop(self) -> None:
        self._stop.set()
