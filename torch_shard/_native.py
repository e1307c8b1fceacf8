"""Typed wrappers over the C++ layout ops (``torch.ops.torch_shard.*``).

The Python sharding classes hold data; the shape math they need runs in ``csrc/layout/`` through these
wrappers, which only convert Python objects to the flat integer lists the op schemas take.
"""

from __future__ import annotations

from array import array
from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch

from . import _C  # noqa: F401  (registers the ops)

if TYPE_CHECKING:
    from .metadata import ShardMetadata

_ops = torch.ops.torch_shard


def chunk_layout(dim_size: int, num_chunks: int) -> tuple[list[int], list[int]]:
    """Offsets and lengths along the sharded dim of ``num_chunks`` torch.chunk-style chunks.

    Trailing chunks are empty once ``dim_size`` runs out, and their offsets keep growing by the split
    size (upstream's ChunkShardingSpec reports them that way).
    """
    offsets, lengths = _ops.chunk_layout(int(dim_size), int(num_chunks))
    return list(offsets), list(lengths)


def _as_box_tensor(values: array, n: int, ndim: int) -> torch.Tensor:
    if n * ndim == 0:
        return torch.empty((n, ndim), dtype=torch.int64)
    # Zero-copy view of the array's buffer; the array stays alive through the tensor.
    return torch.frombuffer(values, dtype=torch.int64).view(n, ndim)


def shard_box_tensors(shards: Sequence[ShardMetadata]) -> tuple[torch.Tensor, torch.Tensor]:
    """(offsets, sizes) of ``shards`` as the (N, ndim) int64 tensors the ops take.

    The ints are read in one C pass (``_C.pack_boxes``): converting N * ndim Python ints one by one
    would cost more than the validation itself.
    """
    offsets_bytes, sizes_bytes, ndim, first_bad = _C.pack_boxes(shards)
    if first_bad >= 0:
        raise ValueError(f"Found inconsistent ranks for shards: {shards[0]} and {shards[first_bad]}")
    n = len(shards)
    return _as_box_tensor(array("q", offsets_bytes), n, ndim), _as_box_tensor(array("q", sizes_bytes), n, ndim)



def validate_shards(shards: Sequence[ShardMetadata], global_size: Sequence[int] | None = None) -> None:
    """Raise ValueError unless ``shards`` are disjoint (and, given ``global_size``, tile the tensor).

    Runs in C++: a tiling proof in O(N * 2^d) for valid layouts, and an O(N log N) sweep (for up to
    2-D tensors) to name the offending pair otherwise. Empty shards never overlap anything.
    """
    offsets, sizes = shard_box_tensors(shards)  # also rejects shards of different ranks
    if global_size is not None:
        global_size = [int(s) for s in global_size]
        ndim = len(shards[0].shard_sizes) if shards else len(global_size)
        if ndim != len(global_size):
            raise ValueError(f"Rank of tensor is {len(global_size)}, but shards rank is {ndim}")
    _ops.validate_shards(offsets, sizes, global_size)


def validate_boxes(offsets: torch.Tensor, sizes: torch.Tensor, global_size: Sequence[int] | None) -> None:
    """:func:`validate_shards` for boxes already held as (N, ndim) int64 tensors."""
    _ops.validate_shards(offsets, sizes, None if global_size is None else [int(s) for s in global_size])


def find_overlap(shards: Sequence[ShardMetadata]) -> tuple[int, int] | None:
    """Indices of two non-empty shards that overlap, or None."""
    offsets, sizes = shard_box_tensors(shards)
    pair = _ops._find_overlap(offsets, sizes)
    return (pair[0], pair[1]) if pair else None
