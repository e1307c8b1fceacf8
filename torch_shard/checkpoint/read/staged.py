"""A checked load's reads of this rank's own items (every item, unless read-once serves some):
:meth:`OwnReads.check` before the ranks agree, :meth:`OwnReads.write` after (NOTE [ Verified loads ],
``_reader.py``).

Before the agreement every item is read, checked and decoded chunk by chunk in storage order, into
buffers of the reader's own, or for a big whole chunk only hashed (a :class:`Deferred`, NOTE [ Whole
chunks are checked, then read again into the destination ]); bytes items are unpickled as DCP's
planner will unpickle them, so one that cannot be fails before any destination is written. After it
the destinations are written, the last read first (its bytes are the likeliest to be still in the
cache; the regions do not overlap).
"""

from __future__ import annotations

import io
import time

import torch
from torch.distributed.checkpoint.planner import LoadItemType, LoadPlanner, ReadItem

from .._errors import Corruption
from .._load_outcome import Outcome
from .._timing import spent
from .chunk import Deferred, destination, read_again
from .source import ChunkSource


class OwnReads:
    """This rank's own ``items`` of a checked load, read through ``chunks``: staged, then written.

    Attributes:
        staged: (item, value) per item read and checked: a tensor of the saved dtype, a
            :class:`Deferred` whole chunk, or a bytes item's ``BytesIO``.
    """

    def __init__(self, chunks: ChunkSource, items: list[ReadItem]):
        self.chunks = chunks
        self.items = items
        self.staged: list[tuple[ReadItem, object]] = []

    def check(self, outcome: Outcome) -> BaseException | None:
        """Read, check and decode the items (into ``staged``); what fails goes into ``outcome``.
        Returns the exception raised, if one was."""
        try:
            self._stage(outcome.corruptions)
        except Exception as e:  # noqa: BLE001 - reported to every rank, raised at the agreement
            outcome.error = outcome.error or f"{type(e).__name__}: {e}"
            return e
        return None

    def _stage(self, corruptions: list[Corruption]) -> None:
        per_chunk: dict[tuple[str, int], list[ReadItem]] = {}
        for item in self.items:
            info = self.chunks.storage_data[item.storage_index]
            per_chunk.setdefault((info.relative_path, info.offset), []).append(item)
        for _, chunk_items in sorted(per_chunk.items()):
            index = chunk_items[0].storage_index
            boxes = [(tuple(item.storage_offsets), tuple(item.lengths)) for item in chunk_items]
            if chunk_items[0].type == LoadItemType.BYTE_IO:
                data = self.chunks.read_bytes(index, boxes, chunk_items[0], corruptions)
                if data is not None:
                    _check_unpickles(data, index.fqn)
                    self.staged.extend((item, io.BytesIO(data)) for item in chunk_items)
                continue
            values = self.chunks.read_boxes(index, boxes, [True] * len(boxes), corruptions, item=chunk_items[0])
            self.staged.extend((item, value) for item, value in zip(chunk_items, values) if value is not None)

    def write(self, planner: LoadPlanner, changed: list[Corruption]) -> None:
        """Write every staged item into its destination, the last read first; a whole chunk is read
        again into it, and what changed on disk since its check goes into ``changed``."""
        clock = time.perf_counter()
        for item, value in reversed(self.staged):
            if isinstance(value, io.BytesIO):
                planner.load_bytes(item, value)
                continue
            target = destination(planner, item)
            if isinstance(value, Deferred):
                read_again(value, self.chunks.handle(value.relative_path), target, changed)
            else:
                target.copy_(value)
            planner.commit_tensor(item, target)
        spent("write_s", clock)


def _check_unpickles(data: bytes, fqn: str) -> None:
    """Unpickle a bytes item as DCP's planner will (``torch.load``, ``weights_only=False``), so an
    item that cannot be fails before any destination is written."""
    clock = time.perf_counter()
    try:
        torch.load(io.BytesIO(data), weights_only=False)
    except Exception as e:
        raise RuntimeError(f"bytes item '{fqn}' cannot be unpickled ({type(e).__name__}: {e})") from e
    finally:
        spent("check_s", clock)
