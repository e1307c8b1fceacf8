"""torch.nn.functional.embedding with a ChunkShardingSpec-sharded weight (rows or columns)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..._support._agreement import abort_and_raise
from ..api import custom_sharding_spec_op
from ..chunk_sharding_spec import ChunkShardingSpec
from ._common import blocks, common_arguments, lookup_arguments, validate_common
from ._lookup import lookup, renorm


@custom_sharding_spec_op(ChunkShardingSpec, F.embedding)
def sharded_embedding(types, args, kwargs, pg):
    """Embedding lookup against a row- or column-sharded weight.

    Every rank passes its own input (any shape); each gets ``input.shape + (embedding_dim,)``, equal to
    the dense lookup. Row-wise: each owner sends back exactly the rows it holds for a requester's ids.
    Column-wise: each rank looks up every requester's ids in its column block, and the blocks are
    exchanged. ``max_norm`` renormalises, in place, every row any rank looks up by its full norm first,
    as dense does with the rows of its input.
    """
    kwargs = kwargs or {}
    input, weight, padding_idx, max_norm, norm_type = common_arguments(args, kwargs)
    try:
        # What can fail on this rank in Python fails here, before the C++ ops' agreement; the other ranks
        # then raise too (abort_and_raise takes part in it).
        local, _, dim = validate_common(input, weight, max_norm, kwargs, "Embedding", "embedding")
        if padding_idx is not None:
            if not -weight.size(0) <= padding_idx < weight.size(0):
                raise AssertionError("Padding_idx must be within num_embeddings")
            if padding_idx < 0:
                padding_idx += weight.size(0)
        # Ids as int64 for the op (an int64 id beyond int32 never wraps into range); it checks their
        # range on their device and sends them as int32 where the table allows.
        ids = input.reshape(-1).to(torch.int64)
        layout = blocks(weight, dim)
        arguments = lookup_arguments(padding_idx, max_norm, norm_type)
    except Exception as exc:  # noqa: BLE001 - raised on every rank
        abort_and_raise("share_inputs", exc, pg)
    if pg.size() == 1 and local.shape == weight.shape:
        # The whole table is this rank's shard: the dense op, its checks and its backward (NOTE [ One
        # rank holds the whole table ] in _lookup.py).
        return F.embedding(input, local, padding_idx, max_norm, norm_type)
    group = pg.group_name
    if max_norm is not None:
        renorm(local, ids, weight, dim, layout, max_norm, norm_type, arguments, group)
    out = lookup(local, ids, None, None, weight, dim, layout, "embedding", padding_idx, False, arguments, group)
    return out.view(*input.shape, weight.size(1))
