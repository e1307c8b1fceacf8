"""Shared machinery of the sharded embedding ops: validation, agreement, autograd-aware exchanges.

Every rank calls the op with its own input. The flow is:

1. local checks of this rank's input (ids, offsets, per-sample weights, devices: the dense op's
   exception types and messages where it has them) and everything else that can fail (the owners'
   group ranks), then ONE C++ data op (``torch.ops.torch_shard._share_inputs``) that agrees (a bad
   input on any rank raises on every rank instead of hanging the others) and gives every rank every
   rank's packed input (ids, offsets, per-sample weights), small inputs in the agreement round itself
   (column-wise; a row-wise lookup only agrees there, and sends each id to its owner alone: NOTE [ Ids
   only to their owners ] in _routing.py).
   Checks that need the input's VALUES (ids in range, offsets well formed) and the counts of this
   rank's ids per owner are computed on the input's device and read by the host only with the
   agreement (:class:`InputChecks`; NOTE [ One host read per exchange ] in csrc/comm/exchange.cpp): on
   a GPU the whole forward reads device memory on the host once, in that op.
   Received inputs were checked by their sender, so the later steps have no argument errors left;
2. each rank computes, for every requester, what its weight shard contributes;
3. one all-to-all returns the contributions to their requesters (autograd-aware: the op's registered
   backward is the reverse all-to-all, so gradients reach the weight shard that produced each contribution). Its
   counts come from the inputs every rank now holds, so it needs no agreement of its own.
"""

from __future__ import annotations

from collections.abc import Callable
import math
from dataclasses import dataclass
from math import prod

import torch
import torch.distributed as dist

from ..._agreement import _class_code
from ...sharded_tensor import _state
from ...sharded_tensor._movement import abort_and_raise
from ...sharded_tensor.utils import _PlacementResolver
from ..chunk_sharding_spec import ChunkShardingSpec

_ops = torch.ops.torch_shard


def exchange_rows(
    flat: torch.Tensor, send_counts: list[int], recv_shapes: list[tuple], group_name: str
) -> list[torch.Tensor]:
    """Send rank p the ``send_counts[p]`` elements of ``flat`` after those of the ranks before it (the
    chunks lie consecutively in one tensor, so they go as they lie, copied into no buffer) and receive
    from each rank p a tensor of ``recv_shapes[p]``."""
    flat = flat.reshape(-1)
    recv_counts = [prod(shape) for shape in recv_shapes]
    # Autograd-aware: the op's registered backward is the reverse all-to-all (torch_shard/_op_registrations.py).
    received = _ops._all_to_all(flat, send_counts, recv_counts, group_name)
    return [piece.view(shape) for piece, shape in zip(received.split(recv_counts), recv_shapes)]


@dataclass
class Bags:
    """One rank's lookups as flat ids plus bag offsets (no trailing offset)."""

    ids: torch.Tensor  # int64 [n]
    offsets: torch.Tensor  # int64 [num_bags]
    per_sample_weights: torch.Tensor | None  # [n] or None

    @property
    def num_bags(self) -> int:
        return self.offsets.numel()

    def bag_of_id(self) -> torch.Tensor:
        """The bag of every id (offsets start at 0 and do not decrease, as checked). From bucketize, not
        repeat_interleave, whose output size the host would have to read from the device."""
        positions = torch.arange(self.ids.numel(), device=self.ids.device)
        return torch.bucketize(positions, self.offsets, right=True) - 1


def local_weight(weight, op_name: str):
    """(the single local shard tensor, its offset along the sharded dim, the sharded dim)."""
    shards = weight.local_shards()
    if len(shards) != 1:
        raise ValueError("Only one local shard supported!")
    spec = weight.sharding_spec()
    if not isinstance(spec, ChunkShardingSpec):
        raise ValueError("Only ChunkShardingSpec supported for ShardedTensor ops!")
    dim = spec.dim % weight.dim() if weight.dim() else spec.dim
    if dim not in (0, 1):
        raise RuntimeError(f"nn.Embedding weight sharded on dim {dim} not supported!")
    return shards[0].tensor, shards[0].metadata.shard_offsets[dim], dim


def check_index_dtype(tensor: torch.Tensor, arg: str, op_name: str) -> None:
    """Ids and offsets are int64 or int32, as for the dense ops (and with their message)."""
    if tensor.dtype not in (torch.int64, torch.int32):
        raise RuntimeError(
            f"Expected tensor for argument #1 '{arg}' to have one of the following scalar types: Long, Int; "
            f"but got {tensor.type()} instead (while checking arguments for {op_name})"
        )


def check_device(local: torch.Tensor, tensor: torch.Tensor, arg: str) -> None:
    """Every input lives where this rank's weight shard does (the dense ops' rule for their weight)."""
    if tensor.device != local.device:
        raise RuntimeError(
            f"Expected all tensors to be on the same device, but found at least two devices, "
            f"{local.device} and {tensor.device}! ({arg} is on {tensor.device}, this rank's weight shard "
            f"on {local.device})"
        )


class InputChecks:
    """Checks of this rank's input that need its values, computed on the input's device.

    Each check is a 0-dim bool tensor (True: failed) with the exception class it raises. ``status()``
    folds them into one int64 error code (the first failed check's, from the one error table) that
    travels with the agreement, so the host learns the verdict in the read it makes anyway; only when
    a check failed does this rank run the checks again on the host (``raise_first``), to raise the
    dense op's exception with its message.
    """

    def __init__(self) -> None:
        self._checks: list[tuple[torch.Tensor | None, type[BaseException], Callable[[], None]]] = []
        self._status: torch.Tensor | None = None

    def add(
        self, failed: torch.Tensor | None, error_class: type[BaseException], raise_on_host: Callable[[], None]
    ) -> None:
        """``failed`` None: a check computed elsewhere (a C++ op's status, :meth:`set_status`); it must be
        added before every check that status does not fold in, so ``raise_first`` keeps the order."""
        self._checks.append((failed, error_class, raise_on_host))

    def set_status(self, status: torch.Tensor) -> None:
        """The folded status, computed by a C++ op (NOTE [ Requester-side routing in one op ])."""
        self._status = status

    def status(self, device: torch.device) -> torch.Tensor | None:
        if self._status is not None:
            return self._status
        checks = [(failed, error_class) for failed, error_class, _ in self._checks if failed is not None]
        if not checks:
            return None
        # The last check's code where it failed (else 0), then each earlier one's over it: the first
        # failed check's code.
        failed, error_class = checks[-1]
        code = failed.to(device) * _class_code(error_class)
        for failed, error_class in reversed(checks[:-1]):
            code = torch.where(failed.to(device), _class_code(error_class), code)
        return code

    def raise_first(self) -> None:
        for _, _, raise_on_host in self._checks:
            raise_on_host()
        raise RuntimeError("torch_shard: an input check failed on the device but not on the host; please report this")


def check_ids_in_range(checks: InputChecks, ids: torch.Tensor, num_embeddings: int, on_device: bool = True) -> None:
    """Every id in [0, num_embeddings), as a device-side check (the message names the range seen).
    ``on_device=False``: the check itself is torch_shard._bucket_ids' (its status), only the host's
    message is added here."""

    def raise_on_host() -> None:
        if ids.numel():
            low, high = (int(v) for v in torch.aminmax(ids))
            if low < 0 or high >= num_embeddings:
                raise ValueError(f"Index out of range in Input {low} {high} {num_embeddings}")

    # An id is in range iff clamping it to the range leaves it unchanged (three ops, not five).
    failed = None
    if on_device:  # an empty table: every id is out of range
        failed = (ids.clamp(0, num_embeddings - 1) != ids).any() if num_embeddings else (ids == ids).any()
    checks.add(failed, ValueError, raise_on_host)


def fused_routing(device: torch.device) -> bool:
    """Whether a row-wise requester prepares its ids with torch_shard._bucket_ids (one CPU op) rather
    than the ATen composition (every other device): NOTE [ Requester-side routing in one op ]."""
    return device.type == "cpu" and FUSED_ROUTING


# Tests turn it off to run the composition other devices take on the CPU too.
FUSED_ROUTING = True


def validate_common(input, weight, max_norm, scale_grad_by_freq, sparse, op_name: str, fn_name: str):
    """Checks shared by embedding and embedding_bag, on this rank's arguments, before any exchange.
    Only what the host knows (types, shapes, devices, flags); the ids' values are checked on their
    device (:func:`check_ids_in_range`).

    Returns :func:`local_weight`'s (local shard, offset, sharded dim). ``op_name`` is the module's name
    ("Embedding"), ``fn_name`` the function's ("embedding"), as they appear in the messages.
    """
    from ...sharded_tensor import ShardedTensor

    if not isinstance(input, torch.Tensor):
        raise TypeError("input need to be torch.Tensor")
    if not isinstance(weight, ShardedTensor):
        raise TypeError("weight needs to be ShardedTensor")
    if len(weight.size()) != 2:
        raise ValueError("Weight needs to have exactly 2 dims")
    if scale_grad_by_freq:
        raise RuntimeError(f'nn.{op_name} weight sharded with flag on "scale_grad_by_freq" not supported!')
    if sparse:
        raise RuntimeError(f'nn.{op_name} weight sharded with flag on "sparse" not supported!')
    if max_norm is not None and max_norm <= 0:
        raise ValueError('"max_norm" must be larger than zero!')
    local, start, dim = local_weight(weight, fn_name)
    check_index_dtype(input, "indices", fn_name)
    check_device(local, input, "input")
    return local, start, dim


def owner_ranks(weight) -> list[int]:
    """Group rank of the owner of each entry of ``weight.metadata().shards_metadata``.

    Placements name global ranks or RPC workers; the exchanges index by rank of the weight's process
    group, so every owner goes through the group's placement resolver (a sub-group's ranks 1 and 3
    are its ranks 0 and 1; "worker1/cpu" is whichever group rank worker 1 is).
    """
    resolver = _PlacementResolver(weight._process_group)
    return [resolver.owner(md.placement) for md in weight.metadata().shards_metadata]


_MODE_CODES = {"sum": 0.0, "mean": 1.0, "max": 2.0}


def lookup_arguments(
    padding_idx: int | None, max_norm: float | None, norm_type: float, mode: str | None = None
) -> list[float]:
    """The scalars with which this rank computes the OTHER ranks' lookups, for the agreement in
    :func:`share_bags`: every rank must pass the same (different ones would give silently different
    results, or, with max_norm on some ranks only, a collective the others do not run).

    ``padding_idx`` is the normalised one (non-negative) or None; ``norm_type`` counts only with a
    ``max_norm``, as for the dense op. None maps to -1, which no valid value takes.
    """
    return [
        -1.0 if padding_idx is None else float(padding_idx),
        -1.0 if max_norm is None else float(max_norm),
        0.0 if max_norm is None else float(norm_type),
        -1.0 if mode is None else _MODE_CODES[mode],
    ]


@dataclass
class Shared:
    """What :func:`share_bags` gives every rank."""

    bags: list[Bags]  # every rank's bags, by group rank
    counts_in: list[int]  # per rank r: the word r sent here (e.g. how many of r's ids this rank owns)
    counts_out: list[int]  # this rank's words, by rank (e.g. how many of this rank's ids r owns)


def share_bags(
    bags: Bags,
    weight,
    error: BaseException | None,
    op_name: str,
    arguments: list[float] | None = None,
    checks: InputChecks | None = None,
    words: torch.Tensor | None = None,
    share: bool = True,
) -> Shared:
    """Give every rank every rank's bags, after agreeing (raising on every rank if any rank's input
    was rejected, by the host or by ``checks`` on its device, or if the ranks' ``arguments``, from
    :func:`lookup_arguments`, differ): one C++ data op. ``words`` (int64 [world], on the device) are
    told to the ranks with the agreement; see :class:`Shared`. With ``share=False`` the ranks only agree
    and tell their words (``bags`` of the result is empty): row-wise lookups route ids themselves."""
    pg = weight._process_group
    if error is not None:
        abort_and_raise("share_inputs", error, pg)
    has_psw = bags.per_sample_weights is not None
    parts = [bags.offsets, bags.ids]
    if has_psw:
        parts.append(bags.per_sample_weights.detach().reshape(-1))
    if not share:
        # Agreement (and words) only: one empty part on the inputs' device (NOTE [ Ids only to their
        # owners ] in _routing.py). The per-sample weights' presence is still agreed (flags).
        parts = [bags.ids[:0]]
    status = checks.status(bags.ids.device) if checks is not None else None
    received, info = _ops._share_inputs.with_words(
        parts, _state.read_state(weight).layout_fp, int(has_psw), pg.group_name, arguments or [], status, words
    )
    if info[0] != 0:
        checks.raise_first()  # this rank's input failed on its device; every other rank raises naming it
    world = dist.get_world_size(pg)
    counts_in, counts_out = info[1 : 1 + world], info[1 + world :]
    if not share:
        return Shared([], counts_in, counts_out)
    width = len(parts)
    everyone = [
        Bags(
            ids=received[r * width + 1],
            offsets=received[r * width],
            per_sample_weights=received[r * width + 2] if has_psw else None,
        )
        for r in range(len(received) // width)
    ]
    return Shared(everyone, counts_in, counts_out)


def column_order(weight) -> list[tuple[int, int, int]]:
    """(column offset, column count, owner's group rank) of every column shard, by column offset."""
    return sorted(
        (md.shard_offsets[1], md.shard_sizes[1], owner)
        for md, owner in zip(weight.metadata().shards_metadata, owner_ranks(weight))
    )


def row_ranges(weight) -> list[tuple[int, int]]:
    """(first row, end row) held by each rank of the weight's group, by group rank (empty for none)."""
    ranges = [(0, 0)] * dist.get_world_size(weight._process_group)
    for md, owner in zip(weight.metadata().shards_metadata, owner_ranks(weight)):
        if md.shard_sizes[0]:
            ranges[owner] = (md.shard_offsets[0], md.shard_offsets[0] + md.shard_sizes[0])
    return ranges


def _host_to_device(host: torch.Tensor, device: torch.device) -> torch.Tensor:
    """``host`` (a small CPU tensor built from Python values) on ``device`` without a host sync: a copy
    from pageable memory to a GPU waits for the stream, one from pinned memory does not."""
    host = host.contiguous()
    if device.type != "cuda":
        return host.to(device)
    return host.pin_memory().to(device, non_blocking=True)


def owner_of_ids(ids: torch.Tensor, ranges: list[tuple[int, int]]) -> torch.Tensor:
    """The group rank that owns each id (ids must be in range), on the ids' device."""
    owned = sorted((lo, rank) for rank, (lo, hi) in enumerate(ranges) if hi > lo)
    if not owned:
        return torch.zeros_like(ids)
    # One [2, n] table (starts; ranks), rows contiguous: bucketize warns about strided boundaries.
    starts, ranks = _host_to_device(torch.tensor(owned, dtype=torch.int64).t(), ids.device)
    # Row ranges tile [0, rows): the last start <= id is the range of id.
    return ranks[(torch.bucketize(ids, starts, right=True) - 1).clamp(min=0)]


def count_per_rank(owner: torch.Tensor, world: int) -> torch.Tensor:
    """How many entries of ``owner`` name each rank (int64 [world], on the device; no host read)."""
    counts = torch.zeros(world, dtype=torch.int64, device=owner.device)
    return counts.index_add_(0, owner, torch.ones_like(owner))


def width_of(order: list[tuple[int, int, int]], rank: int) -> int:
    """Columns group rank ``rank`` holds, from :func:`column_order`."""
    return sum(count for _, count, owner in order if owner == rank)


# NOTE [ One kernel per requester group ]
# What a shard contributes to every requester comes from ONE lookup kernel over all requesters' ids
# (ATen's embedding / embedding_bag, whose backward is one kernel too), not one call per requester: a
# call costs a launch and its host time on a GPU whatever its size, and W of them grow with the ranks.
# Row-wise, the kernel sees only the ids routed to the shard, already local rows (NOTE [ Ids only to
# their owners ] in _routing.py). Max mode is the exception: its winner must be the first owned id of
# the bag holding the maximum, with its position (NOTE [ Max ties ] in csrc/ops/embedding_ops.cpp),
# which ATen's kernel does not report, so it takes torch_shard._embedding_bag_partial, once, over the
# group.


def requester_group(everyone: list[Bags]) -> Bags:
    """Every requester's bags as ONE set of bags, so a shard's contribution to all of them is one
    kernel call (NOTE [ One kernel per requester group ]): ids concatenated in rank order, offsets
    shifted by the ids before them. Requesters without bags are left out (their ids belong to no bag;
    they told every owner a count of 0)."""
    pooling = [bags for bags in everyone if bags.num_bags]
    if len(pooling) == 1:
        return pooling[0]
    if not pooling:
        empty = everyone[0].offsets.new_zeros(0)
        return Bags(ids=empty, offsets=empty, per_sample_weights=None)
    offsets, shift = [], 0
    for bags in pooling:
        offsets.append(bags.offsets + shift if shift else bags.offsets)
        shift += bags.ids.numel()
    psw = None
    if pooling[0].per_sample_weights is not None:
        psw = torch.cat([bags.per_sample_weights for bags in pooling])
    return Bags(ids=torch.cat([bags.ids for bags in pooling]), offsets=torch.cat(offsets), per_sample_weights=psw)


def zeros_from(local: torch.Tensor, rows: int) -> torch.Tensor:
    """``[rows, local.size(1)]`` zeros computed from ``local`` by no lookup kernel: what a shard that
    holds nothing a lookup needs contributes (an empty shard, or none of the ids), with autograd still
    giving the shard its (zero) gradient, as the dense op gives every row one.

    NOTE [ Empty shards reach no embedding kernel ]
    An empty shard is a normal state (6 columns over 4 ranks leave one a 13 x 0 chunk; a ceil split
    can leave a 0-row one), and PyTorch's CUDA embedding / embedding_bag backward kernels cannot take
    an empty weight (an illegal memory access that poisons the CUDA context). So the sharded ops never
    call an ATen embedding kernel on an empty weight, or with no ids at all (the host knows both:
    shapes, and the counts told with the agreement); the shard's contribution is then this: a sum over
    zero rows (a fill, no lookup), broadcast. tests/test_embedding_kernels.py records what the kernels
    get on every rank.
    """
    return local.narrow(0, 0, 0).sum(0, keepdim=True).expand(rows, local.size(1))


def renorm_rows_(local: torch.Tensor, rows: torch.Tensor, max_norm: float, norm_type: float, weight, dim: int) -> None:
    """In-place max_norm renormalisation of the looked-up ``rows`` of the local shard, using each
    row's FULL norm (summed over column shards for a column-sharded weight)."""
    rows = torch.unique(rows).long()  # column-wise ids may be int32: index_copy_ takes int64
    with torch.no_grad():
        if dim == 0:
            if local.numel():  # NOTE [ Empty shards reach no embedding kernel ]
                torch.embedding_renorm_(local, rows, max_norm, norm_type)
            return
        # Column shards: every rank holds a slice of each row. The row's p-norm combines the slices':
        # a sum of |w|^p for a finite p (then its p-th root), the largest |w| for p = inf, the
        # smallest for -inf, a count of non-zeros for p = 0 (torch.norm's meanings). A rank with an
        # empty chunk contributes the combination's identity, but joins it.
        pg = weight._process_group
        magnitudes = local.index_select(0, rows).abs().double()
        if math.isinf(norm_type):
            identity = 0.0 if norm_type > 0 else math.inf
            reduce = torch.amax if norm_type > 0 else torch.amin
            part = reduce(magnitudes, dim=1) if local.size(1) else magnitudes.new_full((rows.numel(),), identity)
        elif norm_type == 0:
            part = (magnitudes != 0).sum(dim=1, dtype=torch.float64)
        else:
            part = magnitudes.pow(norm_type).sum(dim=1)
        # Every rank holds the same `rows` (from the same shared inputs) and the agreement checked that
        # every rank renormalises, so the combination needs no agreement of its own. A max or min over
        # the ranks: each rank's parts in its own row of a sum.
        if math.isinf(norm_type):
            slots = part.new_zeros(dist.get_world_size(pg), part.numel())
            slots[dist.get_rank(pg)] = part
            everyone = _ops._sum_over_ranks(slots, pg.group_name)
            part = everyone.amax(dim=0) if norm_type > 0 else everyone.amin(dim=0)
        else:
            part = _ops._sum_over_ranks(part, pg.group_name)
        if not local.numel():
            return
        norms = part if math.isinf(norm_type) or norm_type == 0 else part.pow(1.0 / norm_type)
        scale = torch.where(norms > max_norm, max_norm / (norms + 1e-7), torch.ones_like(norms))
        local.index_copy_(0, rows, local.index_select(0, rows) * scale.unsqueeze(1).to(local.dtype))
