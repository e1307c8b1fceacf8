"""Compact encoding of shard metadata lists for the wire and for pickles.

N shards (ShardMetadata objects, or the impl's layout) become two int64 buffers (offsets, sizes),
the distinct placement strings, and one index per shard into them; decoding gives back the int64
tensors the op schemas take, with no per-shard Python objects. Only plain types (bytes, str, int,
tuples, lists) appear, so pickles stay loadable with ``weights_only=True``.
"""

from __future__ import annotations

import torch

from .. import _C
from ..metadata import ShardMetadata
from . import _state

PackedShards = tuple  # (count, ndim, offsets bytes, sizes bytes, placements, which bytes)


def pack_shards(shards: list[ShardMetadata]) -> PackedShards:
    offsets, sizes, ndim, first_bad, which, placements = _C.pack_layout(shards)
    if first_bad >= 0:
        raise ValueError(f"Found inconsistent ranks for shards: {shards[0]} and {shards[first_bad]}")
    names = ["" if p is None else str(p) for p in placements]
    return (len(shards), ndim, offsets, sizes, names, which)


def pack_layout_of(st) -> PackedShards:
    """The layout of ``st``'s impl in the encoding of :func:`pack_shards`, read from the impl's buffers
    (no ShardMetadata objects)."""

    with _state._plain():
        offsets, sizes, index, names, _owners, _chunk_dim = torch.ops.torch_shard._layout(st)
    count, ndim = offsets.shape
    return (
        count,
        ndim,
        offsets.contiguous().numpy().tobytes(),
        sizes.contiguous().numpy().tobytes(),
        list(names),
        index.contiguous().numpy().tobytes(),
    )


def unpack_boxes(packed: PackedShards) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, list[str]]:
    """(offsets, sizes, placement index, distinct placement names) of a packed layout as the int64
    tensors the op schemas take, without building ShardMetadata objects."""
    count, ndim, offsets_bytes, sizes_bytes, placements, which_bytes = packed
    tensors = []
    for data, shape in ((offsets_bytes, (count, ndim)), (sizes_bytes, (count, ndim)), (which_bytes, (count,))):
        if len(data) != 8 * count * (ndim if len(shape) == 2 else 1):
            raise ValueError("corrupt packed shard layout: buffer sizes do not match the shard count")
        values = torch.frombuffer(bytearray(data), dtype=torch.int64) if data else torch.empty(0, dtype=torch.int64)
        tensors.append(values.view(shape))
    return tensors[0], tensors[1], tensors[2], list(placements)


