"""Python side of the data ops: scatter a tensor into shards, gather it back, reshard in place.

Each function turns its Python arguments (a spec, placements) into the layout argument group and
makes ONE call to the C++ op (``torch.ops.torch_shard.shard / gather / reshard``), which checks its
arguments, agrees with the other ranks, plans (cached) and moves the data. When the Python
preparation itself fails on a rank (a bad spec, an unknown placement), that rank still takes part in
the op's agreement round through ``_abort``, so every rank raises instead of waiting for it.
"""

from __future__ import annotations

import warnings

import torch
import torch.distributed as dist

from .._support import _native
from .._support import _torch_private as private
from .._support._agreement import abort_and_raise
from .._support._placement import _PlacementResolver
from .._support._tensor_metadata import TensorProperties
from ..sharding_spec import EnumerableShardingSpec, ShardingSpec
from . import _state
from ._construction import group_of

_ops = torch.ops.torch_shard


def wrap(cls: type, raw: torch.Tensor, spec, process_group, requires_grad: bool) -> torch.Tensor:
    """A ``cls`` (the ShardedTensor class: this module sits below it) over an impl returned by a C++ op."""
    st = private.make_subclass(cls, raw, requires_grad)
    st._init_python_state(process_group)
    _state.set_spec(st, spec)
    return st


def scatter(cls: type, tensor: torch.Tensor, spec: ShardingSpec, src_rank: int, process_group) -> torch.Tensor:
    """Shard ``tensor`` (its data read on group rank ``src_rank`` only) by ``spec`` into a ``cls`` (a
    ShardedTensor class): one C++ call.

    Every rank passes a tensor of the same size and dtype (checked before any data moves); each rank
    receives only its own shards.
    """
    pg = group_of(process_group)
    try:
        if not isinstance(tensor, torch.Tensor):
            raise TypeError(f"shard expects a torch.Tensor, but got {type(tensor).__name__}")
        args = _native.layout_args_for_spec(
            spec, tensor.size(), TensorProperties.create_from_tensor(tensor), _PlacementResolver(pg)
        )
    except Exception as exc:  # noqa: BLE001 - every rank must hear about it
        abort_and_raise("shard", exc, pg)
    me = dist.get_rank(pg)
    raw = _ops.shard(
        tensor.detach() if me == src_rank else None,
        src_rank,
        list(tensor.size()),
        tensor.dtype,
        *args,
        tensor.requires_grad,
        pg.group_name,
    )
    return wrap(cls, raw, spec, pg, tensor.requires_grad)


def gather(st: torch.Tensor, dst: int, out: torch.Tensor | None, enforce_dtype: bool, dtype) -> None:
    """Assemble ``st`` into ``out`` on group rank ``dst``: one C++ call."""
    if enforce_dtype:
        warnings.warn("`enforce_dtype` is deprecated. Please use `dtype` instead.", FutureWarning, stacklevel=3)
    pg = st._process_group
    if dtype is not None and out is not None and out.dtype != dtype:
        abort_and_raise(
            "gather", TypeError(f"Argument ``dst_tensor`` has dtype {out.dtype}, but dtype={dtype} was asked for"), pg
        )
    with _state._plain():
        _ops.gather(st, dst, out)


class UnsupportedReshardError(NotImplementedError, ValueError):
    """A reshard whose arguments are invalid, in a case upstream refused as not implemented.

    torch_shard reshards into any layout that tiles the tensor and with several local shards per rank,
    which upstream's ``reshard`` refused with NotImplementedError. When such a reshard is invalid (an
    EnumerableShardingSpec that does not tile the tensor, a rank holding the same shard twice), this
    error is raised: a ValueError, because the arguments are wrong, and a NotImplementedError carrying
    upstream's message, so code written for upstream that expects that exception keeps working.
    """


def _check_reshard_upstream_cases(st: torch.Tensor, spec) -> None:
    """The two reshards upstream refused outright, checked before anything else when they are invalid
    for torch_shard too (see UnsupportedReshardError)."""
    if isinstance(spec, EnumerableShardingSpec):
        try:
            _native.validate_shards(spec.shards, st.size())
        except ValueError as exc:
            raise UnsupportedReshardError(
                f"Only ChunkShardingSpec supported for reshard. (torch_shard also reshards into an "
                f"EnumerableShardingSpec whose shards tile the tensor; this one does not: {exc})"
            ) from exc
    indices = _state.read_state(st).indices
    if len(set(indices)) != len(indices):
        raise UnsupportedReshardError(
            f"Only single local shard supported for reshard. Number of shards: {len(indices)} "
            f"(torch_shard reshards several local shards per rank, but this rank holds the same shard "
            f"of the metadata more than once)"
        )


def reshard(st: torch.Tensor, spec: ShardingSpec) -> torch.Tensor:
    """Move ``st`` to the layout of ``spec`` in place (one C++ call); returns ``st``."""
    pg = st._process_group
    try:
        if not isinstance(spec, ShardingSpec):
            raise TypeError(f"reshard expects a ShardingSpec, but got {type(spec).__name__}")
        _check_reshard_upstream_cases(st, spec)
        args = _native.layout_args_for_spec(
            spec, st.size(), lambda: st.metadata().tensor_properties, _PlacementResolver(pg)
        )
    except Exception as exc:  # noqa: BLE001 - every rank must hear about it
        abort_and_raise("reshard", exc, pg)
    with _state._plain():
        _ops.reshard(st, *args)
    _state.set_spec(st, spec)
    return st
