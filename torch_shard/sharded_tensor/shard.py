"""Shard: one local piece of a ShardedTensor, a dense tensor plus its metadata."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .._support._torch_private import RemoteDevice
from ..metadata import ShardMetadata
from ._shard_checks import DEVICE, SIZE, shard_mismatch

__all__ = ["Shard"]


@dataclass
class Shard:
    """A dense tensor holding one shard of a ShardedTensor, and that shard's metadata.

    Args:
        tensor (torch.Tensor): the shard's data; its size must equal ``metadata.shard_sizes``.
        metadata (ShardMetadata): where the shard sits in the global tensor and where it is placed;
            when it has a placement, that placement's device must be ``tensor.device``.
    """

    __slots__ = ["tensor", "metadata"]
    tensor: torch.Tensor
    metadata: ShardMetadata

    def __post_init__(self):
        placement = self.metadata.placement
        device = placement.device() if placement is not None else None
        found = shard_mismatch(self.tensor, self.metadata.shard_sizes, device)
        if found == SIZE:
            raise ValueError(
                "Shard tensor size does not match with metadata.shard_lengths! "
                f"Found shard tensor size: {list(self.tensor.size())}, "
                f"metadata.shard_lengths: {self.metadata.shard_sizes}, "
            )
        if found == DEVICE:
            raise ValueError(
                "Local shard tensor device does not match with local Shard's placement! "
                f"Found local shard tensor device: {self.tensor.device}, "
                f"local shard metadata placement device: {device}"
            )

    @classmethod
    def from_tensor_and_offsets(cls, tensor: torch.Tensor, shard_offsets: list[int], rank: int) -> Shard:
        """A Shard of ``tensor`` at ``shard_offsets``, placed on ``rank`` and ``tensor``'s device."""
        placement = RemoteDevice(f"rank:{rank}/{tensor.device}")
        metadata = ShardMetadata(
            shard_offsets=shard_offsets, shard_sizes=list(tensor.size()), placement=placement
        )
        return cls(tensor, metadata)
