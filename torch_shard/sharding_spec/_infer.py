"""The spec a list of shards follows (upstream keeps this in ``sharding_spec/api.py``; here it sits above
both spec modules, which it needs, so they import neither each other nor it)."""

from __future__ import annotations

from .._support import _native
from ..metadata import ShardMetadata
from .api import EnumerableShardingSpec, ShardingSpec
from .chunk_sharding_spec import ChunkShardingSpec

__all__ = ["_infer_sharding_spec_from_shards_metadata"]


def _infer_sharding_spec_from_shards_metadata(shards_metadata: list[ShardMetadata]) -> ShardingSpec:
    """The spec a list of shards follows: a ChunkShardingSpec when the shards are exactly the
    torch.chunk layout along one dim (in some placement order), else an EnumerableShardingSpec.
    """
    chunk_spec = _as_chunk_spec(shards_metadata)
    if chunk_spec is not None:
        return chunk_spec
    return EnumerableShardingSpec(shards_metadata)


def _as_chunk_spec(shards: list[ShardMetadata]) -> ChunkShardingSpec | None:
    if not shards or any(s.placement is None for s in shards):
        return None
    ndim = len(shards[0].shard_sizes)
    if any(len(s.shard_sizes) != ndim for s in shards):
        return None
    # The sharded dim is the only dim where any shard has a non-zero offset.
    dims = {d for s in shards for d, off in enumerate(s.shard_offsets) if off != 0}
    if len(dims) != 1:
        return None
    (dim,) = dims
    # Every other dim must be whole and identical across shards.
    others = [d for d in range(ndim) if d != dim]
    first = shards[0]
    if any(s.shard_sizes[d] != first.shard_sizes[d] for s in shards for d in others):
        return None
    order = sorted(range(len(shards)), key=lambda i: shards[i].shard_offsets[dim])
    dim_size = sum(s.shard_sizes[dim] for s in shards)
    offsets, lengths = _native.chunk_layout(dim_size, len(shards))
    for pos, i in enumerate(order):
        if shards[i].shard_offsets[dim] != offsets[pos] or shards[i].shard_sizes[dim] != lengths[pos]:
            return None
    return ChunkShardingSpec(dim=dim, placements=[shards[i].placement for i in order])
