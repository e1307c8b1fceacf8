"""The one lookup path: the Python side of the C++ ops that run a whole sharded lookup in one call
(``torch_shard._rowwise_lookup`` / ``_colwise_lookup``, forward and backward) and of max_norm's
renormalisation (``torch_shard._embedding_renorm_``).

The callers (embedding.py, embedding_bag.py) keep the argument checks and upstream's messages; the rest
(the checks of the input's values, the agreement, moving ids and results, the lookup kernel, combining)
is the ops' (NOTE [ A row-wise lookup in one call ] in csrc/ops/rowwise_lookup.cpp, NOTE [ A column-wise
lookup in one call ] in csrc/ops/colwise_lookup.cpp, NOTE [ max_norm on a sharded weight ] in
csrc/ops/renorm.cpp).

NOTE [ One rank holds the whole table ]
In a group of one rank, that rank's shard is the whole table and nobody else takes part, so the
lookup is the dense op on the shard (F.embedding / F.embedding_bag with the same arguments, after the
same host checks): its kernels, its input checks, its max_norm renormalisation and its backward into
the shard, with nothing to route, exchange or combine. In a larger group every rank joins the lookup's
agreement, whatever its ids, so the sharded ops run there.
"""

from __future__ import annotations

import torch

from ...sharded_tensor import _state

_ops = torch.ops.torch_shard


def lookup(
    local: torch.Tensor,
    ids: torch.Tensor,
    offsets: torch.Tensor | None,
    per_sample_weights: torch.Tensor | None,
    weight,
    dim: int,
    layout: tuple[list[int], list[int]],
    mode: str,
    padding_idx: int | None,
    include_last_offset: bool,
    arguments: list[float],
    group: str,
) -> torch.Tensor:
    """This rank's result of a lookup in ``weight`` (sharded on ``dim``; ``local`` its shard here,
    ``layout`` every group rank's block from :func:`._common.blocks`): ``mode`` "embedding" ([n, dim] for
    the 1-D int64 ``ids``) or embedding_bag's "sum", "mean", "max" ([bags, dim] for ``offsets`` as the
    caller gave them, or for the rows of 2-D ``ids`` without offsets)."""
    op = _ops._rowwise_lookup if dim == 0 else _ops._colwise_lookup
    out, _ = op(
        local,
        ids,
        offsets,
        per_sample_weights,
        layout[0],
        layout[1],
        weight.size(0),
        -1 if padding_idx is None else padding_idx,
        mode,
        include_last_offset,
        torch.is_grad_enabled() and local.requires_grad,
        _state.read_state(weight).layout_fp,
        arguments,
        group,
    )
    return out


def renorm(
    local: torch.Tensor,
    ids: torch.Tensor,
    weight,
    dim: int,
    layout: tuple[list[int], list[int]],
    max_norm: float,
    norm_type: float,
    arguments: list[float],
    group: str,
) -> None:
    """max_norm: every row any rank's ``ids`` look up renormalised in place, by its whole norm, before
    the lookup (as dense F.embedding calls embedding_renorm_ under no_grad first)."""
    with torch.no_grad():
        _ops._embedding_renorm_(
            local,
            ids,
            dim,
            layout[0],
            layout[1],
            weight.size(0),
            float(max_norm),
            float(norm_type),
            _state.read_state(weight).layout_fp,
            arguments,
            group,
        )
