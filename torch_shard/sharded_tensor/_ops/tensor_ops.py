"""Tensor methods on ShardedTensor that work shard by shard: detach, requires_grad_, *_like."""

from __future__ import annotations

import copy

import torch

from ..._support import _torch_private as private
from .. import _sharded_op_impl, empty, full, ones, rand, randn, zeros
from .._converted import converted
from ..api import ShardedTensorBase
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
    with private.DisableTorchFunctionSubclass():
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


def _same_spec_new_tensor(st, local_tensors, metadata):
    """A ShardedTensor with ``st``'s layout, spec and group over new local tensors."""
    local_shards = [Shard(tensor, shard.metadata) for tensor, shard in zip(local_tensors, st.local_shards())]
    return st._with_local_shards(local_shards, metadata, st._init_rrefs)


@_sharded_op_impl(torch.Tensor.type_as)
def sharded_type_as(types, args=(), kwargs=None, pg=None):
    """Cast every local shard to the dtype of the given Tensor or ShardedTensor."""
    st = args[0]
    if len(args) < 2:
        raise ValueError("Needs to give a tensor to cast type as!")
    other = args[1]
    if not isinstance(other, torch.Tensor):
        raise ValueError("Needs to give a Tensor or ShardedTensor to cast type as!")
    if st.dtype == other.dtype:
        return st
    metadata = copy.deepcopy(st.metadata())
    metadata.tensor_properties.dtype = other.dtype
    pinned = metadata.tensor_properties.pin_memory
    tensors = [converted(s.tensor, dtype=other.dtype, pinned=pinned) for s in st.local_shards()]
    return _same_spec_new_tensor(st, tensors, metadata)


@_sharded_op_impl(torch.Tensor.clone)
def sharded_clone(types, args=(), kwargs=None, pg=None):
    """Clone every local shard (only ``torch.preserve_format``)."""
    kwargs = kwargs or {}
    st = args[0]
    memory_format = kwargs.get("memory_format", torch.preserve_format)
    if memory_format != torch.preserve_format:
        raise RuntimeError("Only support torch.preserve_format for ShardedTensor!")
    metadata = copy.deepcopy(st.metadata())
    pinned = metadata.tensor_properties.pin_memory
    # A clone of a pinned ShardedTensor keeps the promise (Tensor.clone() would hand back pageable memory).
    tensors = [converted(s.tensor, pinned=pinned, copy=True) for s in st.local_shards()]
    return _same_spec_new_tensor(st, tensors, metadata)


@_sharded_op_impl(torch.Tensor.copy_)
def sharded_copy_(types, args=(), kwargs=None, pg=None):
    """In-place copy between two ShardedTensors whose local shards pair up, shard by shard."""
    kwargs = kwargs or {}
    self_st, src = args[0], args[1]
    non_blocking = args[2] if len(args) > 2 else kwargs.get("non_blocking", False)
    # As upstream: the shards must pair up (same offsets, sizes and placement); dtype and
    # requires_grad may differ (copy_ converts, and copying into a parameter is the point).
    if (
        not isinstance(src, ShardedTensorBase)
        or len(self_st.local_shards()) != len(src.local_shards())
        or any(a.metadata != b.metadata for a, b in zip(self_st.local_shards(), src.local_shards()))
    ):
        raise RuntimeError("inplace copy can only happen between two ShardedTensor with same metadata!")
    with torch.no_grad():
        for dst_shard, src_shard in zip(self_st.local_shards(), src.local_shards()):
            dst_shard.tensor.copy_(src_shard.tensor, non_blocking)
    return self_st


@_sharded_op_impl(private.has_compatible_shallow_copy_type)
def sharded_has_compatible_shallow_copy_type(types, args=(), kwargs=None, pg=None):
    # Module._apply then replaces parameters instead of assigning `.data` into a ShardedTensor.
    return False


@_sharded_op_impl(torch.Tensor.data_ptr)
def sharded_data_ptr(types, args=(), kwargs=None, pg=None):
    """0: a ShardedTensor owns no storage (its data is its local shards), as for other tensor
    subclasses without storage (DCP's stager goes by this; NOTE [ Staging a ShardedTensor with DCP's
    default stager ])."""
    return 0


@_sharded_op_impl(torch.Tensor.new_empty)
def sharded_new_empty(types, args=(), kwargs=None, pg=None):
    """An uninitialised ShardedTensor with this one's layout, spec and group, optionally of another
    dtype or on another device (placements moved as ``.to`` moves them). Only the tensor's own size:
    another size has no layout to follow."""
    kwargs = dict(kwargs or {})
    st, size = args[0], args[1:]
    size = kwargs.pop("size", size[0] if len(size) == 1 and not isinstance(size[0], int) else size)
    if list(size) != list(st.size()):
        raise NotImplementedError(
            f"new_empty on a ShardedTensor makes a tensor of its own size {list(st.size())} (got {list(size)})"
        )
    dtype = kwargs.pop("dtype", None) or st.dtype
    device = kwargs.pop("device", None)
    requires_grad = kwargs.pop("requires_grad", False)
    layout = kwargs.pop("layout", None)
    if kwargs.pop("pin_memory", False) or layout not in (None, torch.strided) or kwargs:
        raise NotImplementedError(f"new_empty on a ShardedTensor: unsupported arguments {sorted(kwargs)}")
    if device is None:
        out = torch.empty_like(st, dtype=dtype)
    else:
        out = st._moved(torch.device(device), dtype, None, non_blocking=False, empty=True)
    return out.requires_grad_(requires_grad) if requires_grad else out
