"""torch.nn.functional.embedding_bag with a ChunkShardingSpec-sharded weight (rows or columns)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..._support._agreement import abort_and_raise
from ..api import custom_sharding_spec_op
from ..chunk_sharding_spec import ChunkShardingSpec
from ._common import blocks, check_device, check_index_dtype, common_arguments, lookup_arguments, validate_common
from ._lookup import lookup, renorm


def _as_bags(input, offsets, per_sample_weights, include_last_offset, mode, local):
    """This rank's bags as (int64 ids, int64 offsets as given, 1-D per-sample weights or None,
    include_last_offset), after the checks the host can make (the dense op's exception types and
    messages where it has them). A 2-D input stays 2-D, without offsets: its rows are its bags, which the
    C++ op takes as they are (no offsets to build or check). Given offsets' values are checked on their
    device by the C++ op (NOTE [ Input checks on the device ] in csrc/ops/lookup_checks.h)."""
    if input.dim() > 2:
        raise ValueError("Input more than 2 dims not supported")
    if input.dim() == 0:
        raise ValueError("input has to be 1D or 2D Tensor, but got Tensor of dimension 0")
    if input.dim() == 2:
        if offsets is not None:
            raise ValueError("Input dimension needs to be exactly 1 dim")
        if input.size(1) == 0:
            # The dense op builds its offsets with a step of the rows' length.
            raise RuntimeError("step must be nonzero")
        # include_last_offset means nothing without offsets (as for the dense op).
        bag_offsets = None
        include_last_offset = False
    else:
        if offsets is None:
            raise ValueError("offsets is required for 1D input")
        if not isinstance(offsets, torch.Tensor):
            raise TypeError("offsets need to be torch.Tensor")
        if offsets.dim() != 1:
            raise ValueError("offsets has to be a 1D Tensor")
        check_index_dtype(offsets, "offsets", "embedding_bag")
        check_device(local, offsets, "offsets")
        if include_last_offset and offsets.numel() == 0:
            raise RuntimeError("include_last_offset: number of offset should be at least 1")
        bag_offsets = offsets.to(torch.int64)
    psw = None
    if per_sample_weights is not None:
        if not isinstance(per_sample_weights, torch.Tensor):
            raise TypeError("per_sample_weights need to be torch.Tensor")
        if mode != "sum":
            raise NotImplementedError(
                "embedding_bag: per_sample_weights was not None. per_sample_weights is only supported "
                f"for mode='sum' (got mode='{mode}'). Please open a feature request on GitHub."
            )
        if per_sample_weights.shape != input.shape:
            raise ValueError(
                f"per_sample_weights size {per_sample_weights.shape} not equal to input size {input.shape}"
            )
        if per_sample_weights.dtype != local.dtype:
            raise RuntimeError(
                "Expected tensor for argument #1 'weight' to have the same type as tensor for argument #1 "
                f"'per_sample_weights'; but type {local.type()} does not equal {per_sample_weights.type()} "
                "(while checking arguments for embedding_bag)"
            )
        check_device(local, per_sample_weights, "per_sample_weights")
        if per_sample_weights.requires_grad:
            raise NotImplementedError("gradients with respect to per_sample_weights are not supported")
        psw = per_sample_weights.reshape(-1)
    return input.to(torch.int64), bag_offsets, psw, bool(include_last_offset)


@custom_sharding_spec_op(ChunkShardingSpec, F.embedding_bag)
def sharded_embedding_bag(types, args, kwargs, pg):
    """Bag lookups (sum / mean / max) against a row- or column-sharded weight.

    Every rank passes its own bags; each gets ``[num_bags, embedding_dim]``, equal to the dense op
    (padding ids excluded from the reduction, empty bags give 0). Row-wise: each owner pools what it
    holds of every requester's bags, and the partial results are combined at the requester (sum,
    or max). Column-wise: each rank pools every requester's bags in its column block, and the blocks
    are exchanged. ``max_norm`` renormalises, in place, every row any rank looks up first.
    """
    kwargs = kwargs or {}
    input, weight, padding_idx, max_norm, norm_type = common_arguments(args, kwargs)
    mode = kwargs.get("mode", "mean")
    try:
        # What can fail on this rank in Python fails here, before the C++ ops' agreement; the other ranks
        # then raise too (abort_and_raise takes part in it).
        local, _, dim = validate_common(input, weight, max_norm, kwargs, "EmbeddingBag", "embedding_bag")
        if mode not in ("sum", "mean", "max"):
            raise ValueError(f"mode '{mode}' is not supported")
        if not local.is_floating_point():
            raise RuntimeError(
                "Expected tensor for argument #1 'weight' to have one of the following scalar types: Half, "
                f"BFloat16, Float, Double; but got {local.type()} instead (while checking arguments for "
                "embedding_bag)"
            )
        if padding_idx is not None:
            if not -weight.size(0) <= padding_idx < weight.size(0):
                raise RuntimeError(
                    f"padding_idx must be within the number of embeddings, -{weight.size(0)} through "
                    f"{weight.size(0) - 1}, but got {padding_idx}"
                )
            if padding_idx < 0:
                padding_idx += weight.size(0)
        ids, offsets, psw, include_last_offset = _as_bags(
            input,
            kwargs.get("offsets"),
            kwargs.get("per_sample_weights"),
            kwargs.get("include_last_offset", False),
            mode,
            local,
        )
        layout = blocks(weight, dim)
        arguments = lookup_arguments(padding_idx, max_norm, norm_type, mode)
    except Exception as exc:  # noqa: BLE001 - raised on every rank
        abort_and_raise("share_inputs", exc, pg)
    if pg.size() == 1 and local.shape == weight.shape:
        # The whole table is this rank's shard (NOTE [ One rank holds the whole table ] in _lookup.py).
        return F.embedding_bag(
            input,
            local,
            kwargs.get("offsets"),
            max_norm,
            norm_type,
            mode=mode,
            per_sample_weights=kwargs.get("per_sample_weights"),
            include_last_offset=kwargs.get("include_last_offset", False),
            padding_idx=padding_idx,
        )
    group = pg.group_name
    if max_norm is not None:
        # Every id of the input, as the dense op renormalises them.
        renorm(local, ids.reshape(-1), weight, dim, layout, max_norm, norm_type, arguments, group)
    return lookup(
        local, ids, offsets, psw, weight, dim, layout, mode, padding_idx, include_last_offset, arguments, group
    )
