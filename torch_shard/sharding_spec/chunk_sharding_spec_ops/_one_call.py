"""Sharded lookups as one C++ call per forward (and one per backward): the Python side of
torch_shard._rowwise_lookup and torch_shard._colwise_lookup.

The ops' callers (embedding.py, embedding_bag.py) keep the argument checks and upstream's messages; the
rest (the agreement, moving ids and results, the lookup kernel, combining) is the op's (NOTE [ A
row-wise lookup in one call ] in csrc/ops/rowwise_lookup.cpp, NOTE [ A column-wise lookup in one call ]
in csrc/ops/colwise_lookup.cpp). max_norm composes the lookup in Python instead.
"""

from __future__ import annotations

import torch

from ..._agreement import _class_code
from ...sharded_tensor import _state
from ._common import Bags, InputChecks, fused_routing
from ._routing import index_dtype

_ops = torch.ops.torch_shard

# The ops' `mode`: F.embedding, or F.embedding_bag's mode as ATen numbers it.
EMBEDDING = -1
BAG_MODES = {"sum": 0, "mean": 1, "max": 2}


def _needs_grad(local: torch.Tensor) -> bool:
    return torch.is_grad_enabled() and local.requires_grad


def rows_in_one_call(
    local: torch.Tensor,
    start: int,
    mine: Bags,
    weight,
    checks: InputChecks,
    mode: int,
    padding_idx: int | None,
    arguments: list[float],
    ranges: list[tuple[int, int]],
    group: str,
) -> torch.Tensor:
    """This rank's result of a row-wise lookup (``mode``: EMBEDDING or one of BAG_MODES) from its
    weight shard ``local`` (rows from ``start``; ``ranges``: every group rank's (first, end) rows).
    ``checks`` holds this rank's device-side input checks other than the ids' range, which the op
    checks itself; ``mine.offsets`` are used only for bags. [n, dim] for embedding, [bags, dim]
    otherwise."""
    out, saved = _ops._rowwise_lookup(
        local,
        mine.ids,
        mine.offsets if mode != EMBEDDING else None,
        mine.per_sample_weights,
        checks.status(mine.ids.device),
        [row for pair in ranges for row in pair],
        weight.size(0),
        start,
        -1 if padding_idx is None else padding_idx,
        mode,
        index_dtype(weight) == torch.int32,
        _needs_grad(local),
        fused_routing(local.device),
        _state.read_state(weight).layout_fp,
        arguments,
        _class_code(ValueError),
        group,
    )
    if len(saved) == 1:  # this rank's input failed on its device; every other rank raises naming it
        checks.raise_first()
    return out


def columns_in_one_call(
    local: torch.Tensor,
    mine: Bags,
    weight,
    checks: InputChecks,
    mode: int,
    padding_idx: int | None,
    arguments: list[float],
    order: list[tuple[int, int, int]],
    group: str,
) -> torch.Tensor:
    """This rank's result of a column-wise lookup (``mode``: EMBEDDING or one of BAG_MODES) from its
    weight shard ``local`` (``order``: :func:`._common.column_order`). As :func:`rows_in_one_call`
    otherwise."""
    world = len(order)
    starts, widths = [0] * world, [0] * world
    for first, count, owner in order:
        starts[owner], widths[owner] = first, count
    out, saved = _ops._colwise_lookup(
        local,
        mine.ids,
        mine.offsets if mode != EMBEDDING else None,
        mine.per_sample_weights,
        checks.status(mine.ids.device),
        starts,
        widths,
        weight.size(0),
        -1 if padding_idx is None else padding_idx,
        mode,
        index_dtype(weight) == torch.int32,
        _needs_grad(local),
        _state.read_state(weight).layout_fp,
        arguments,
        _class_code(ValueError),
        group,
    )
    if len(saved) == 1:
        checks.raise_first()
    return out
