"""Conversions between torch_shard's ShardedTensor and upstream's (``torch.distributed._shard``).

:func:`from_upstream` / :func:`to_upstream` rebuild one as the other over the same local tensors and
the same metadata: no copy, no communication.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from .._support import _native
from .._support._tensor_metadata import ShardedTensorMetadata, TensorProperties
from ..metadata import ShardMetadata
from ..sharded_tensor import Shard, ShardedTensor
from ..sharding_spec import ChunkShardingSpec, EnumerableShardingSpec
from ._common import Box, is_empty, require_sharded_tensor

__all__ = ["from_upstream", "to_upstream"]



def _upstream_modules():
    """Upstream's sharded_tensor, metadata and sharding_spec modules (torch_shard's own when
    ``torch_shard.compat`` aliases them)."""
    import importlib

    return (
        importlib.import_module("torch.distributed._shard.sharded_tensor"),
        importlib.import_module("torch.distributed._shard.metadata"),
        importlib.import_module("torch.distributed._shard.sharding_spec"),
    )


def _rebuild(st, target_cls, md_cls, meta_cls, props_cls, shard_cls, make_spec, box_of):
    """``target_cls._init_from_local_shards_and_global_metadata`` over ``st``'s local tensors, with each
    ShardMetadata rebuilt as ``md_cls`` (``box_of`` maps a shard's box) and the spec from
    ``make_spec(converted metadata list, whether any box moved)``."""
    converted: dict[int, object] = {}
    moved = False

    def convert(md):
        nonlocal moved
        out = converted.get(id(md))
        if out is None:
            offsets, sizes = box_of(md)
            moved = moved or offsets != list(md.shard_offsets)
            out = md_cls(offsets, sizes, md.placement)
            converted[id(md)] = out
        return out

    source = st.metadata()
    shards_md = [convert(md) for md in source.shards_metadata]
    props = source.tensor_properties
    metadata = meta_cls(
        shards_md,
        torch.Size(source.size),
        props_cls(
            dtype=props.dtype,
            layout=props.layout,
            requires_grad=props.requires_grad,
            memory_format=props.memory_format,
            pin_memory=props.pin_memory,
        ),
    )
    local = [shard_cls(s.tensor, convert(s.metadata)) for s in st.local_shards()]
    return target_cls._init_from_local_shards_and_global_metadata(
        local, metadata, process_group=st._process_group, sharding_spec=make_spec(shards_md, moved)
    )


def from_upstream(st) -> ShardedTensor:
    """torch_shard's ShardedTensor over the local tensors and metadata of upstream's
    (``torch.distributed._shard.sharded_tensor.ShardedTensor``), zero-copy.

    The local shards are the same tensor objects; offsets, sizes, placements, tensor properties, the
    process group and the sharding spec (chunk or enumerable; otherwise inferred) carry over. No
    communication.

    A torch_shard ShardedTensor is returned as is. In particular, when ``torch_shard.compat`` has made
    ``torch.distributed._shard`` an alias of torch_shard, "upstream" tensors are torch_shard's and this
    is the identity.

    Raises:
        TypeError: ``st`` is neither.
    """
    if isinstance(st, ShardedTensor):
        return st
    up_st, _, _ = _upstream_modules()
    if not isinstance(st, up_st.ShardedTensor):
        raise TypeError(
            f"torch_shard.interop.from_upstream: expected a torch.distributed._shard ShardedTensor, but got "
            f"{type(st).__module__}.{type(st).__qualname__}"
        )
    return _rebuild(
        st,
        ShardedTensor,
        ShardMetadata,
        ShardedTensorMetadata,
        TensorProperties,
        Shard,
        lambda shards_md, moved: _from_upstream_spec(st.sharding_spec(), shards_md),
        lambda md: (list(md.shard_offsets), list(md.shard_sizes)),
    )


def _from_upstream_spec(spec, shards_md):
    """torch_shard's version of upstream's spec: chunk specs map to chunk specs; anything else
    becomes the EnumerableShardingSpec of the layout (upstream keeps its metadata equal to its spec's
    layout, so that is the same layout)."""
    _, _, up_spec = _upstream_modules()
    if isinstance(spec, up_spec.ChunkShardingSpec):
        return ChunkShardingSpec(dim=spec.dim, placements=list(spec.placements))
    return EnumerableShardingSpec(list(shards_md))


def _upstream_box(md, size: Sequence[int]) -> Box:
    """``md``'s box as upstream's validation accepts it: an empty shard moves to the end of the dim it
    is empty in (upstream rejects empty shards past the end and flags those inside another shard's
    range as overlapping). Non-empty shards are unchanged."""
    offsets, sizes = list(md.shard_offsets), list(md.shard_sizes)
    if not is_empty(sizes):
        return offsets, sizes
    for d, (length, extent) in enumerate(zip(sizes, size)):
        if length > extent:
            raise ValueError(
                f"torch_shard.interop.to_upstream: the empty shard at offsets {offsets} with sizes {sizes} "
                f"is larger than the tensor ({list(size)}) along dim {d}; upstream cannot represent it"
            )
        offsets[d] = extent if length == 0 else min(offsets[d], extent - length)
    return offsets, sizes


def to_upstream(st: ShardedTensor):
    """Upstream's ShardedTensor (``torch.distributed._shard.sharded_tensor.ShardedTensor``) over the local
    tensors and metadata of torch_shard's, zero-copy.

    The local shards are the same tensor objects; sizes, placements, tensor properties, the process
    group and the offsets of every non-empty shard carry over; a ChunkShardingSpec stays one, any other
    spec becomes upstream's EnumerableShardingSpec of the layout (upstream builds its metadata from its
    spec, so this keeps the shard order). Empty shards move to the end of the dim they are empty in,
    because upstream rejects an empty shard that lies past the end of a dim (ChunkShardingSpec's
    trailing chunks of a short dim) or inside another shard's range; when one moves, the spec is the
    EnumerableShardingSpec of the moved layout. No communication.

    When ``torch_shard.compat`` has made ``torch.distributed._shard`` an alias of torch_shard,
    upstream's class IS torch_shard's and ``st`` is returned as is.

    Raises:
        TypeError: ``st`` is not a torch_shard ShardedTensor.
    """
    require_sharded_tensor(st, "to_upstream")
    up_st, up_md, up_spec = _upstream_modules()
    if up_st.ShardedTensor is ShardedTensor or issubclass(up_st.ShardedTensor, ShardedTensor):
        return st
    size = list(st.size())
    spec = st.sharding_spec()
    return _rebuild(
        st,
        up_st.ShardedTensor,
        up_md.ShardMetadata,
        up_st.ShardedTensorMetadata,
        up_st.TensorProperties,
        up_st.Shard,
        lambda shards_md, moved: (
            up_spec.ChunkShardingSpec(dim=spec.dim, placements=list(spec.placements))
            if _native.is_chunk_spec(spec) and not moved
            else up_spec.EnumerableShardingSpec(list(shards_md))
        ),
        lambda md: _upstream_box(md, size),
    )
