"""Checkpoint helpers on top of ``torch.distributed.checkpoint`` (DCP); DCP's format, no other.

* :class:`ByteRangeFileSystemReader`: DCP's ``FileSystemReader`` reading only the bytes a rank needs,
  and checking every one of them against a CRC-32 (:class:`CheckpointCorruptionError` otherwise, on
  every rank, nothing loaded).
* :class:`ChecksumFileSystemWriter`: DCP's ``FileSystemWriter`` that also records block CRC-32s, so
  partial reads are checked without reading whole chunks; it stages ShardedTensors for
  ``dcp.async_save``.
* :func:`load`: ``dcp.load`` through the checking reader, raising :class:`CheckpointCorruptionError`
  itself rather than DCP's wrapper.
* :func:`verify_checkpoint` and ``python -m torch_shard.checkpoint verify DIR``: offline checks.
"""

from __future__ import annotations

from typing import Any

from ._errors import CheckpointCorruptionError, Corruption
from ._reader import ByteRangeFileSystemReader
from ._staging import StagedShardedTensor, stage_state_dict
from ._verify import VerifyReport, verify_checkpoint
from ._writer import ChecksumFileSystemWriter

__all__ = [
    "ByteRangeFileSystemReader",
    "CheckpointCorruptionError",
    "ChecksumFileSystemWriter",
    "Corruption",
    "StagedShardedTensor",
    "VerifyReport",
    "load",
    "stage_state_dict",
    "verify_checkpoint",
]


def load(state_dict: dict[str, Any], checkpoint_id, *, process_group=None, planner=None, **reader_kwargs) -> None:
    """``dcp.load(state_dict, storage_reader=ByteRangeFileSystemReader(checkpoint_id))``.

    A corrupted checkpoint raises :class:`CheckpointCorruptionError` on every rank (``dcp.load``
    itself raises its ``CheckpointException`` holding one per rank); every tensor of ``state_dict``
    is then as it was before the call.
    """
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.api import CheckpointException

    reader = ByteRangeFileSystemReader(checkpoint_id, **reader_kwargs)
    try:
        dcp.load(state_dict, storage_reader=reader, process_group=process_group, planner=planner)
    except CheckpointException as e:
        for failure in e.failures.values():
            exc = failure[0] if isinstance(failure, tuple) else failure
            if isinstance(exc, CheckpointCorruptionError):
                raise exc from e
        raise
