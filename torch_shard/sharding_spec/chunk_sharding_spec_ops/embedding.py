"""torch.nn.functional.embedding with a ChunkShardingSpec-sharded weight (rows or columns)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..api import custom_sharding_spec_op
from ..chunk_sharding_spec import ChunkShardingSpec
from ._common import (
    Bags,
    column_order,
    exchange_chunks,
    lookup_arguments,
    renorm_rows_,
    row_ranges,
    share_bags,
    validate_common,
    width_of,
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
        ids = input.reshape(-1).to(torch.int64)
        mine = Bags(ids=ids, offsets=torch.zeros(0, dtype=torch.int64, device=ids.device), per_sample_weights=None)
        layout = row_ranges(weight) if dim == 0 else column_order(weight)
        arguments = lookup_arguments(padding_idx, max_norm, norm_type)
    except Exception as exc:  # noqa: BLE001 - raised on every rank by share_bags
        error, mine, arguments = exc, None, None
    everyone = share_bags(mine, weight, error, "embedding", arguments)
    group = pg.group_name
    dtype = local.dtype
    if dim == 0:
        end = start + local.size(0)
        if max_norm is not None:
            all_ids = torch.cat([b.ids for b in everyone])
            owned = all_ids[(all_ids >= start) & (all_ids < end)]
            renorm_rows_(local, owned - start, max_norm, norm_type, weight, dim)
        local_pad = padding_idx - start if padding_idx is not None and start <= padding_idx < end else None
        send = []
        for bags in everyone:
            owned = bags.ids[(bags.ids >= start) & (bags.ids < end)] - start
            send.append(F.embedding(owned, local, padding_idx=local_pad))
        # What each owner (by group rank) holds of my ids, in my ids' order: the row ranges tell.
        masks = [(mine.ids >= lo) & (mine.ids < hi) for lo, hi in layout]
        shapes = [(int(mask.sum()), local.size(1)) for mask in masks]
        received = exchange_chunks(send, shapes, group)
        out = torch.zeros(mine.ids.numel(), weight.size(1), dtype=dtype, device=local.device)
        for mask, rows in zip(masks, received):
            out = out.index_put((mask.nonzero().squeeze(1),), rows)
        return out.view(*input.shape, weight.size(1))

    if max_norm is not None:
        renorm_rows_(local, torch.cat([b.ids for b in everyone]), max_norm, norm_type, weight, dim)
    send = [F.embedding(bags.ids, local, padding_idx=padding_idx) for bags in everyone]
    shapes = [(mine.ids.numel(), width_of(layout, rank)) for rank in range(len(everyone))]
    received = exchange_chunks(send, shapes, group)
    blocks = [received[rank] for _, _, rank in layout]
    return torch.cat(blocks, dim=1).view(*input.shape, weight.size(1))
