"""torch.nn.functional.embedding with a ChunkShardingSpec-sharded weight (rows or columns)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..api import custom_sharding_spec_op
from ..chunk_sharding_spec import ChunkShardingSpec
from ._common import (
    Bags,
    InputChecks,
    check_ids_in_range,
    column_order,
    exchange_rows,
    fused_routing,
    lookup_arguments,
    owner_of_ids,
    renorm_rows_,
    row_ranges,
    share_bags,
    validate_common,
    width_of,
    zeros_from,
)
from ._one_call import EMBEDDING, columns_in_one_call, rows_in_one_call
from ._routing import (
    check_fits,
    index_dtype,
    lookup_rows,
    prepare,
    route,
    route_prepared,
    send_back,
    words_for,
)


@custom_sharding_spec_op(ChunkShardingSpec, F.embedding)
def sharded_embedding(types, args, kwargs, pg):
    """Embedding lookup against a row- or column-sharded weight.

    Every rank passes its own input (any shape); each gets ``input.shape + (embedding_dim,)``, equal to
    the dense lookup. Row-wise: each owner sends back exactly the rows it holds for a requester's ids.
    Column-wise: each rank looks up every requester's ids in its column block, and the blocks are
    exchanged. ``max_norm`` renormalises looked-up rows by their full norm, in place, as dense does.
    """
    kwargs = kwargs or {}
    input = args[0] if args else kwargs.get("input")
    weight = args[1] if len(args) > 1 else kwargs.get("weight")
    padding_idx = kwargs.get("padding_idx")
    max_norm = kwargs.get("max_norm")
    norm_type = kwargs.get("norm_type", 2.0)
    error = None
    checks = InputChecks()
    words = None
    routed_rows = False  # row-wise: ids go to their owners only, not to every rank
    fused = False  # row-wise on the CPU: the requester prepares its ids in one op
    one_call = False  # without max_norm: the whole lookup is one C++ call
    try:
        # Everything that can fail on this rank happens here, before the exchange (share_bags), so a
        # failure raises on every rank instead of leaving the others in the exchange.
        local, start, dim = validate_common(
            input,
            weight,
            max_norm,
            kwargs.get("scale_grad_by_freq", False),
            kwargs.get("sparse", False),
            "Embedding",
            "embedding",
        )
        if padding_idx is not None:
            if not -weight.size(0) <= padding_idx < weight.size(0):
                raise AssertionError("Padding_idx must be within num_embeddings")
            if padding_idx < 0:
                padding_idx += weight.size(0)
        # NOTE [ A row-wise lookup in one call ] (csrc/ops/rowwise_lookup.cpp) and NOTE [ A column-wise
        # lookup in one call ] (csrc/ops/colwise_lookup.cpp); max_norm composes.
        one_call = max_norm is None
        # Column-wise every rank's ids reach every rank: as int32 where the table allows, half the bytes
        # (the C++ ops take int64 and narrow them themselves).
        ids = input.reshape(-1).to(index_dtype(weight) if dim == 1 and not one_call else torch.int64)
        fused = dim == 0 and fused_routing(local.device)
        # On the ids as given: an int64 id beyond int32 must not wrap into range. Checked on the
        # device in _bucket_ids or the one-call ops when they run.
        check_ids_in_range(checks, input.reshape(-1), weight.size(0), on_device=not (fused or one_call))
        mine = Bags(ids=ids, offsets=torch.zeros(0, dtype=torch.int64, device=ids.device), per_sample_weights=None)
        layout = row_ranges(weight) if dim == 0 else column_order(weight)
        if dim == 0:
            # How many of my ids each rank owns: the sizes of the row exchange, known to every rank
            # with the agreement instead of read from the device.
            # Each id goes to its owner only (NOTE [ Ids only to their owners ] in _routing.py).
            check_fits(ids.numel(), None)
            routed_rows = True
            if one_call:
                pass  # the one-call op buckets the ids itself
            elif fused:  # one op (NOTE [ Requester-side routing in one op ] in csrc/ops/embedding_ops.cpp)
                prepared = prepare(mine, layout, weight.size(0), index_dtype(weight), False, checks)
                words = prepared.words
            else:
                owner = owner_of_ids(ids, layout)
                words = words_for(owner, len(layout))
        arguments = lookup_arguments(padding_idx, max_norm, norm_type)
    except Exception as exc:  # noqa: BLE001 - raised on every rank by share_bags
        error, mine, arguments = exc, None, None
    if one_call and error is None:
        if dim == 0:
            out = rows_in_one_call(
                local, start, mine, weight, checks, EMBEDDING, padding_idx, arguments, layout, pg.group_name
            )
        else:
            out = columns_in_one_call(
                local, mine, weight, checks, EMBEDDING, padding_idx, arguments, layout, pg.group_name
            )
        return out.view(*input.shape, weight.size(1))
    shared = share_bags(mine, weight, error, "embedding", arguments, checks, words, share=not routed_rows)
    everyone = shared.bags
    group = pg.group_name
    dtype = local.dtype
    if dim == 0:
        end = start + local.size(0)
        if fused:
            routed = route_prepared(mine, prepared, shared.counts_in, shared.counts_out, None, start, group)
        else:
            routed = route(mine, owner, shared.counts_in, shared.counts_out, None, index_dtype(weight), group)
        if max_norm is not None:
            # The rows any rank looks up here, renormalised before the lookup (the dense op's order).
            renorm_rows_(local, routed.local_ids(start).long(), max_norm, norm_type, weight, dim)
        local_pad = padding_idx - start if padding_idx is not None and start <= padding_idx < end else None
        # One lookup of every requester's ids (NOTE [ One kernel per requester group ], _common.py),
        # each requester's rows back to it, placed where its ids were.
        rows = lookup_rows(local, routed, start, local_pad)
        back = send_back(rows, shared.counts_in, shared.counts_out, group)
        out = torch.zeros(mine.ids.numel(), weight.size(1), dtype=dtype, device=local.device)
        out = out.index_put((routed.perm,), back)
        return out.view(*input.shape, weight.size(1))

    if max_norm is not None:
        renorm_rows_(local, torch.cat([b.ids for b in everyone]), max_norm, norm_type, weight, dim)
    # One lookup for every requester's ids (NOTE [ One kernel per requester group ]).
    sizes = [bags.ids.numel() for bags in everyone]
    if local.size(1) and sum(sizes):
        all_ids = torch.cat([bags.ids for bags in everyone]) if len(everyone) > 1 else everyone[0].ids
        looked_up = F.embedding(all_ids, local, padding_idx=padding_idx)
    else:  # NOTE [ Empty shards reach no embedding kernel ] (_common.py)
        looked_up = zeros_from(local, sum(sizes))
    # The requesters' rows are consecutive in `looked_up`: sent as they lie, no copy.
    shapes = [(mine.ids.numel(), width_of(layout, rank)) for rank in range(len(everyone))]
    received = exchange_rows(looked_up, [size * looked_up.size(1) for size in sizes], shapes, group)
    blocks = [received[rank] for _, _, rank in layout]
    return torch.cat(blocks, dim=1).view(*input.shape, weight.size(1))
