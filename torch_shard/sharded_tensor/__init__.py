"""ShardedTensor and its constructors, module for module like ``torch.distributed._shard.sharded_tensor``."""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence

import torch

from .._support._tensor_metadata import MEM_FORMAT_ENCODING, ShardedTensorMetadata, TensorProperties
from ..metadata import ShardMetadata
from ..op_registry_utils import _decorator_func
from ..sharding_spec import ChunkShardingSpec, EnumerableShardingSpec, ShardingSpec
from .api import (
    _CUSTOM_SHARDED_OPS,
    _SHARDED_OPS,
    ProcessGroupState,
    ShardedTensor,
    ShardedTensorBase,
    _flatten_tensor_size,
    _rebuild_sharded_tensor,
)
from .shard import Shard

__all__ = [
    "Shard",
    "ShardMetadata",
    "ShardedTensor",
    "ShardedTensorBase",
    "ShardedTensorMetadata",
    "TensorProperties",
    "custom_sharded_op_impl",
    "empty",
    "init_from_local_shards",
    "init_from_local_shards_many",
    "pre_load_state_dict_hook",
    "state_dict_hook",
    "full",
    "ones",
    "rand",
    "randn",
    "zeros",
]


def _size_from(size_args: tuple, size_kwarg) -> torch.Size:
    if size_kwarg is not None:
        if size_args:
            raise TypeError("size given both positionally and as size=")
        size_args = (size_kwarg,)
    return _flatten_tensor_size(size_args)


def empty(
    sharding_spec: ShardingSpec,
    *dims,
    size=None,
    dtype: torch.dtype | None = None, layout: torch.layout = torch.strided, requires_grad: bool = False,
    pin_memory: bool = False, memory_format: torch.memory_format = torch.contiguous_format,
    process_group=None, init_rrefs: bool = False,
) -> ShardedTensor:
    """A ShardedTensor with uninitialised data.

    Args:
        sharding_spec (ShardingSpec): how to shard the tensor (e.g. a ChunkShardingSpec).
        *dims (int...): the global size: ``empty(spec, 10, 20)``, ``empty(spec, (10, 20))``,
            ``empty(spec, [10, 20])`` or ``empty(spec, size=(10, 20))``.

    Keyword args:
        dtype (torch.dtype, optional): defaults to ``torch.get_default_dtype()``.
        layout (torch.layout): only ``torch.strided`` is supported.
        requires_grad (bool): whether autograd records operations on the result.
        pin_memory (bool): pinned CPU shards (needs an accelerator).
        memory_format (torch.memory_format): only ``torch.contiguous_format`` is supported.
        process_group (ProcessGroup, optional): defaults to the default group.
        init_rrefs (bool): build RRefs to remote shards over RPC (collective).

    Returns:
        ShardedTensor: each rank holds the shards placed on it.

    Raises:
        TypeError: a size element is not an int.
        ValueError: invalid sharding dim, placement rank outside ``process_group``, non-strided layout
            or non-contiguous memory format.
    """
    return ShardedTensor(
        sharding_spec, *_size_from(dims, size),
        dtype=dtype, layout=layout, requires_grad=requires_grad, pin_memory=pin_memory, memory_format=memory_format,
        process_group=process_group, init_rrefs=init_rrefs,
    )


def full(
    sharding_spec: ShardingSpec,
    size,
    fill_value,
    *,
    dtype: torch.dtype | None = None, layout: torch.layout = torch.strided, requires_grad: bool = False,
    pin_memory: bool = False, memory_format: torch.memory_format = torch.contiguous_format,
    process_group=None, init_rrefs: bool = False,
) -> ShardedTensor:
    """A ShardedTensor of ``size`` filled with ``fill_value`` (``size`` is one list/tuple/torch.Size).

    As upstream, ``dtype=None`` means ``torch.get_default_dtype()`` whatever the fill value's type.
    Other arguments as in :func:`empty`.
    """
    st = empty(
        sharding_spec, size,
        dtype=dtype, layout=layout, requires_grad=requires_grad, pin_memory=pin_memory, memory_format=memory_format,
        process_group=process_group, init_rrefs=init_rrefs,
    )
    torch.nn.init.constant_(st, fill_value)
    return st


def ones(sharding_spec: ShardingSpec, *dims, size=None, **kwargs) -> ShardedTensor:
    """A ShardedTensor filled with 1. Arguments as in :func:`empty`."""
    return full(sharding_spec, _size_from(dims, size), 1, **kwargs)


def zeros(sharding_spec: ShardingSpec, *dims, size=None, **kwargs) -> ShardedTensor:
    """A ShardedTensor filled with 0. Arguments as in :func:`empty`."""
    return full(sharding_spec, _size_from(dims, size), 0, **kwargs)


def rand(sharding_spec: ShardingSpec, *dims, size=None, **kwargs) -> ShardedTensor:
    """A ShardedTensor filled from U[0, 1).

    Each rank fills its shards from its own RNG stream, in shard order: after the same
    ``torch.manual_seed`` a rank's shard equals ``torch.rand`` of that shard's size (upstream's
    semantics; the result is not a slice of one global random tensor). Arguments as in :func:`empty`.
    """
    st = empty(sharding_spec, *_size_from(dims, size), **kwargs)
    torch.nn.init.uniform_(st, 0, 1)
    return st


def randn(sharding_spec: ShardingSpec, *dims, size=None, **kwargs) -> ShardedTensor:
    """A ShardedTensor filled from N(0, 1), with :func:`rand`'s per-rank RNG semantics."""
    st = empty(sharding_spec, *_size_from(dims, size), **kwargs)
    torch.nn.init.normal_(st, 0, 1)
    return st


def init_from_local_shards(
    local_shards: list[Shard], *global_size, process_group=None, init_rrefs: bool = False
) -> ShardedTensor:
    """Assemble a ShardedTensor from the shards each rank already holds.

    Example (on each of 2 ranks, rank ``r`` holding rows 5r .. 5r + 4 of a 10 x 4 tensor)::

        meta = ShardMetadata(shard_offsets=[5 * r, 0], shard_sizes=[5, 4], placement=f"rank:{r}/cpu")
        st = init_from_local_shards([Shard(torch.zeros(5, 4), meta)], 10, 4)

    Collective: one exchange of shard metadata over ``process_group``; every rank checks the
    assembled layout (no overlap, full coverage, matching sizes, dtypes, requires_grad and pinning)
    and all ranks raise the same error on failure.

    Args:
        local_shards (List[Shard]): this rank's shards (may be empty); their placements name this
            rank.
        *global_size (int...): the global size. A ``None`` entry means "recompute": each rank holds
            one shard and the shards are stacked row-wise in rank order.

    Keyword args:
        process_group (ProcessGroup, optional): defaults to the default group.
        init_rrefs (bool): build RRefs to remote shards (needs RPC).
    """
    return ShardedTensor._init_from_local_shards(
        local_shards, *global_size, process_group=process_group, init_rrefs=init_rrefs
    )


def init_from_local_shards_many(
    local_shards: Sequence[list[Shard]],
    global_sizes: Sequence[Sequence[int | None]],
    *,
    process_group=None,
    init_rrefs: bool = False,
) -> list[ShardedTensor]:
    """Assemble several ShardedTensors, each from the shards every rank holds of it, in ONE exchange.

    The result equals ``[init_from_local_shards(s, *size, ...) for s, size in zip(local_shards,
    global_sizes)]``, but the ranks exchange the metadata of all the tensors at once instead of once per
    tensor (a model with one sharded table per embedding builds hundreds of tensors; each separate call
    is a round trip through every rank of the group).

    Collective: every rank calls it with the same number of tensors, in the same order. Each tensor is
    checked as :func:`init_from_local_shards` checks it; when any tensor fails on any rank, every rank
    raises the same error, about the first failing tensor, its message naming the tensor's index.

    Args:
        local_shards (Sequence[List[Shard]]): per tensor, this rank's shards of it (may be empty).
        global_sizes (Sequence[Sequence[int]]): per tensor, its global size (a list, tuple or
            torch.Size; an int for a 1-D tensor). ``None`` entries mean "recompute", as in
            :func:`init_from_local_shards`.

    Keyword args:
        process_group (ProcessGroup, optional): the group of every tensor; defaults to the default group.
        init_rrefs (bool): build RRefs to remote shards (needs RPC).

    Returns:
        List[ShardedTensor]: one per entry of ``local_shards``, in order.

    Raises:
        TypeError: ``local_shards`` is not a sequence of lists of Shards.
        ValueError: ``local_shards`` and ``global_sizes`` differ in length, the ranks pass different
            numbers of tensors, or a tensor's shards do not form a valid layout (as
            :func:`init_from_local_shards` raises, on every rank).
    """
    return ShardedTensor._init_from_local_shards_many(
        local_shards, global_sizes, process_group=process_group, init_rrefs=init_rrefs
    )


def state_dict_hook(module, destination, prefix, local_metadata) -> None:
    """Module state_dict hook adding every ShardedTensor attribute of ``module`` and its submodules.

    Register with ``module._register_state_dict_hook(state_dict_hook)``.
    """
    for submodule_name, submodule in module.named_modules():
        for attr_name, attr in submodule.__dict__.items():
            if isinstance(attr, ShardedTensor):
                mod_prefix = prefix + submodule_name
                key = mod_prefix + ("." if mod_prefix else "") + attr_name
                destination[key] = attr


def pre_load_state_dict_hook(
    module, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys, error_msgs
) -> None:
    """Load-state-dict pre-hook putting ShardedTensor entries back as attributes of the submodules.

    Register with ``module._register_load_state_dict_pre_hook(pre_load_state_dict_hook, True)``.
    """
    for submodule_name, submodule in module.named_modules():
        for attr_name in list(submodule.__dict__.keys()):
            mod_prefix = prefix + submodule_name
            key = mod_prefix + ("." if mod_prefix else "") + attr_name
            if key in state_dict and isinstance(state_dict[key], ShardedTensor):
                setattr(submodule, attr_name, state_dict[key])


def _sharded_op_impl(func: Callable):
    """Decorator registering a built-in ShardedTensor implementation of torch function ``func``.

    The implementation's signature is ``(types, args, kwargs, process_group)``.
    """
    return functools.partial(_decorator_func, op=func, op_table=_SHARDED_OPS)


def custom_sharded_op_impl(func: Callable):
    """Decorator registering a user implementation of torch function ``func`` for ShardedTensor.

    User implementations take precedence over spec-specific and built-in ones. The decorated function
    must have the signature ``(types, args, kwargs, process_group)``.

    Example::

        @custom_sharded_op_impl(torch.asin)
        def my_asin(types, args, kwargs, process_group):
            ...
    """
    return functools.partial(_decorator_func, op=func, op_table=_CUSTOM_SHARDED_OPS)


def _register_safe_globals() -> None:
    # torch.load defaults to weights_only=True: allow exactly what a pickled ShardedTensor references.
    from .._support._torch_private import RemoteDevice


    torch.serialization.add_safe_globals(
        [
            _rebuild_sharded_tensor,
            ShardedTensor,
            ShardedTensorBase,
            Shard,
            ShardMetadata,
            ShardedTensorMetadata,
            TensorProperties,
            ProcessGroupState,
            MEM_FORMAT_ENCODING,
            ChunkShardingSpec,
            EnumerableShardingSpec,
            RemoteDevice,
        ]
    )


_register_safe_globals()
