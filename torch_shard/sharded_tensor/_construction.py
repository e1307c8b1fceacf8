"""Building ShardedTensors: from a spec and a size, from local shards, from a local tensor.

Every path ends in :func:`build`, which hands the layout and this rank's shard tensors to the C++
``_make_sharded`` op (one call) and wraps the impl it returns. Nothing is copied: the impl holds the
very tensors it is given.
"""

from __future__ import annotations

import collections.abc
import contextlib
import gc

import torch
import torch.distributed as dist

from .._support import _native
from .._support import _torch_private as private
from .._support._placement import _PlacementResolver
from .._support._tensor_metadata import ShardedTensorMetadata, TensorProperties
from ..metadata import ShardMetadata
from ..sharding_spec import ShardingSpec
from . import _state
from ._shard_checks import CONTIGUITY, DEVICE, DTYPE, LAYOUT, PIN_MEMORY, REQUIRES_GRAD, SIZE, first_mismatch
from .shard import Shard

_ops = torch.ops.torch_shard


@contextlib.contextmanager
def no_automatic_gc():
    """No automatic cyclic garbage collection inside the block (a collection still runs later, when
    the allocation counters next call for one).

    Building many ShardedTensors at once allocates several Python objects per tensor (the tensor, its
    cached views, the bound shards), so the collector's thresholds trip again and again, and each
    older-generation pass walks the whole heap (every object torch and the model hold): the passes,
    not the construction, then take most of the time. Nothing is lost: cyclic garbage made inside the
    block is collected by a later pass.
    """
    if not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


def _flatten_tensor_size(size) -> torch.Size:
    """torch.Size from ``(10, 20)``, ``((10, 20),)`` or ``([10, 20],)``; TypeError for non-ints."""
    if len(size) == 1 and isinstance(size[0], collections.abc.Sequence):
        dims = list(size[0])
    else:
        dims = list(size)
    for dim in dims:
        if not isinstance(dim, int):
            raise TypeError(f"size has to be a sequence of ints, found: {dims}")
    return torch.Size(dims)


def _create_tensor_from_params(*size, local_device, tensor_properties: TensorProperties):
    """An uninitialised dense tensor of ``size`` with ``tensor_properties`` on ``local_device``."""
    return torch.empty(
        *size,
        dtype=tensor_properties.dtype,
        layout=tensor_properties.layout,
        device=local_device,
        requires_grad=tensor_properties.requires_grad,
        memory_format=tensor_properties.memory_format,
        pin_memory=tensor_properties.pin_memory,
    )


def group_of(process_group):
    """``process_group``, or the default group when None."""
    return process_group if process_group is not None else private.default_group()


def _group_args(process_group) -> tuple[str, int, int]:
    """(name, this rank, size) of the group, or ("", -1, -1) without one (or outside it)."""
    if process_group is None or private.rank_not_in_group(process_group):
        return "", -1, -1
    return process_group.group_name, dist.get_rank(process_group), dist.get_world_size(process_group)


def _match_local_indices(local_shards: list[Shard], shards_metadata: list[ShardMetadata]) -> list[int]:
    """Index into ``shards_metadata`` of each local shard, matched by offsets and sizes (in order when
    several entries share a box, as empty shards may)."""
    by_box: dict[tuple, list[int]] = {}
    for idx, md in enumerate(shards_metadata):
        by_box.setdefault((tuple(md.shard_offsets), tuple(md.shard_sizes)), []).append(idx)
    indices = []
    for shard in local_shards:
        md = shard.metadata
        candidates = by_box.get((tuple(md.shard_offsets), tuple(md.shard_sizes)))
        if not candidates:
            raise ValueError(f"Local shard {md} is not one of the shards in the global metadata")
        indices.append(candidates.pop(0))
    return indices


def build(
    cls,
    local_shards: list[Shard],
    local_indices: list[int] | None,
    metadata: ShardedTensorMetadata | None,
    sharding_spec: ShardingSpec | None,
    process_group,
    *,
    layout_args: _native.LayoutArgs | None = None,
    validate: bool = True,
    size: torch.Size | None = None,
    properties: TensorProperties | None = None,
):
    """Make the C++ impl from the layout in ``metadata`` and this rank's ``local_shards`` (at
    ``local_indices`` of the metadata, matched by box when None), wrap it as ``cls``, and seed the
    Python views with what is already at hand. ``validate=False`` skips the layout validation the
    caller already did. ``metadata`` may be None when ``layout_args``, ``local_indices``, ``size`` and
    ``properties`` are given; metadata() then builds it from the impl when first asked."""
    group_name, rank, world = _group_args(process_group)
    if metadata is not None:
        size, properties = metadata.size, metadata.tensor_properties
        if layout_args is None:
            resolve = _PlacementResolver(process_group) if group_name else None
            layout_args = _native.layout_args_for_shards(metadata.shards_metadata, resolve)
        if local_indices is None:
            local_indices = _match_local_indices(local_shards, metadata.shards_metadata)
    if layout_args is None or local_indices is None or size is None or properties is None:
        raise TypeError("build: without metadata, layout_args, local_indices, size and properties are needed")
    raw = _ops._make_sharded(
        [shard.tensor for shard in local_shards],
        local_indices,
        list(size),
        *layout_args,
        properties.dtype,
        None if local_shards or group_name else torch.device("cpu"),
        properties.pin_memory,
        group_name,
        rank,
        world,
        validate,
    )
    obj = private.make_subclass(cls, raw, properties.requires_grad)
    obj._init_python_state(process_group)
    _state.seed(obj, metadata, local_shards, local_indices)
    _state.set_spec(obj, sharding_spec)
    return obj


def new_sharded_tensor(
    cls,
    sharding_spec: ShardingSpec,
    size,
    *,
    dtype,
    layout,
    requires_grad,
    pin_memory,
    memory_format,
    process_group,
    init_rrefs,
):
    """``ShardedTensor(spec, *size, ...)``: allocate this rank's shards of the layout ``spec`` gives."""
    if not isinstance(sharding_spec, ShardingSpec):
        raise ValueError(f"Expecting ShardingSpec but got: {type(sharding_spec)}")
    sizes = _flatten_tensor_size(size)
    properties = TensorProperties(
        dtype=dtype if dtype is not None else torch.get_default_dtype(),
        layout=layout,
        requires_grad=requires_grad,
        memory_format=memory_format,
        pin_memory=pin_memory,
    )
    # Spec errors ("Invalid sharding dim") come first, as upstream.
    metadata = sharding_spec.build_metadata(sizes, properties)
    if layout != torch.strided:
        raise ValueError("Only torch.strided layout is currently supported")
    if memory_format != torch.contiguous_format:
        raise ValueError("Only torch.contiguous_format memory_format is currently supported")

    process_group = group_of(process_group)
    resolve = _PlacementResolver(process_group)
    my_rank = dist.get_rank()
    local_shards: list[Shard] = []
    local_indices: list[int] = []
    for idx, shard_md in enumerate(metadata.shards_metadata):
        rank, device = resolve(shard_md.placement)
        if rank == my_rank:
            tensor = _create_tensor_from_params(*shard_md.shard_sizes, local_device=device, tensor_properties=properties)
            local_shards.append(Shard(tensor=tensor, metadata=shard_md))
            local_indices.append(idx)
    # The layout is valid by construction of the spec's metadata (build_metadata checks it). A chunk
    # spec crosses to C++ as its dim and placements; any other as the metadata it built.
    layout_args = None
    if _native.is_chunk_spec(sharding_spec):
        layout_args = _native.layout_args_for_spec(sharding_spec, sizes, properties, resolve)
    st = build(
        cls, local_shards, local_indices, metadata, sharding_spec, process_group, layout_args=layout_args, validate=False
    )
    st._post_init(init_rrefs)
    return st


def _raise_incompatible(shard: Shard, code: int, properties: TensorProperties) -> None:
    """The error _init_from_local_shards_and_global_metadata documents for ``shard``'s mismatch
    ``code`` (from first_mismatch)."""
    md, tensor = shard.metadata, shard.tensor
    rank = md.placement.rank()
    if code == CONTIGUITY:
        raise ValueError("Only torch.contiguous_format memory_format is currently supported")
    expected, actual, name, is_property = {
        LAYOUT: (properties.layout, tensor.layout, "layout", True),
        SIZE: (md.shard_sizes, list(tensor.size()), "size", False),
        DEVICE: (md.placement.device(), tensor.device, "device", False),
        DTYPE: (properties.dtype, tensor.dtype, "dtype", True),
        PIN_MEMORY: (properties.pin_memory, tensor.is_pinned(), "pin_memory", True),
        REQUIRES_GRAD: (properties.requires_grad, tensor.requires_grad, "requires_grad", True),
    }[code]
    against = "tensor property" if is_property else "local ShardMetadata"
    raise ValueError(
        f"Local shards' tensor {name} property is incompatible with {against} on rank {rank}: "
        f"{against} {name}={expected}, local shard tensor {name}={actual}."
    )


def from_local_shards_and_global_metadata(
    cls,
    local_shards: list[Shard],
    sharded_tensor_metadata: ShardedTensorMetadata,
    process_group,
    init_rrefs: bool,
    sharding_spec,
):
    """ShardedTensor from this rank's shards and the complete global metadata, with no communication:
    every local shard is checked against the metadata, and the layout against the global size."""
    pg = group_of(process_group)
    current_rank = dist.get_rank()
    shards_metadata = sharded_tensor_metadata.shards_metadata
    properties = sharded_tensor_metadata.tensor_properties
    resolve = _PlacementResolver(pg)
    local_count = sum(1 for md in shards_metadata if resolve(md.placement)[0] == current_rank)
    if len(local_shards) != local_count:
        raise RuntimeError(
            f"Number of local shards ({len(local_shards)}) does not match number of local shards "
            f"metadata in sharded_tensor_metadata ({local_count}) on rank ({current_rank}) "
        )
    if len(shards_metadata) == 0:
        raise ValueError("shards_metadata must not be empty!")
    if properties.layout != torch.strided:
        raise ValueError("Only torch.strided layout is currently supported")
    if any(shard.metadata.placement is None for shard in local_shards):
        raise AssertionError("Must specify placement for `Shard`!")
    found = first_mismatch(
        [shard.tensor for shard in local_shards],
        [shard.metadata.shard_sizes for shard in local_shards],
        [shard.metadata.placement.device() for shard in local_shards],
        dtype=properties.dtype,
        pin_memory=properties.pin_memory,
        requires_grad=properties.requires_grad,
        strided_contiguous=True,
    )
    if found is not None:
        _raise_incompatible(local_shards[found[0]], found[1], properties)
    st = build(cls, local_shards, None, sharded_tensor_metadata, sharding_spec, pg)
    st._post_init(init_rrefs)
    return st


def from_local_tensor(cls, local_tensor: torch.Tensor, sharding_spec, global_size, process_group, init_rrefs: bool):
    """This rank's ``local_tensor`` as its shard(s) of a tensor of ``global_size`` sharded by
    ``sharding_spec`` (no communication unless ``init_rrefs``)."""
    if not local_tensor.is_contiguous():
        raise ValueError("local_tensor is not a contiguous Tensor.")
    sizes = _flatten_tensor_size(global_size)
    properties = TensorProperties.create_from_tensor(local_tensor)
    metadata = sharding_spec.build_metadata(sizes, properties)
    pg = group_of(process_group)
    resolve = _PlacementResolver(pg)
    current_rank = dist.get_rank()
    local_shards = [
        Shard(tensor=local_tensor, metadata=md)
        for md in metadata.shards_metadata
        if resolve(md.placement)[0] == current_rank
    ]
    return from_local_shards_and_global_metadata(cls, local_shards, metadata, pg, init_rrefs, sharding_spec)
