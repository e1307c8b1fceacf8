"""torch.nn.functional.embedding_bag with a ChunkShardingSpec-sharded weight (rows or columns)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..api import custom_sharding_spec_op
from ..chunk_sharding_spec import ChunkShardingSpec
from ._common import (
    Bags,
    InputChecks,
    check_device,
    check_ids_in_range,
    check_index_dtype,
    column_order,
    exchange_rows,
    fused_routing,
    lookup_arguments,
    owner_of_ids,
    renorm_rows_,
    requester_group,
    row_ranges,
    share_bags,
    validate_common,
    width_of,
    zeros_from,
)
from ._one_call import BAG_MODES, columns_in_one_call, rows_in_one_call
from ._routing import (
    bag_lengths,
    bag_words_for,
    bags_back,
    check_fits,
    decode,
    index_dtype,
    pool_max,
    pool_sum,
    positions_back,
    prepare,
    route,
    route_prepared,
)


def _max_over_owners(stacked: torch.Tensor, where: torch.Tensor) -> torch.Tensor:
    """Each element's maximum over the owners' partial maxima, taken from ONE owner: among those holding
    the maximum, the one whose winning id comes first in the bag (``positions``: -1 for none), which is
    the dense op's choice (NOTE [ Max ties ] in csrc/ops/embedding_ops.cpp); so the gradient reaches
    exactly the row the dense op gives it to. 0 where no owner holds an id of the bag. Both arguments
    are [owners, bags, dim]."""
    with torch.no_grad():
        held = where >= 0
        best = torch.where(held, stacked, float("-inf")).amax(dim=0, keepdim=True)
        none = torch.iinfo(torch.int64).max
        first, chosen = torch.where(held & (stacked == best), where, none).min(dim=0, keepdim=True)
    out = stacked.gather(0, chosen).squeeze(0)
    return torch.where(first.squeeze(0) == none, torch.zeros((), dtype=out.dtype, device=out.device), out)


def _check_offsets(checks: InputChecks, offsets: torch.Tensor, n: int, include_last_offset: bool) -> None:
    """Offsets of 1-D input: what the dense op requires (its exception types and messages where it
    has them), plus non-decreasing, which the dense op does not check everywhere: bag b holds
    ``ids[offsets[b]:offsets[b + 1]]``, the last one (without ``include_last_offset``) runs to the end.
    What depends on the offsets' values goes into ``checks`` (on their device; see InputChecks).
    """
    if include_last_offset and offsets.numel() == 0:
        raise RuntimeError("include_last_offset: number of offset should be at least 1")
    if offsets.numel() == 0:
        return
    first, last = offsets[0], offsets[-1]
    # drop[b]: offsets[b] < offsets[b - 1] (never for b = 0).
    drop = torch.cat([offsets.new_zeros(1, dtype=torch.bool), offsets[1:] < offsets[:-1]])

    def last_is_not_n() -> None:
        if int(last) != n:
            raise ValueError(
                'offsets need to have the input size in the end when the flag "include_last_offset" is on!'
            )

    def first_is_not_zero() -> None:
        if int(first) != 0:
            raise RuntimeError(
                "offsets[0] has to be 0, i.e., the first sequence in the mini-batch has to start from "
                f"position 0. However, got {int(first)}"
            )

    def last_beyond_n() -> None:
        if int(last) > n:
            raise RuntimeError(
                f"offsets[-1] can not be greater than input's length {n} but got offsets[-1] of {int(last)}"
            )

    def decreasing() -> None:
        if bool(drop.any()):
            where = int(torch.argmax(drop.to(torch.int8)))
            raise RuntimeError(
                f"embedding_bag: offsets has to be non-decreasing, but offsets[{where}] = "
                f"{int(offsets[where])} is less than offsets[{where - 1}] = {int(offsets[where - 1])}"
            )

    if include_last_offset:
        checks.add(last != n, ValueError, last_is_not_n)
    checks.add(first != 0, RuntimeError, first_is_not_zero)
    checks.add(last > n, RuntimeError, last_beyond_n)
    checks.add(drop.any(), RuntimeError, decreasing)


def _as_bags(
    input, offsets, per_sample_weights, include_last_offset, mode, local, checks: InputChecks, id_dtype=torch.int64
) -> Bags:
    """This rank's bags as flat ``id_dtype`` ids and int64 offsets, after checking them (ids themselves
    were checked by validate_common and check_ids_in_range)."""
    if input.dim() > 2:
        raise ValueError("Input more than 2 dims not supported")
    if input.dim() == 0:
        raise ValueError("input has to be 1D or 2D Tensor, but got Tensor of dimension 0")
    if input.dim() == 2:
        if offsets is not None:
            raise ValueError("Input dimension needs to be exactly 1 dim")
        # include_last_offset means nothing without offsets (as for the dense op).
        n_bags, length = input.shape
        ids = input.reshape(-1).to(id_dtype)
        bag_offsets = torch.arange(0, n_bags * length, length, dtype=torch.int64, device=input.device)
    else:
        if offsets is None:
            raise ValueError("offsets is required for 1D input")
        if not isinstance(offsets, torch.Tensor):
            raise TypeError("offsets need to be torch.Tensor")
        if offsets.dim() != 1:
            raise ValueError("offsets has to be a 1D Tensor")
        check_index_dtype(offsets, "offsets", "embedding_bag")
        check_device(local, offsets, "offsets")
        _check_offsets(checks, offsets, input.numel(), include_last_offset)
        ids = input.to(id_dtype)
        bag_offsets = offsets.to(torch.int64)
        if include_last_offset:
            bag_offsets = bag_offsets[:-1]
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
    return Bags(ids=ids, offsets=bag_offsets, per_sample_weights=psw)


@custom_sharding_spec_op(ChunkShardingSpec, F.embedding_bag)
def sharded_embedding_bag(types, args, kwargs, pg):
    """Bag lookups (sum / mean / max) against a row- or column-sharded weight.

    Every rank passes its own bags; each gets ``[num_bags, embedding_dim]``, equal to the dense op
    (padding ids excluded from the reduction, empty bags give 0). Row-wise: each owner pools what it
    holds of every requester's bags, and the partial results are combined at the requester (sum,
    or max). Column-wise: each rank pools every requester's bags in its column block, and the blocks
    are exchanged.
    """
    kwargs = kwargs or {}
    input = args[0] if args else kwargs.get("input")
    weight = args[1] if len(args) > 1 else kwargs.get("weight")
    offsets = kwargs.get("offsets")
    mode = kwargs.get("mode", "mean")
    padding_idx = kwargs.get("padding_idx")
    max_norm = kwargs.get("max_norm")
    norm_type = kwargs.get("norm_type", 2.0)
    error = None
    checks = InputChecks()
    words = None
    routed_rows = False  # row-wise: ids go to their owners only, not to every rank
    fused = False  # row-wise on the CPU: the requester prepares its ids in one op
    one_call = False  # the whole lookup is one C++ call (all but max_norm)
    try:
        # Everything that can fail on this rank happens here, before the exchange (share_bags), so a
        # failure raises on every rank instead of leaving the others in the exchange.
        local, start, dim = validate_common(
            input,
            weight,
            max_norm,
            kwargs.get("scale_grad_by_freq", False),
            kwargs.get("sparse", False),
            "EmbeddingBag",
            "embedding_bag",
        )
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
        fused = dim == 0 and fused_routing(local.device)
        # NOTE [ A row-wise lookup in one call ] (csrc/ops/rowwise_lookup.cpp) and NOTE [ A column-wise
        # lookup in one call ] (csrc/ops/colwise_lookup.cpp); max_norm composes.
        one_call = max_norm is None
        # The ids' range is checked on the device, in _bucket_ids or the one-call ops when they run.
        check_ids_in_range(checks, input.reshape(-1), weight.size(0), on_device=not (fused or one_call))
        mine = _as_bags(
            input,
            offsets,
            kwargs.get("per_sample_weights"),
            kwargs.get("include_last_offset", False),
            mode,
            local,
            checks,
            # Column-wise every rank's ids reach every rank: as int32 where the table allows, half the
            # bytes (ATen's kernels take int32 ids with int64 offsets). The C++ ops take int64 and
            # narrow them themselves.
            index_dtype(weight) if dim == 1 and not one_call else torch.int64,
        )
        order = column_order(weight) if dim == 1 else None
        if dim == 0:
            # How many of my ids each rank owns (the `owned` of each owner's partial pooling), told with
            # the agreement instead of counted from the device by every owner.
            # Ids that belong to no bag (there are no bags) are nobody's.
            # Each id goes to its owner only (NOTE [ Ids only to their owners ] in _routing.py).
            if not mine.num_bags:
                psw = mine.per_sample_weights
                mine = Bags(ids=mine.ids[:0], offsets=mine.offsets, per_sample_weights=None if psw is None else psw[:0])
            check_fits(mine.ids.numel(), mine.num_bags)
            ranges = row_ranges(weight)
            if one_call:
                pass  # the one-call op buckets the ids itself
            elif fused:  # one op (NOTE [ Requester-side routing in one op ] in csrc/ops/embedding_ops.cpp)
                prepared = prepare(mine, ranges, weight.size(0), index_dtype(weight), True, checks, padding_idx)
                words = prepared.words
            else:
                owner = owner_of_ids(mine.ids, ranges)
                lengths = bag_lengths(mine, owner, len(ranges), index_dtype(weight))
                words = bag_words_for(lengths)
            routed_rows = True
        arguments = lookup_arguments(padding_idx, max_norm, norm_type, mode)
    except Exception as exc:  # noqa: BLE001 - raised on every rank by share_bags
        error, mine, arguments = exc, None, None
    if one_call and error is None:
        if dim == 0:
            return rows_in_one_call(
                local, start, mine, weight, checks, BAG_MODES[mode], padding_idx, arguments, ranges, pg.group_name
            )
        return columns_in_one_call(
            local, mine, weight, checks, BAG_MODES[mode], padding_idx, arguments, order, pg.group_name
        )
    shared = share_bags(mine, weight, error, "embedding_bag", arguments, checks, words, share=not routed_rows)
    everyone = shared.bags
    group = pg.group_name

    if dim == 1:
        num_bags = [bags.num_bags for bags in everyone]
        together = requester_group(everyone)
        if max_norm is not None:
            renorm_rows_(local, torch.cat([b.ids for b in everyone]), max_norm, norm_type, weight, dim)
        # One lookup over every requester's bags (NOTE [ One kernel per requester group ], _common.py),
        # then split per requester.
        if local.size(1) and together.ids.numel():
            pooled = F.embedding_bag(
                together.ids,
                local,
                together.offsets,
                mode=mode,
                per_sample_weights=together.per_sample_weights,
                padding_idx=padding_idx,
            )
        else:  # NOTE [ Empty shards reach no embedding kernel ] (_common.py): nor do zero ids.
            pooled = zeros_from(local, sum(num_bags))
        # The requesters' bags are consecutive rows of `pooled`: sent as they lie, no copy.
        shapes = [(mine.num_bags, width_of(order, rank)) for rank in range(len(everyone))]
        received = exchange_rows(pooled, [bags * pooled.size(1) for bags in num_bags], shapes, group)
        return torch.cat([received[rank] for _, _, rank in order], dim=1)

    end = start + local.size(0)
    counts_in, bags_in = decode(shared.counts_in, bags=True)
    counts_out, _ = decode(shared.counts_out, bags=True)
    if fused:
        routed = route_prepared(mine, prepared, counts_in, counts_out, bags_in, start, group)
    else:
        routed = route(mine, owner, counts_in, counts_out, bags_in, index_dtype(weight), group, lengths)
    if max_norm is not None:
        # The rows any rank looks up here, renormalised before the lookup (the dense op's order).
        renorm_rows_(local, routed.local_ids(start).long(), max_norm, norm_type, weight, dim)
    local_pad = padding_idx - start if padding_idx is not None and start <= padding_idx < end else None
    if mode == "max":
        pooled, where = pool_max(local, routed, start, local_pad)
        values = bags_back(pooled, routed, mine.num_bags, group)
        return _max_over_owners(values, positions_back(where, routed, mine.num_bags, group))
    out = bags_back(pool_sum(local, routed, start, local_pad), routed, mine.num_bags, group).sum(dim=0)
    if mode == "mean" and mine.num_bags and fused:
        out = out / prepared.divisors.unsqueeze(1)
    elif mode == "mean" and mine.num_bags:
        keep = mine.ids != padding_idx if padding_idx is not None else torch.ones_like(mine.ids, dtype=torch.bool)
        counts = torch.zeros(mine.num_bags, dtype=out.dtype, device=out.device).index_add(
            0, mine.bag_of_id(), keep.to(out.dtype)
        )
        out = out / counts.clamp(min=1).unsqueeze(1)
    return out
