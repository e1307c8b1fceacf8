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
    count_per_rank,
    exchange_chunks,
    lookup_arguments,
    owned_ids,
    owner_of_ids,
    renorm_rows_,
    row_ranges,
    share_bags,
    validate_common,
    width_of,
    zeros_from,
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
        check_ids_in_range(checks, ids, weight.size(0))
        mine = Bags(ids=ids, offsets=torch.zeros(0, dtype=torch.int64, device=ids.device), per_sample_weights=None)
        layout = row_ranges(weight) if dim == 0 else column_order(weight)
        if dim == 0:
            # How many of my ids each rank owns: the sizes of the row exchange, known to every rank
            # with the agreement instead of read from the device.
            owner = owner_of_ids(ids, layout)
            words = count_per_rank(owner, len(layout))
        arguments = lookup_arguments(padding_idx, max_norm, norm_type)
    except Exception as exc:  # noqa: BLE001 - raised on every rank by share_bags
        error, mine, arguments = exc, None, None
    shared = share_bags(mine, weight, error, "embedding", arguments, checks, words)
    everyone = shared.bags
    group = pg.group_name
    dtype = local.dtype
    if dim == 0:
        end = start + local.size(0)
        if max_norm is not None:
            # (Renormalising reads the rows to touch on the host, as the dense op does.)
            all_ids = torch.cat([b.ids for b in everyone])
            owned = all_ids[(all_ids >= start) & (all_ids < end)]
            renorm_rows_(local, owned - start, max_norm, norm_type, weight, dim)
        local_pad = padding_idx - start if padding_idx is not None and start <= padding_idx < end else None
        # One lookup for every requester's ids I own (NOTE [ One kernel per requester group ]), in rank
        # order and each requester's ids' order; how many per requester, each told me with the agreement.
        owned = sum(shared.counts_in)
        if owned and local.numel():
            all_ids = torch.cat([bags.ids for bags in everyone]) if len(everyone) > 1 else everyone[0].ids
            which, _ = owned_ids(all_ids, start, end, owned)
            rows = F.embedding(all_ids[which] - start, local, padding_idx=local_pad)
        else:  # NOTE [ Empty shards reach no embedding kernel ] (_common.py)
            rows = zeros_from(local, owned)
        shapes = [(count, local.size(1)) for count in shared.counts_out]
        received = exchange_chunks(list(rows.split(shared.counts_in)), shapes, group)
        # My ids grouped by owner, each group in my ids' order: where each owner's rows go.
        positions = torch.argsort(owner, stable=True)
        out = torch.zeros(mine.ids.numel(), weight.size(1), dtype=dtype, device=local.device)
        out = out.index_put((positions,), torch.cat(received) if len(received) > 1 else received[0])
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
    send = list(looked_up.split(sizes))
    shapes = [(mine.ids.numel(), width_of(layout, rank)) for rank in range(len(everyone))]
    received = exchange_chunks(send, shapes, group)
    blocks = [received[rank] for _, _, rank in layout]
    return torch.cat(blocks, dim=1).view(*input.shape, weight.size(1))
