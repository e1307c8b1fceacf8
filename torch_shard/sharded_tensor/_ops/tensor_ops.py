"""Tensor methods on ShardedTensor that work shard by shard: detach, requires_grad_, *_like."""

from __future__ import annotations

import copy

import torch

from .. import _sharded_op_impl, empty, full, ones, rand, randn, zeros
from ..shard import Shard


@_sharded_op_impl(torch.Tensor.detach)
def sharded_detach(types, args=(), kwargs=None, pg=None):
    """A new ShardedTensor over detached local shards, with requires_grad cleared in its metadata."""
    st = args[0]
    local_shards = [Shard(shard.tensor.detach(), shard.metadata) for shard in st.local_shards()]
    metadata = copy.deepcopy(st.metadata())
    metadata.tensor_properties.requires_grad = False
    return st._with_local_shards(local_shards, metadata, st._init_rrefs)


@_sharded_op_impl(torch.Tensor.requires_grad_)
def sharded_requires_grad_(types, args=(), kwargs=None, pg=None):
    """Set requires_grad on every local shard, on the ShardedTensor itself and in its metadata."""
    kwargs = kwargs or {}
    st = args[0]
    requires_grad = args[1] if len(args) > 1 else kwargs.get("requires_grad", True)
    if requires_grad == st.requires_grad:
        return st
    for shard in st.local_shards():
        shard.tensor.requires_grad_(requires_grad)
    with torch._C.DisableTorchFunctionSubclass():
        st.requires_grad_(requires_grad)
    st.metadata().tensor_properties.requires_grad = requires_grad
    return st


def _register_like(like_op, creator) -> None:
    @_sharded_op_impl(like_op)
    def sharded_like(types, args=(), kwargs=None, pg=None):
        # Same spec, size and process group; like torch.*_like, dtype and layout default to the
        # input's (upstream falls back to the default dtype), and requires_grad to False.
        st = args[0]
        kwargs = dict(kwargs or {})
        if kwargs.pop("device", None) is not None:
            raise NotImplementedError(
                f"{like_op.__name__} on a ShardedTensor takes its devices from the sharding spec; "
                f"device= is not supported"
            )
        memory_format = kwargs.pop("memory_format", None)
        if memory_format not in (None, torch.preserve_format, torch.contiguous_format):
            raise ValueError("Only torch.contiguous_format memory_format is currently supported")
        if kwargs.get("dtype") is None:
            kwargs["dtype"] = st.dtype
        kwargs.setdefault("layout", st.layout)
        return creator(st.sharding_spec(), st.size(), *args[1:], process_group=pg, **kwargs)


for _like, _creator in (
    (torch.zeros_like, zeros),
    (torch.ones_like, ones),
    (torch.rand_like, rand),
    (torch.randn_like, randn),
    (torch.empty_like, empty),
    (torch.full_like, full),
):
    _register_like(_like, _creator)
