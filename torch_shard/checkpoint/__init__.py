"""Checkpoint helpers on top of ``torch.distributed.checkpoint`` (DCP); DCP's format, no other.

* :class:`ByteRangeFileSystemReader`: DCP's ``FileSystemReader`` reading only the bytes a rank needs,
  and checking every one of them, against what the writer recorded for this save where it can
  (:class:`CheckpointCorruptionError` otherwise, on every rank, nothing loaded).
* :class:`ChecksumFileSystemWriter`: DCP's ``FileSystemWriter`` that also records, in ``.checksums``,
  every item's data digest and tile digests (XXH3-64; partial reads are checked without reading whole
  chunks) and the SHA-256 of ``.metadata``; it stages ShardedTensors for ``dcp.async_save``.
* :func:`load`: ``dcp.load`` through the checking reader, raising :class:`CheckpointCorruptionError`
  or :class:`CheckpointLoadError` (``Exception`` subclasses) rather than DCP's ``BaseException``.
* :func:`verify_checkpoint` and ``python -m torch_shard.checkpoint verify DIR``: offline checks, the
  same a load makes.
"""

from __future__ import annotations

from typing import Any

from ._errors import CheckpointCorruptionError, CheckpointLoadError, Corruption
from ._reader import ByteRangeFileSystemReader
from ._staging import StagedShardedTensor, stage_state_dict
from ._timing import LoadTimings
from ._verify import VerifyReport, verify_checkpoint
from ._writer import ChecksumFileSystemWriter

__all__ = [
    "ByteRangeFileSystemReader",
    "CheckpointCorruptionError",
    "CheckpointLoadError",
    "ChecksumFileSystemWriter",
    "Corruption",
    "LoadTimings",
    "StagedShardedTensor",
    "VerifyReport",
    "load",
    "stage_state_dict",
    "verify_checkpoint",
]


def load(state_dict: dict[str, Any], checkpoint_id, *, process_group=None, planner=None, **reader_kwargs) -> None:
    """``dcp.load(state_dict, storage_reader=ByteRangeFileSystemReader(checkpoint_id))``, raising an
    ``Exception`` where ``dcp.load`` raises its ``CheckpointException`` (a ``BaseException``).

    Raises:
        CheckpointCorruptionError: the checkpoint is damaged (on every rank; every tensor of
            ``state_dict`` is as it was before the call).
        CheckpointLoadError: any other failure of the load, on every rank, chained to DCP's
            ``CheckpointException`` (its ``failures`` hold each rank's exception).
    """
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.api import CheckpointException

    reader = ByteRangeFileSystemReader(checkpoint_id, **reader_kwargs)
    try:
        dcp.load(state_dict, storage_reader=reader, process_group=process_group, planner=planner)
    except CheckpointException as e:
        failures = [f[0] if isinstance(f, tuple) else f for _, f in sorted(e.failures.items())]
        for kind in (CheckpointCorruptionError, CheckpointLoadError):
            ours = next((exc for exc in failures if isinstance(exc, kind)), None)
            if ours is not None:
                raise ours from e
        by_message: dict[str, list[int]] = {}
        for rank, exc in zip(sorted(e.failures), failures):
            by_message.setdefault(f"{type(exc).__name__}: {exc}", []).append(rank)
        summary = "; ".join(f"rank(s) {ranks}: {message}" for message, ranks in by_message.items())
        raise CheckpointLoadError(
            str(checkpoint_id), f"torch_shard.checkpoint: loading '{checkpoint_id}' failed: {summary}"
        ) from e
