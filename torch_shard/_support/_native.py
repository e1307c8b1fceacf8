"""Typed wrappers over the C++ layout ops (``torch.ops.torch_shard.*``).

All shape math runs in ``csrc/layout/``; this module only converts Python objects to the compact
arguments the op schemas take. A layout crosses into C++ as one argument group (see
``csrc/ops/layout_args.h``)::

    chunk_dim, shard_offsets, shard_sizes, placement_index, placements, placement_owners

built by :func:`layout_args_for_spec` (which asks the spec), :func:`layout_args_for_chunks` or
:func:`layout_args_for_shards`. This module imports no spec and no ShardedTensor: it sits below both.
"""

from __future__ import annotations

from array import array
from collections.abc import Sequence
from typing import TYPE_CHECKING, NamedTuple

import torch

from .. import _C

if TYPE_CHECKING:
    from ..metadata import ShardMetadata
    from ._placement import _PlacementResolver

_ops = torch.ops.torch_shard


def chunk_layout(dim_size: int, num_chunks: int) -> tuple[list[int], list[int]]:
    """Offsets and lengths along the sharded dim of ``num_chunks`` torch.chunk-style chunks.

    Trailing chunks are empty once ``dim_size`` runs out, and their offsets keep growing by the split
    size (upstream's ChunkShardingSpec reports them that way).
    """
    offsets, lengths = _ops.chunk_layout(int(dim_size), int(num_chunks))
    return list(offsets), list(lengths)


def chunked_dim_size(dim_size: int, split_size: int, index: int) -> int:
    """Length of chunk ``index`` when ``dim_size`` is cut into pieces of ``split_size``."""
    return _ops.chunked_dim_size(int(dim_size), int(split_size), int(index))


def chunk_boxes(global_size: Sequence[int], dim: int, num_chunks: int) -> tuple[list[list[int]], list[list[int]]]:
    """Offsets and sizes of ChunkShardingSpec's N-D boxes (``dim`` may be negative).

    Raises ValueError "Invalid sharding dim: ..." for a dim outside ``[-ndim, ndim)``.
    """
    offsets, sizes = _ops.chunk_boxes([int(s) for s in global_size], int(dim), int(num_chunks))
    return offsets.tolist(), sizes.tolist()


def _as_box_tensor(values: array, n: int, ndim: int) -> torch.Tensor:
    if n * ndim == 0:
        return torch.empty((n, ndim), dtype=torch.int64)
    # Zero-copy view of the array's buffer; the array stays alive through the tensor.
    return torch.frombuffer(values, dtype=torch.int64).view(n, ndim)


class PackedShards(NamedTuple):
    """N shards as the ops take them: (N, ndim) int64 offsets and sizes, and their placements
    deduplicated (``placements``, the distinct placement objects, and ``index``, one int64 per shard)."""

    offsets: torch.Tensor
    sizes: torch.Tensor
    index: torch.Tensor
    placements: list


def pack_shards(shards: Sequence[ShardMetadata]) -> PackedShards:
    """Read ``shards`` in one C pass (``_C.pack_layout``): converting N * ndim Python ints one by one
    would cost more than validating the layout itself. Raises ValueError for shards of different ranks.
    """
    offsets, sizes, ndim, first_bad, index, placements = _C.pack_layout(shards)
    if first_bad >= 0:
        raise ValueError(f"Found inconsistent ranks for shards: {shards[0]} and {shards[first_bad]}")
    n = len(shards)
    index_tensor = torch.frombuffer(array("q", index), dtype=torch.int64) if n else torch.empty(0, dtype=torch.int64)
    return PackedShards(
        _as_box_tensor(array("q", offsets), n, ndim), _as_box_tensor(array("q", sizes), n, ndim), index_tensor, placements
    )


def shard_box_tensors(shards: Sequence[ShardMetadata]) -> tuple[torch.Tensor, torch.Tensor]:
    """(offsets, sizes) of ``shards`` as (N, ndim) int64 tensors (placements are not read)."""
    offsets, sizes, ndim, first_bad, _, _ = _C.pack_boxes(shards)
    if first_bad >= 0:
        raise ValueError(f"Found inconsistent ranks for shards: {shards[0]} and {shards[first_bad]}")
    n = len(shards)
    return _as_box_tensor(array("q", offsets), n, ndim), _as_box_tensor(array("q", sizes), n, ndim)


def validate_shards(shards: Sequence[ShardMetadata], global_size: Sequence[int] | None = None) -> None:
    """Raise ValueError unless ``shards`` are disjoint (and, given ``global_size``, tile the tensor).

    Runs in C++: an interval pass for layouts that vary along one dim, a tiling proof in O(N * 2^d)
    otherwise, and an O(N log N) sweep (for up to 2-D tensors) to name the offending pair. Empty shards
    never overlap anything; offsets, sizes and volumes that overflow int64 are rejected.

    The op reads the boxes' values, so it cannot be traced: it raises a RuntimeError for fake tensors
    (NOTE [ Ops that cannot be traced ] in csrc/ops/untraceable.h), like :func:`find_overlap` and
    :func:`layout_fingerprint`.
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


class LayoutArgs(NamedTuple):
    """The layout argument group of the op schemas."""

    chunk_dim: int | None
    shard_offsets: torch.Tensor | None
    shard_sizes: torch.Tensor | None
    placement_index: torch.Tensor | None
    placements: list[str]
    placement_owners: list[int]


def _placement_args(placements: Sequence, resolve: _PlacementResolver | None) -> tuple[list[str], list[int]]:
    """Names and owners (group ranks; global ranks without a group) of distinct placements."""
    names, owners = [], []
    for placement in placements:
        if placement is None:
            names.append("")
            owners.append(-1)
            continue
        names.append(str(placement))
        owners.append(resolve.owner(placement) if resolve is not None else _global_rank(placement))
    return names, owners


def _global_rank(placement) -> int:
    rank = placement.rank()
    return -1 if rank is None else rank


def layout_args_for_shards(shards: Sequence[ShardMetadata], resolve: _PlacementResolver | None) -> LayoutArgs:
    """The layout of an explicit shard list (EnumerableShardingSpec, ShardedTensorMetadata)."""
    packed = pack_shards(shards)
    names, owners = _placement_args(packed.placements, resolve)
    return LayoutArgs(None, packed.offsets, packed.sizes, packed.index, names, owners)


def layout_fingerprint(args: LayoutArgs, size: Sequence[int], dtype: torch.dtype) -> int:
    """The digest every rank must share for a tensor of ``size`` and ``dtype`` laid out by ``args``:
    the layout's own fingerprint in C++ (boxes, owners and device types; NOTE [ What ranks agree on
    about a placement ]) combined with the dtype, as the data ops agree on it."""
    return _ops._layout_fingerprint([int(s) for s in size], *args, dtype)


def is_chunk_spec(spec) -> bool:
    """A ChunkShardingSpec whose layout is the standard chunk split (not overridden by a subclass):
    the spec says so itself (``ShardingSpec._is_chunk_layout``); anything else is not one."""
    check = getattr(spec, "_is_chunk_layout", None)
    return bool(check()) if callable(check) else False


def layout_args_for_spec(spec, size: Sequence[int], properties, resolve: _PlacementResolver | None) -> LayoutArgs:
    """The layout ``spec`` gives a tensor of ``size``, as the spec hands it to C++
    (``ShardingSpec._layout_args``: a ChunkShardingSpec as its dim and placements, an
    EnumerableShardingSpec as its shard list, any other spec through its ``build_metadata``).
    ``properties`` (the TensorProperties, or a callable returning them) is only needed for that last
    case."""
    method = getattr(spec, "_layout_args", None)
    if method is not None:
        return method(size, properties, resolve)
    return layout_args_for_metadata_of(spec, size, properties, resolve)


def layout_args_for_metadata_of(spec, size: Sequence[int], properties, resolve: _PlacementResolver | None) -> LayoutArgs:
    """The layout of the metadata ``spec.build_metadata`` gives a tensor of ``size`` (any spec)."""
    if callable(properties):
        properties = properties()
    return layout_args_for_shards(spec.build_metadata(torch.Size(size), properties).shards_metadata, resolve)


def layout_args_for_chunks(dim: int, placements: Sequence, resolve: _PlacementResolver | None) -> LayoutArgs:
    """The layout of the standard chunk split along ``dim`` over ``placements`` (C++ computes the boxes)."""
    names, owners = _placement_args(placements, resolve)
    return LayoutArgs(dim, None, None, None, names, owners)
