"""ChunkShardingSpec: torch.chunk along one dim, one chunk per placement."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from .._support import _native
from .._support._tensor_metadata import ShardedTensorMetadata, TensorProperties
from .._support._torch_private import RemoteDevice
from ..metadata import ShardMetadata
from . import api
from .api import ShardingSpec

if TYPE_CHECKING:
    from .._support._native import LayoutArgs
    from .._support._placement import _PlacementResolver

__all__ = ["ChunkShardingSpec"]


@dataclass
class ChunkShardingSpec(ShardingSpec):
    """Splits a tensor along ``dim`` like ``torch.chunk`` into ``len(placements)`` chunks; chunk ``i``
    goes to ``placements[i]``.

    Every chunk but the trailing ones has ``ceil(size / len(placements))`` rows; once the dim runs out
    the remaining chunks are empty (and still get a metadata entry and a zero-size local tensor). A
    rank may appear several times (several local shards) or not at all (no local shard).

    Args:
        dim (int): the dim to shard; negative values count from the end. Named dims are not supported.
        placements (List[str | torch.distributed._remote_device]): e.g. ``"rank:0/cuda:0"`` or
            ``"rank:1/cpu"``. Strings are converted to ``RemoteDevice`` in place.
    """

    ShardingDim = int | str

    dim: ShardingDim
    placements: list[RemoteDevice | str]

    def __post_init__(self):
        self._verify_dim(self.dim)
        for i, placement in enumerate(self.placements):
            if not isinstance(placement, RemoteDevice):
                self.placements[i] = RemoteDevice(placement)

    @staticmethod
    def _verify_dim(dim) -> None:
        if isinstance(dim, str):
            raise NotImplementedError("ChunkShardingSpec does not support named dimension yet!")
        if not isinstance(dim, int) or isinstance(dim, bool):
            raise ValueError(f"Sharding dim needs to be an integer, found: {dim}")

    def build_metadata(
        self, tensor_sizes: torch.Size, tensor_properties: TensorProperties
    ) -> ShardedTensorMetadata:
        self._verify_dim(self.dim)
        # The N-D boxes come from C++ (which also raises "Invalid sharding dim" for a bad dim).
        offsets, sizes = _native.chunk_boxes(tensor_sizes, self.dim, len(self.placements))
        shards = [
            ShardMetadata(shard_offsets, shard_sizes, placement)
            for placement, shard_offsets, shard_sizes in zip(self.placements, offsets, sizes)
        ]
        return ShardedTensorMetadata(shards, tensor_sizes, tensor_properties)

    def _is_chunk_layout(self) -> bool:
        return type(self).build_metadata is ChunkShardingSpec.build_metadata

    def _layout_args(self, size, properties, resolve: _PlacementResolver | None) -> LayoutArgs:
        # The standard split travels as its dim and placements: C++ computes and checks the boxes.
        if self._is_chunk_layout():
            self._verify_dim(self.dim)
            return _native.layout_args_for_chunks(self.dim, self.placements, resolve)
        return super()._layout_args(size, properties, resolve)

    def shard(self, tensor: torch.Tensor, src_rank: int = 0, process_group=None) -> torch.Tensor:
        """Scatter ``tensor`` from group rank ``src_rank``: each rank receives only its own chunks.

        Collective over ``process_group`` (default group if None). Every rank passes a tensor of the
        same size and dtype; only ``src_rank``'s data is read.
        """
        return api._scatter(tensor, self, src_rank, process_group)
