"""ShardMetadata: where one shard of a sharded tensor lives (offsets, sizes, placement)."""

from __future__ import annotations

from dataclasses import dataclass
from functools import reduce

from ._support._torch_private import RemoteDevice


@dataclass
class ShardMetadata:
    """Metadata of one shard: its box inside the global tensor and where it is placed.

    Args:
        shard_offsets (List[int]): offset of the shard's first element along every dim.
        shard_sizes (List[int]): length of the shard along every dim (0 for an empty shard).
        placement (str | torch.distributed._remote_device, optional): where the shard lives, e.g.
            ``"rank:0/cuda:0"``, ``"rank:1/cpu"`` or ``"worker0/cuda:1"``. ``None`` is allowed for
            shards built without a placement.
    """

    __slots__ = ["shard_offsets", "shard_sizes", "placement"]

    shard_offsets: list[int]
    shard_sizes: list[int]
    placement: RemoteDevice | None

    def __init__(
        self,
        shard_offsets: list[int],
        shard_sizes: list[int],
        placement: str | RemoteDevice | None = None,
    ):
        self.shard_offsets = shard_offsets
        self.shard_sizes = shard_sizes
        self.placement = RemoteDevice(placement) if isinstance(placement, str) else placement
        if len(self.shard_offsets) != len(self.shard_sizes):
            raise ValueError(
                f"shard_offsets and shard_sizes should have the same number of elements, found "
                f"{len(self.shard_offsets)} and {self.shard_sizes} respectively"
            )
        for offset in self.shard_offsets:
            if offset < 0:
                raise ValueError("shard_offsets should be >=0")
        for size in self.shard_sizes:
            if size < 0:
                raise ValueError("shard_sizes should be >= 0")

    def __hash__(self) -> int:
        # Shards are used as dict keys (e.g. by gather); fold every field into one hash.
        def fold(acc: int, value: object) -> int:
            return (acc << 8) + hash(value)

        h = reduce(fold, self.shard_offsets, 37)
        h = reduce(fold, self.shard_sizes, h)
        return fold(h, self.placement)
