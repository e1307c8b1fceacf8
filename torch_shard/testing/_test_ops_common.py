"""Helpers the ported sharded-op tests share (upstream's _test_ops_common), with our placements."""

from __future__ import annotations

import operator

import torch

from ..metadata import ShardMetadata
from ..sharding_spec import ChunkShardingSpec, EnumerableShardingSpec
from ..sharding_spec._internals import get_chunked_dim_size, get_split_size
from . import placement


def generate_chunk_sharding_specs_for_test(sharding_dim: int) -> list[ChunkShardingSpec]:
    """Three 4-rank chunk specs on ``sharding_dim``: placement orders 0123, 2301 and 3012."""
    return [
        ChunkShardingSpec(dim=sharding_dim, placements=[placement(r) for r in order])
        for order in ((0, 1, 2, 3), (2, 3, 0, 1), (3, 0, 1, 2))
    ]


def generate_enumerable_sharding_specs_for_test() -> list[EnumerableShardingSpec]:
    """One 2x2 grid of 5x5 blocks over a 10x10 tensor, block ``r`` (row-major) on rank ``r``."""
    return [
        EnumerableShardingSpec(
            [
                ShardMetadata(shard_offsets=[row, col], shard_sizes=[5, 5], placement=placement(rank))
                for rank, (row, col) in enumerate(((0, 0), (5, 0), (0, 5), (5, 5)))
            ]
        )
    ]


def generate_local_weight_sharding_params_for_test(local_weight, sharded_dim, gpu_num, spec, rank):
    """(start position, chunk size) of ``rank``'s chunk of ``local_weight`` under ``spec``."""
    sharding_dim_size = local_weight.size(sharded_dim)
    split_size = get_split_size(sharding_dim_size, gpu_num)
    current_offsets = 0
    start_pos = current_offsets
    for idx, spec_placement in enumerate(spec.placements):
        chunk_size = get_chunked_dim_size(sharding_dim_size, split_size, idx)
        if rank == spec_placement.rank():
            start_pos = current_offsets
            break
        current_offsets += chunk_size
    return start_pos, chunk_size


def clone_module_parameter(module, param_name):
    """A clone of ``module.<param_name>`` as a new ``torch.nn.Parameter``."""
    tensor = getattr(module, param_name)
    return torch.nn.Parameter(tensor.detach().clone())


_BINARY_OPS = {
    "+": (operator.add, operator.iadd),
    "-": (operator.sub, operator.isub),
    "*": (operator.mul, operator.imul),
    "/": (operator.truediv, operator.itruediv),
}


def gen_binary_op_func(python_op: str, inplace: bool = False):
    """``f(lhs, rhs)`` applying ``python_op``: an operator symbol (``"+"``, ``"-"``, ``"*"``, ``"/"``)
    or a ``torch.<name>`` function; ``inplace`` uses the augmented assignment (``lhs += rhs``)."""
    if python_op.startswith("torch."):
        func = getattr(torch, python_op[len("torch.") :])
        return lambda lhs, rhs: func(lhs, rhs)
    if python_op not in _BINARY_OPS:
        raise ValueError(f"unsupported binary op {python_op!r}; expected one of {sorted(_BINARY_OPS)} or 'torch.<name>'")
    return _BINARY_OPS[python_op][1 if inplace else 0]
