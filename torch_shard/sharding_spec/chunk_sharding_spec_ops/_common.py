"""What the sharded embedding ops check in Python, and the layout they hand to C++.

Every rank calls the op with its own input. Python checks what the host knows about this rank's
arguments (types, shapes, devices, flags: the dense op's exception types and messages where it has
them, upstream's sharded-op messages where upstream checks) and turns the weight's layout into the
arguments of the C++ ops. A rank whose Python checks fail still takes part in the agreement the other
ranks run (``abort_and_raise``), so every rank raises. Everything else is one C++ call per op
(:mod:`._lookup`): the checks of the input's values (ids in range, offsets well formed) run on the
input's device inside it, and any check that can differ between ranks runs inside its agreement
(NOTE [ A row-wise lookup in one call ] in csrc/ops/rowwise_lookup.cpp).
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from ...sharded_tensor import ShardedTensor
from ...sharded_tensor.utils import _PlacementResolver
from ..chunk_sharding_spec import ChunkShardingSpec


def local_weight(weight, op_name: str):
    """(the single local shard tensor, its offset along the sharded dim, the sharded dim)."""
    shards = weight.local_shards()
    if len(shards) != 1:
        raise ValueError("Only one local shard supported!")
    spec = weight.sharding_spec()
    if not isinstance(spec, ChunkShardingSpec):
        raise ValueError("Only ChunkShardingSpec supported for ShardedTensor ops!")
    dim = spec.dim % weight.dim() if weight.dim() else spec.dim
    if dim not in (0, 1):
        raise RuntimeError(f"nn.Embedding weight sharded on dim {dim} not supported!")
    return shards[0].tensor, shards[0].metadata.shard_offsets[dim], dim


def check_index_dtype(tensor: torch.Tensor, arg: str, op_name: str) -> None:
    """Ids and offsets are int64 or int32, as for the dense ops (and with their message)."""
    if tensor.dtype not in (torch.int64, torch.int32):
        raise RuntimeError(
            f"Expected tensor for argument #1 '{arg}' to have one of the following scalar types: Long, Int; "
            f"but got {tensor.type()} instead (while checking arguments for {op_name})"
        )


def check_device(local: torch.Tensor, tensor: torch.Tensor, arg: str) -> None:
    """Every input lives where this rank's weight shard does (the dense ops' rule for their weight)."""
    if tensor.device != local.device:
        raise RuntimeError(
            f"Expected all tensors to be on the same device, but found at least two devices, "
            f"{local.device} and {tensor.device}! ({arg} is on {tensor.device}, this rank's weight shard "
            f"on {local.device})"
        )


def common_arguments(args: tuple, kwargs: dict) -> tuple:
    """(input, weight, padding_idx, max_norm, norm_type) of an ``F.embedding`` or ``F.embedding_bag``
    call as torch function hands it over: input and weight positionally or by name, the others by name,
    absent ones at the dense ops' defaults. Reads only; :func:`validate_common` checks."""
    input = args[0] if args else kwargs.get("input")
    weight = args[1] if len(args) > 1 else kwargs.get("weight")
    return input, weight, kwargs.get("padding_idx"), kwargs.get("max_norm"), kwargs.get("norm_type", 2.0)


def validate_common(input, weight, max_norm, kwargs: dict, op_name: str, fn_name: str):
    """Checks shared by embedding and embedding_bag, on this rank's arguments, before any exchange.
    Only what the host knows (types, shapes, devices, flags); the ids' values are checked on their
    device, inside the C++ op.

    Returns :func:`local_weight`'s (local shard, offset, sharded dim). ``kwargs`` is the call's keyword
    arguments (the unsupported flags ``scale_grad_by_freq`` and ``sparse`` are read from it).
    ``op_name`` is the module's name ("Embedding"), ``fn_name`` the function's ("embedding"), as they
    appear in the messages.
    """
    scale_grad_by_freq = kwargs.get("scale_grad_by_freq", False)
    sparse = kwargs.get("sparse", False)
    if not isinstance(input, torch.Tensor):
        raise TypeError("input need to be torch.Tensor")
    if not isinstance(weight, ShardedTensor):
        raise TypeError("weight needs to be ShardedTensor")
    if len(weight.size()) != 2:
        raise ValueError("Weight needs to have exactly 2 dims")
    if scale_grad_by_freq:
        raise RuntimeError(f'nn.{op_name} weight sharded with flag on "scale_grad_by_freq" not supported!')
    if sparse:
        raise RuntimeError(f'nn.{op_name} weight sharded with flag on "sparse" not supported!')
    if max_norm is not None and max_norm <= 0:
        raise ValueError('"max_norm" must be larger than zero!')
    local, start, dim = local_weight(weight, fn_name)
    check_index_dtype(input, "indices", fn_name)
    check_device(local, input, "input")
    return local, start, dim


def blocks(weight, dim: int) -> tuple[list[int], list[int]]:
    """Each group rank's block of the weight along its sharded ``dim``: (first indices, sizes), by rank
    of the weight's process group (0, 0 for a rank without a shard).

    Placements name global ranks or RPC workers; the C++ ops index by rank of the weight's process
    group, so every owner goes through the group's placement resolver (a sub-group's ranks 1 and 3 are
    its ranks 0 and 1; "worker1/cpu" is whichever group rank worker 1 is). An empty chunk keeps the
    offset upstream's metadata gives it, which can lie past the end of the dim.
    """
    resolver = _PlacementResolver(weight._process_group)
    world = dist.get_world_size(weight._process_group)
    starts, sizes = [0] * world, [0] * world
    for md in weight.metadata().shards_metadata:
        owner = resolver.owner(md.placement)
        if 0 <= owner < world:  # a shard held by no rank of the group leaves its rows unowned: C++ raises
            starts[owner], sizes[owner] = md.shard_offsets[dim], md.shard_sizes[dim]
    return starts, sizes


_MODE_CODES = {"sum": 0.0, "mean": 1.0, "max": 2.0}


def lookup_arguments(
    padding_idx: int | None, max_norm: float | None, norm_type: float, mode: str | None = None
) -> list[float]:
    """The scalars of this call with which each rank computes the OTHER ranks' lookups, for the C++ ops'
    agreement: every rank must pass the same (different ones would give silently different results, or,
    with max_norm on some ranks only, a renormalisation the others do not run). The ops add their own.

    ``padding_idx`` is the normalised one (non-negative) or None; ``norm_type`` counts only with a
    ``max_norm``, as for the dense op. None maps to -1, which no valid value takes.
    """
    return [
        -1.0 if padding_idx is None else float(padding_idx),
        -1.0 if max_norm is None else float(max_norm),
        0.0 if max_norm is None else float(norm_type),
        -1.0 if mode is None else _MODE_CODES[mode],
    ]
