"""The exceptions a checked load raises, and the record of one failed check.

Both exceptions are ``Exception`` subclasses, raised with the same message on every rank of the load
(``dcp.load`` wraps them in its ``CheckpointException``, a ``BaseException``;
:func:`torch_shard.checkpoint.load` raises them chained to it).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Corruption:
    """One failed check: a saved item, or a checkpoint file, that does not match what was recorded.

    Attributes:
        fqn: the item's fully qualified name in the state dict (``"model.layer.weight"``); None when
            the damage is in one of the checkpoint's own files (``.metadata``, ``.checksums``).
        chunk_offsets: where the saved chunk starts in the tensor (None for non-tensor items).
        file: the checkpoint file holding it, relative to the checkpoint directory.
        offset: the byte offset in ``file`` of the record or block that failed (None when no byte
            range is to blame: a missing file, a field of ``.metadata``).
        expected: the checksum the checkpoint recorded (None when there was nothing to compare).
        found: the checksum of the bytes read (None when they could not be read).
        what: which check failed ("record 'archive/data/0'", "block 3 of 16", ...).
        rank: the rank that read it (None for an offline verification).
    """

    fqn: str | None
    chunk_offsets: tuple[int, ...] | None
    file: str
    offset: int | None
    expected: int | None
    found: int | None
    what: str
    rank: int | None = None

    def describe(self) -> str:
        """One line naming the item (or file), the place and the two checksums."""
        sums = ""
        if self.expected is not None or self.found is not None:
            sums = f": checksum expected {_hex(self.expected)}, found {_hex(self.found)}"
        by = f", read by rank {self.rank}" if self.rank is not None else ""
        at = f" at byte {self.offset}" if self.offset is not None else ""
        if self.fqn is None:
            return f"{self.file}{at}: {self.what}{sums}{by}"
        chunk = f" (chunk at {list(self.chunk_offsets)})" if self.chunk_offsets is not None else ""
        return f"'{self.fqn}'{chunk} in {self.file}{at}, {self.what}{sums}{by}"


def _hex(value: int | None) -> str:
    return "none" if value is None else f"0x{value:08x}"


class CheckpointLoadError(RuntimeError):
    """A load through :class:`ByteRangeFileSystemReader` failed; no destination was changed.

    Raised on every rank of the load with the same message, which names each rank's failure.

    Attributes:
        checkpoint: the checkpoint directory.
    """

    def __init__(self, checkpoint: str, message: str):
        self.checkpoint = checkpoint
        super().__init__(message)

    def __reduce__(self):
        # DCP gathers the exceptions of a failed load from every rank with pickle.
        return (type(self), (self.checkpoint, str(self)))


class CheckpointCorruptionError(CheckpointLoadError):
    """A checkpoint's bytes (or its ``.metadata`` / ``.checksums``) do not match what was recorded.

    A load through :class:`ByteRangeFileSystemReader` raises it on every rank of the load (each rank
    lists what every rank found) before any destination tensor is written.

    Attributes:
        corruptions: every failed check, on every rank.
    """

    def __init__(self, checkpoint: str, corruptions: list[Corruption]):
        self.corruptions = list(corruptions)
        lines = "\n  ".join(c.describe() for c in self.corruptions)
        super().__init__(
            checkpoint,
            f"torch_shard.checkpoint: checkpoint '{checkpoint}' is corrupted, "
            f"{len(self.corruptions)} check(s) failed; nothing was loaded:\n  {lines}",
        )

    def __reduce__(self):
        return (type(self), (self.checkpoint, self.corruptions))
