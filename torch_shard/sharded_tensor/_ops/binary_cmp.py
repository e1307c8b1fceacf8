"""torch.equal and torch.allclose between two ShardedTensors: local comparison, one all-reduce."""

from __future__ import annotations

import torch

from ..._support import _torch_private as private
from .. import _sharded_op_impl
from ..api import ShardedTensor


def _communicate_result(local_result: bool, pg) -> bool:
    # One agreement round (the C++ core picks the device: cpu for gloo, the current GPU for NCCL).
    return torch.ops.torch_shard._all_ranks_true(bool(local_result), pg.group_name)


def _binary_cmp(cmp_fun, types, args, kwargs=None, process_group=None) -> bool:

    if len(args) != 2:
        raise ValueError(f"Expected two arguments for torch.{cmp_fun.__name__}")
    st1, st2 = args
    if not (isinstance(st1, ShardedTensor) and isinstance(st2, ShardedTensor)):
        raise TypeError(f"Both arguments to torch.{cmp_fun.__name__} need to be of type ShardedTensor")
    if st1._process_group is not st2._process_group:
        return False
    if private.rank_not_in_group(st1._process_group) or private.rank_not_in_group(
        st2._process_group
    ):
        return private.rank_not_in_group(st1._process_group) == private.rank_not_in_group(
            st2._process_group
        )
    local = st1.metadata() == st2.metadata()
    shards1, shards2 = st1.local_shards(), st2.local_shards()
    local = local and len(shards1) == len(shards2)
    if local:
        for a, b in zip(shards1, shards2):
            if a.metadata != b.metadata or not cmp_fun(a.tensor, b.tensor, **(kwargs or {})):
                local = False
                break
    return _communicate_result(local, st1._process_group)


@_sharded_op_impl(torch.equal)
def equal(types, args=(), kwargs=None, process_group=None):
    """True when both ShardedTensors have the same metadata and equal shards on every rank."""
    return _binary_cmp(torch.equal, types, args, kwargs, process_group)


@_sharded_op_impl(torch.allclose)
def allclose(types, args=(), kwargs=None, process_group=None):
    """torch.allclose shard by shard (kwargs such as atol apply), combined over every rank."""
    return _binary_cmp(torch.allclose, types, args, kwargs, process_group)
