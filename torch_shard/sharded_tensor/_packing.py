"""Compact encoding of shard metadata lists for the wire and for pickles.

N ShardMetadata objects become two int64 buffers (offsets, sizes), the distinct placement strings,
and one index per shard into them. Encoding and decoding cost O(N) with no per-shard Python objects
beyond the decoded ShardMetadata, and each distinct placement is parsed once. Only plain types
(bytes, str, int, tuples, lists) appear, so pickles stay loadable with ``weights_only=True``.
"""

from __future__ import annotations

from array import array

from torch.distributed.remote_device import _remote_device

from .. import _C
from ..metadata import ShardMetadata

PackedShards = tuple  # (count, ndim, offsets bytes, sizes bytes, placements, which bytes)


def pack_shards(shards: list[ShardMetadata]) -> PackedShards:
    offsets, sizes, ndim, first_bad, which, placements = _C.pack_layout(shards)
    if first_bad >= 0:
        raise ValueError(f"Found inconsistent ranks for shards: {shards[0]} and {shards[first_bad]}")
    names = ["" if p is None else str(p) for p in placements]
    return (len(shards), ndim, offsets, sizes, names, which)


def _new_shard_metadata(offsets: list[int], sizes: list[int], placement) -> ShardMetadata:
    # The values were validated when they were first built; skip __init__'s per-field checks.
    md = ShardMetadata.__new__(ShardMetadata)
    md.shard_offsets = offsets
    md.shard_sizes = sizes
    md.placement = placement
    return md


def unpack_shards(packed: PackedShards) -> list[ShardMetadata]:
    count, ndim, offsets_bytes, sizes_bytes, placements, which_bytes = packed
    offsets, sizes, which = array("q"), array("q"), array("q")
    offsets.frombytes(offsets_bytes)
    sizes.frombytes(sizes_bytes)
    which.frombytes(which_bytes)
    parsed = [None if p == "" else _remote_device(p) for p in placements]
    return [
        _new_shard_metadata(
            list(offsets[i * ndim : (i + 1) * ndim]), list(sizes[i * ndim : (i + 1) * ndim]), parsed[which[i]]
        )
        for i in range(count)
    ]
