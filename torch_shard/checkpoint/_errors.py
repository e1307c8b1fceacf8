"""The one exception a corrupted checkpoint raises, and the record of one corrupted item."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Corruption:
    """One saved item whose bytes do not match their checksum.

    Attributes:
        fqn: the item's fully qualified name in the state dict (``"model.layer.weight"``).
        chunk_offsets: where the saved chunk starts in the tensor (None for non-tensor items).
        file: the checkpoint file holding it, relative to the checkpoint directory.
        offset: the byte offset in ``file`` of the record or block that failed.
        expected: the checksum the checkpoint recorded (None when there was nothing to compare).
        found: the checksum of the bytes read (None when they could not be read).
        what: which check failed ("record 'archive/data/0'", "block 3 of 16", ...).
        rank: the rank that read it (None for an offline verification).
    """

    fqn: str
    chunk_offsets: tuple[int, ...] | None
    file: str
    offset: int
    expected: int | None
    found: int | None
    what: str
    rank: int | None = None

    def describe(self) -> str:
        """One line naming the item, the place and the two checksums."""
        chunk = f" (chunk at {list(self.chunk_offsets)})" if self.chunk_offsets is not None else ""
        sums = ""
        if self.expected is not None or self.found is not None:
            sums = f": crc32 expected {_hex(self.expected)}, found {_hex(self.found)}"
        by = f", read by rank {self.rank}" if self.rank is not None else ""
        return f"'{self.fqn}'{chunk} in {self.file} at byte {self.offset}, {self.what}{sums}{by}"


def _hex(value: int | None) -> str:
    return "none" if value is None else f"0x{value:08x}"


class CheckpointCorruptionError(RuntimeError):
    """A checkpoint's bytes do not match their checksums.

    A load through :class:`ByteRangeFileSystemReader` raises it on every rank of the load (each rank
    lists what every rank found) before any destination tensor is written.

    Attributes:
        corruptions: every corrupted item found, on every rank.
    """

    def __init__(self, checkpoint: str, corruptions: list[Corruption]):
        self.checkpoint = checkpoint
        self.corruptions = list(corruptions)
        lines = "\n  ".join(c.describe() for c in self.corruptions)
        super().__init__(
            f"torch_shard.checkpoint: checkpoint '{checkpoint}' is corrupted, "
            f"{len(self.corruptions)} check(s) failed; nothing was loaded:\n  {lines}"
        )

    def __reduce__(self):
        # DCP gathers the exceptions of a failed load from every rank with pickle.
        return (type(self), (self.checkpoint, self.corruptions))
