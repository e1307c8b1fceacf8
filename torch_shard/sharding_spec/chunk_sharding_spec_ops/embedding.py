"""torch.nn.functional.embedding with a ChunkShardingSpec-sharded weight (rows or columns)."""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F

from ..api import custom_sharding_spec_op
from ..chunk_sharding_spec import ChunkShardingSpec
from ._common import Bags, column_order, exchange_chunks, local_weight, renorm_rows_, share_bags, validate_common


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
        validate_common(input, weight, max_norm, kwargs.get("scale_grad_by_freq", False), kwargs.get("sparse", False), "Embedding")
        local, start, dim = local_weight(weight, "embedding")
        if padding_idx is not None and padding_idx < 0:
            padding_idx += weight.size(0)
        ids = input.reshape(-1).to(torch.int64)
        mine = Bags(ids=ids, offsets=torch.zeros(0, dtype=torch.int64, device=ids.device), per_sample_weights=None)
    except Exception as exc:  # noqa: BLE001 - raised on every rank by share_bags
        error, mine = exc, None
    everyone = share_bags(mine, weight, error, "embedding")
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
        # What each owner holds of my ids, in my ids' order: I can tell by the row ranges alone.
        row_ranges = _row_ranges(weight)
        masks = [(mine.ids >= lo) & (mine.ids < hi) for lo, hi in row_ranges]
        shapes = [(int(mask.sum()), local.size(1)) for mask in masks]
        received = exchange_chunks(send, shapes, group)
        out = torch.zeros(mine.ids.numel(), weight.size(1), dtype=dtype, device=local.device)
        for mask, rows in zip(masks, received):
            out = out.index_put((mask.nonzero().squeeze(1),), rows)
        return out.view(*input.shape, weight.size(1))

    if max_norm is not None:
        renorm_rows_(local, torch.cat([b.ids for b in everyone]), max_norm, norm_type, weight, dim)
    send = [F.embedding(bags.ids, local, padding_idx=padding_idx) for bags in everyone]
    order = column_order(weight)
    shapes = [(mine.ids.numel(), _width_of(order, rank)) for rank in range(len(everyone))]
    received = exchange_chunks(send, shapes, group)
    blocks = [received[rank] for _, _, rank in order]
    return torch.cat(blocks, dim=1).view(*input.shape, weight.size(1))


def _row_ranges(weight) -> list[tuple[int, int]]:
    """(first row, end row) held by each rank of the weight's group (empty range for none)."""
    world = dist.get_world_size(weight._process_group)
    ranges = [(0, 0)] * world
    for md in weight.metadata().shards_metadata:
        ranges[md.placement.rank()] = (md.shard_offsets[0], md.shard_offsets[0] + md.shard_sizes[0])
    return ranges


def _width_of(order, rank: int) -> int:
    return sum(count for _, count, owner in order if owner == rank)
