"""Sharding specs, module for module like ``torch.distributed._shard.sharding_spec``."""

from ..metadata import ShardMetadata
from ._infer import _infer_sharding_spec_from_shards_metadata
from .api import (
    DevicePlacementSpec,
    EnumerableShardingSpec,
    PlacementSpec,
    ShardingSpec,
)
from .chunk_sharding_spec import ChunkShardingSpec

__all__ = [
    "ChunkShardingSpec",
    "DevicePlacementSpec",
    "EnumerableShardingSpec",
    "PlacementSpec",
    "ShardMetadata",
    "ShardingSpec",
    "_infer_sharding_spec_from_shards_metadata",
]
