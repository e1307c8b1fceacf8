"""Row-wise sharded lookups with each id sent only to the rank that owns its row.

NOTE [ Ids only to their owners ]
A row-wise requester sorts its ids by owner (stably: each owner's ids stay in the requester's order),
and sends owner o only the ids o holds, plus, for embedding_bag, how many of them each of its bags
has (o's per-bag lengths): one all-to-all of ids and lengths (and one of per-sample weights when
given). Each owner then looks all its requesters' ids up in ONE kernel (NOTE [ One kernel per
requester group ] in _common.py) and sends each requester only its bags' partial results (its rows'
lookups, for embedding), which the requester combines. Per rank and forward the ids part sends its
own ids once plus one length per bag per owner, whatever the number of ranks; every rank's ids used
to reach every rank.

The sizes of both all-to-alls are known to every rank without reading device memory: the count of a
requester's ids for each owner travels with the agreement (``words``), and so, for embedding_bag,
does the requester's number of bags (the high 32 bits of the same word: ``_BAGS_SHIFT``).

F.embedding and F.embedding_bag (every mode) without max_norm run the whole protocol, forward and
backward, as ONE C++ call each (:func:`._one_call.rows_in_one_call`; NOTE [ A row-wise lookup in one
call ] in csrc/ops/rowwise_lookup.cpp). max_norm composes it here: on the CPU the requester's side
(owners, per-bag lengths, the ids in owner order with the lengths after them, the words, the ids'
range check and mean's divisors) is one C++ op, and the owner's unpacking of what it received another
(:func:`prepare`, :func:`route_prepared`; NOTE [ Requester-side routing in one op ] in
csrc/ops/embedding_ops.cpp); other devices take the ATen composition (:func:`owner_of_ids`,
:func:`bag_lengths`, :func:`route`), which reads no device memory on the host.

Ids travel as int32 when the table has fewer than 2**31 rows (ATen's kernels take int32 ids and
offsets), as int64 otherwise.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ._common import Bags, _host_to_device, count_per_rank, zeros_from

_ops = torch.ops.torch_shard

_BAGS_SHIFT = 32
_LOW = (1 << _BAGS_SHIFT) - 1


def index_dtype(weight) -> torch.dtype:
    """The dtype ids and lengths travel in: the same on every rank (the weight's size is agreed)."""
    return torch.int32 if weight.size(0) <= torch.iinfo(torch.int32).max else torch.int64


def words_for(owner: torch.Tensor, world: int) -> torch.Tensor:
    """What an embedding requester tells each owner with the agreement: how many of its ids it holds."""
    return count_per_rank(owner, world)


def bag_lengths(bags: Bags, owner: torch.Tensor, world: int, dtype: torch.dtype) -> torch.Tensor:
    """lengths[o, b]: how many ids of bag b owner o holds ([world, num_bags], on the ids' device)."""
    num_bags = bags.num_bags
    key = owner * num_bags + bags.bag_of_id() if num_bags else owner
    lengths = torch.zeros(world * num_bags, dtype=dtype, device=owner.device)
    return lengths.index_add_(0, key, torch.ones_like(key, dtype=dtype)).view(world, num_bags)


def bag_words_for(lengths: torch.Tensor) -> torch.Tensor:
    """What an embedding_bag requester tells each owner with the agreement: how many of its ids the
    owner holds, and its number of bags in the high bits. The caller checked (:func:`check_fits`)
    that both fit."""
    return lengths.sum(dim=1, dtype=torch.int64) + (lengths.size(1) << _BAGS_SHIFT)


def check_fits(num_ids: int, num_bags: int | None) -> None:
    """The words hold counts below 2**32 and bag counts below 2**31, and max-mode winners travel as
    int32 positions among a requester's ids (raised before the agreement, so on every rank)."""
    if num_ids >= 1 << 31 or (num_bags is not None and num_bags >= 1 << 31):
        raise ValueError(
            f"torch_shard: a row-wise sharded lookup takes fewer than 2**31 ids and 2**31 bags per rank, got "
            f"{num_ids} ids and {num_bags} bags"
        )


def decode(words: list[int], bags: bool) -> tuple[list[int], list[int]]:
    """(counts, bag counts) from the words of :func:`words_for` (bag counts 0 without bags)."""
    if not bags:
        return list(words), [0] * len(words)
    return [w & _LOW for w in words], [w >> _BAGS_SHIFT for w in words]


@dataclass
class Routed:
    """What one owner received from its requesters, and what it needs to send results back."""

    ids: torch.Tensor  # every requester's ids this rank owns, in rank order (index dtype)
    offsets: torch.Tensor | None  # embedding_bag: bag offsets into ``ids`` (index dtype)
    per_sample_weights: torch.Tensor | None
    counts_in: list[int]  # ids from each requester
    bags_in: list[int]  # bags of each requester
    perm: torch.Tensor  # requester side: its ids in owner order (positions in its ids)
    counts_out: list[int]  # requester side: its ids per owner
    start: int = 0  # what was already subtracted from ``ids`` (the shard's first row, or 0)

    def local_ids(self, start: int) -> torch.Tensor:
        """``ids`` less the shard's first row ``start``."""
        return self.ids if self.start == start else self.ids - (start - self.start)


@dataclass
class Prepared:
    """A requester's ids prepared for routing by torch_shard._bucket_ids (NOTE [ Requester-side
    routing in one op ] in csrc/ops/embedding_ops.cpp)."""

    send: torch.Tensor  # per owner: its ids, then (bags) its per-bag lengths
    perm: torch.Tensor  # positions of the ids in owner order
    words: torch.Tensor  # told to the owners with the agreement
    divisors: torch.Tensor  # mean's per bag: its ids other than the padding id, at least 1 (int64)


def prepare(
    mine: Bags,
    ranges: list[tuple[int, int]],
    num_embeddings: int,
    dtype: torch.dtype,
    bags: bool,
    checks,
    padding_idx: int | None = None,
) -> Prepared:
    """One CPU op: owners, per-bag lengths, the ids in owner order with the lengths, the words, and the
    ids' range check folded into ``checks``' status (which it then is)."""
    from ..._agreement import _class_code

    send, perm, words, status, divisors = _ops._bucket_ids(
        mine.ids,
        mine.offsets if bags else None,
        [row for pair in ranges for row in pair],
        num_embeddings,
        dtype == torch.int32,
        _class_code(ValueError),
        checks.status(mine.ids.device),
        -1 if padding_idx is None else padding_idx,
    )
    checks.set_status(status)
    return Prepared(send, perm, words, divisors)


def route_prepared(
    mine: Bags,
    prepared: Prepared,
    counts_in: list[int],
    counts_out: list[int],
    bags_in: list[int] | None,
    start: int,
    group: str,
) -> Routed:
    """:func:`route` for ids :func:`prepare` laid out: one all-to-all, then one op that unpacks the
    received ids (less ``start``) and offsets."""
    world = len(counts_out)
    num_bags = mine.num_bags if bags_in is not None else 0
    got = _ops._all_to_all(
        prepared.send,
        [count + num_bags for count in counts_out],
        [count + bags for count, bags in zip(counts_in, bags_in or [0] * world)],
        group,
    )
    if bags_in is None:
        return Routed(got, None, None, counts_in, [0] * world, prepared.perm, counts_out)
    ids, offsets = _ops._unpack_routed(got, counts_in, bags_in, start)
    psw = None
    if mine.per_sample_weights is not None:
        psw = _ops._all_to_all(mine.per_sample_weights.index_select(0, prepared.perm), counts_out, counts_in, group)
    return Routed(ids, offsets, psw, counts_in, bags_in, prepared.perm, counts_out, start)


def route(
    mine: Bags,
    owner: torch.Tensor,
    counts_in: list[int],
    counts_out: list[int],
    bags_in: list[int] | None,
    dtype: torch.dtype,
    group: str,
    lengths: torch.Tensor | None = None,
) -> Routed:
    """Send each of this rank's ids to its owner (with its per-bag ``lengths``, from
    :func:`bag_lengths`, when ``bags_in`` is given) and receive the ids this rank owns; one all-to-all
    (plus one for per-sample weights)."""
    world = len(counts_out)
    perm = torch.argsort(owner, stable=True)
    ids = mine.ids.index_select(0, perm).to(dtype)
    if bags_in is None:
        received = _ops._all_to_all(ids, counts_out, counts_in, group)
        return Routed(received, None, None, counts_in, [0] * world, perm, counts_out)
    num_bags = mine.num_bags
    pieces = [piece for o, part in enumerate(ids.split(counts_out)) for piece in (part, lengths[o])]
    received = _ops._all_to_all(
        torch.cat(pieces),
        [count + num_bags for count in counts_out],
        [count + bags for count, bags in zip(counts_in, bags_in)],
        group,
    )
    parts = received.split([size for pair in zip(counts_in, bags_in) for size in pair])
    got_ids = torch.cat(parts[0::2]) if world > 1 else parts[0]
    got_lengths = torch.cat(parts[1::2]) if world > 1 else parts[1]
    offsets = torch.cumsum(got_lengths, 0, dtype=dtype) - got_lengths
    psw = None
    if mine.per_sample_weights is not None:
        psw = _ops._all_to_all(mine.per_sample_weights.index_select(0, perm), counts_out, counts_in, group)
    return Routed(got_ids, offsets, psw, counts_in, bags_in, perm, counts_out)


def lookup_rows(local: torch.Tensor, routed: Routed, start: int, padding_idx: int | None) -> torch.Tensor:
    """Owner side of embedding: every requester's owned ids in one F.embedding."""
    owned = sum(routed.counts_in)
    if not owned or not local.numel():  # NOTE [ Empty shards reach no embedding kernel ] (_common.py)
        return zeros_from(local, owned)
    return F.embedding(routed.local_ids(start), local, padding_idx=padding_idx)


def pool_sum(local: torch.Tensor, routed: Routed, start: int, padding_idx: int | None) -> torch.Tensor:
    """Owner side of embedding_bag sum / mean: each bag's sum over the ids this rank holds (times the
    per-sample weights), for every requester's bags in ONE ATen embedding_bag."""
    if not sum(routed.counts_in) or not local.numel():  # NOTE [ Empty shards reach no embedding kernel ]
        return zeros_from(local, sum(routed.bags_in))
    return F.embedding_bag(
        routed.local_ids(start),
        local,
        routed.offsets,
        mode="sum",
        per_sample_weights=routed.per_sample_weights,
        padding_idx=padding_idx,
    )


def pool_max(local: torch.Tensor, routed: Routed, start: int, padding_idx: int | None):
    """Owner side of embedding_bag max: (each bag's max over the ids this rank holds, the winners'
    positions among the ids its requester sent here, -1 for none); ``padding_idx`` is the shard's row,
    as for :func:`pool_sum`: torch_shard._embedding_bag_partial
    once over every requester's bags (NOTE [ Max ties ] in csrc/ops/embedding_ops.cpp)."""
    total_bags, owned = sum(routed.bags_in), sum(routed.counts_in)
    if not owned or not local.numel():  # NOTE [ Empty shards reach no embedding kernel ] (_common.py)
        none = torch.full((total_bags, local.size(1)), -1, dtype=torch.int64, device=local.device)
        return zeros_from(local, total_bags), none
    pad = -1 if padding_idx is None else padding_idx
    pooled, where = _ops._embedding_bag_partial(
        local, routed.local_ids(start).long(), routed.offsets.long(), None, 0, "max", pad, True, owned
    )
    # Positions among each requester's own ids sent here: less the ids of the requesters before it.
    counts = torch.tensor(routed.counts_in, dtype=torch.int64)
    # (On the host, from host lists; the output size is given, so no device would ever be asked.)
    firsts = torch.repeat_interleave(counts.cumsum(0) - counts, torch.tensor(routed.bags_in), output_size=total_bags)
    return pooled, torch.where(where >= 0, where - _host_to_device(firsts, local.device).unsqueeze(1), where)


def send_back(values: torch.Tensor, send_rows: list[int], recv_rows: list[int], group: str) -> torch.Tensor:
    """Rows ``values`` [sum(send_rows), dim] back to their requesters (``send_rows[r]`` to r, in rank
    order); returns the [sum(recv_rows), dim] rows received, by owner (autograd: the reverse)."""
    dim = values.size(1)
    received = _ops._all_to_all(
        values.reshape(-1), [rows * dim for rows in send_rows], [rows * dim for rows in recv_rows], group
    )
    return received.view(-1, dim)


def bags_back(pooled: torch.Tensor, routed: Routed, num_bags: int, group: str) -> torch.Tensor:
    """Each requester's bags' partial results to it; returns [owners, num_bags, dim] here."""
    owners = len(routed.bags_in)
    back = send_back(pooled, routed.bags_in, [num_bags] * owners, group)
    return back.view(owners, num_bags, pooled.size(1))


def positions_back(where: torch.Tensor, routed: Routed, num_bags: int, group: str) -> torch.Tensor:
    """The owners' winners (:func:`pool_max`) back to their requesters, as positions in the requester's
    ids: [owners, num_bags, dim], -1 for none."""
    # As int32 (positions among fewer than 2**31 ids: check_fits): half the bytes of int64.
    back = bags_back(where.to(torch.int32), routed, num_bags, group).long()
    if not routed.perm.numel():
        return back  # no ids: every position is -1
    counts = torch.tensor(routed.counts_out, dtype=torch.int64)
    firsts = _host_to_device(counts.cumsum(0) - counts, back.device).view(-1, 1, 1)
    held = back >= 0
    return torch.where(held, routed.perm[torch.where(held, back + firsts, 0)], back)
