"""Shard-layout helpers with upstream's names; the math runs in C++ (``csrc/layout/``)."""

from __future__ import annotations

from collections.abc import Sequence

from .._support import _native
from ..metadata import ShardMetadata

__all__ = [
    "check_tensor",
    "get_chunk_sharding_params",
    "get_chunked_dim_size",
    "get_split_size",
    "validate_non_overlapping_shards_metadata",
]


def _check_shard_metadata_pair_overlap(shard1: ShardMetadata, shard2: ShardMetadata) -> bool:
    """True if two shards share at least one element (empty shards share none)."""
    return _native.find_overlap([shard1, shard2]) is not None


def validate_non_overlapping_shards_metadata(shards: Sequence[ShardMetadata]) -> None:
    """Raise ValueError ("Shards ... overlap") if any two non-empty shards overlap.

    Unlike upstream, a zero-size shard never counts as overlapping, wherever its offsets point.
    """
    if not shards or len(shards) == 1:
        return
    _native.validate_shards(shards)


def check_tensor(shards_metadata: Sequence[ShardMetadata], tensor_dims: Sequence[int]) -> None:
    """Raise ValueError unless ``shards_metadata`` tile a tensor of size ``tensor_dims`` exactly.

    Checks, with upstream's messages: shard rank vs tensor rank, overlap, shards running past a tensor
    dim, and total shard volume vs tensor volume (gaps).
    """
    _native.validate_shards(shards_metadata, list(tensor_dims))


def get_split_size(dim_size: int, chunks: int) -> int:
    """Length of every chunk but the trailing ones when ``dim_size`` is split ``chunks`` ways."""
    _, lengths = _native.chunk_layout(dim_size, chunks)
    return lengths[0] if dim_size > 0 else 0


def get_chunked_dim_size(dim_size: int, split_size: int, idx: int) -> int:
    """Length of chunk ``idx`` when ``dim_size`` is cut into pieces of ``split_size``."""
    return _native.chunked_dim_size(dim_size, split_size, idx)


def get_chunk_sharding_params(sharding_dim_size: int, world_size: int, spec, rank: int) -> tuple[int, int]:
    """(start, length) along the sharded dim of the chunk that ``rank`` owns under ``spec``.

    Chunks are laid out in placement order; the result is for the first placement on ``rank``.
    """
    offsets, lengths = _native.chunk_layout(sharding_dim_size, len(spec.placements))
    start = 0
    for idx, placement in enumerate(spec.placements):
        if placement.rank() == rank:
            return start, lengths[idx]
        start += lengths[idx]
    raise ValueError(f"Rank {rank} owns no placement of {spec}")
