"""torch_shard.interop.redistribute: a DTensor moved to other placements in one exchange.

``DTensor.redistribute`` changes placements one mesh dim at a time through collectives chosen per
pair (all-gather, then chunk; all-to-all for Shard(i) -> Shard(j) on some backends; several steps on
an n-D mesh). :func:`redistribute` describes the source and the target as boxes per mesh coordinate
(NOTE [ DTensor layouts as shard boxes ], ``_dtensor.py``; Replicate mesh dims repeat a box) and moves
every element once per rank that needs it and lacks it, in one exchange over the mesh's group: the
op ``torch_shard._redistribute`` (NOTE [ Redistributing replicated layouts ],
``csrc/ops/redistribute.cpp``).

NOTE [ A placement change decided once ]
Everything about a change except the data is a function of (global size, dtype, mesh, source and
target placements, the group's ranks): the op's box arguments for both directions, whether each rank
already holds its target (then nothing is communicated), how a ``_StridedShard`` local tensor is cut
into boxes, the result's DTensorSpec. ``_move`` computes that once per key (:class:`_Move`); a call
then costs a cache lookup, the exchange, and one DTensor built straight from the moved local tensor by
one autograd Function (:class:`_Redistribute`, as DTensor's own redistribute does), not
``to_local`` / ``from_local`` and their two autograd Functions. Small tensors pay this per-op cost in
full, where it is a large share of a call's CPU time (docs/performance.md, "DTensor placement changes").
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
from collections.abc import Sequence

import torch
import torch.distributed as dist

from .._after_dynamo import when_dynamo_imported
from .._agreement import abort_and_raise
from ._dtensor import _contiguous_strides, _default_group_for_mesh, _mesh_layout, _normalize_placements

__all__ = ["redistribute"]

_OP = "redistribute"


def _group_ranks(group) -> tuple[int, ...]:
    """The global ranks of ``group`` in group-rank order: what the cached layouts below are keyed by
    (not the group object, which a cache would keep alive past destroy_process_group)."""
    return tuple(dist.get_process_group_ranks(group))


@functools.lru_cache(maxsize=256)
def _layout_args(
    size: tuple[int, ...], mesh, placements: tuple, group_ranks: tuple[int, ...]
) -> tuple[torch.Tensor, torch.Tensor, list[int]]:
    """(offsets, sizes, owners) of every mesh coordinate's box for ``torch_shard._redistribute``: one row
    per coordinate in row-major order, replicas included, owners as group ranks."""
    layout = _mesh_layout(size, mesh, placements, replicas=True)
    offsets = torch.tensor([box[0] for _, box in layout], dtype=torch.int64).view(len(layout), len(size))
    sizes = torch.tensor([box[1] for _, box in layout], dtype=torch.int64).view(len(layout), len(size))
    owners = [group_ranks.index(rank) for rank, _ in layout]
    return offsets, sizes, owners


def _local_slice(size: tuple[int, ...], mesh, source: tuple, target: tuple) -> tuple[slice, ...] | None:
    """Where this rank's target box lies in its source box, when no rank of the mesh needs an element
    it does not hold (Replicate -> Shard, and every change that only narrows what each rank holds);
    None when an exchange is needed. Decided from the layouts alone, the same on every rank."""
    src = _mesh_layout(size, mesh, source, replicas=True)
    dst = _mesh_layout(size, mesh, target, replicas=True)
    me = dist.get_rank()
    mine = None
    for (rank, (s_off, s_len)), (_, (d_off, d_len)) in zip(src, dst):
        if any(n == 0 for n in d_len):
            index = tuple(slice(0, n) for n in d_len)
        elif all(so <= do and do + dn <= so + sn for so, sn, do, dn in zip(s_off, s_len, d_off, d_len)):
            index = tuple(slice(do - so, do - so + dn) for so, do, dn in zip(s_off, d_off, d_len))
        else:
            return None
        if rank == me:
            mine = index
    return mine


def _runs(index: list[int]) -> list[tuple[int, int, int]]:
    """(global start, length, local start) of each run of consecutive values in ``index``."""
    runs: list[tuple[int, int, int]] = []
    for local, value in enumerate(index):
        if runs and runs[-1][0] + runs[-1][1] == value:
            start, length, at = runs[-1]
            runs[-1] = (start, length + 1, at)
        else:
            runs.append((value, 1, local))
    return runs


@dataclasses.dataclass(frozen=True, eq=False)
class _Side:
    """One layout of an exchange: every box's (offsets, sizes, owners) as the op takes them, and how
    this rank's local tensor (``local_shape``) is cut into its boxes and put together from them:
    ``slices`` holds the local slice of each box, or is None where the local tensor is its one box."""

    offsets: torch.Tensor
    sizes: torch.Tensor
    owners: list[int]
    local_shape: tuple[int, ...]
    slices: tuple[tuple[slice, ...], ...] | None = None

    def cut(self, local: torch.Tensor) -> list[torch.Tensor]:
        if self.slices is None:
            return [local]
        return [local[index].contiguous() for index in self.slices]

    def assemble(self, pieces: list[torch.Tensor], like: torch.Tensor) -> torch.Tensor:
        if self.slices is None or (len(pieces) == 1 and tuple(pieces[0].shape) == self.local_shape):
            return pieces[0]
        out = like.new_empty(self.local_shape)
        for index, piece in zip(self.slices, pieces):
            out[index] = piece
        return out


def _box_side(size: tuple[int, ...], mesh, placements: tuple, group_ranks: tuple[int, ...]) -> _Side:
    """A Shard/Replicate layout: one box per rank, the local tensor itself."""
    offsets, sizes, owners = _layout_args(size, mesh, placements, group_ranks)
    me = group_ranks.index(dist.get_rank())
    return _Side(offsets, sizes, owners, tuple(sizes[owners.index(me)].tolist()))


def _piece_side(size: tuple[int, ...], mesh, placements: tuple, group_ranks: tuple[int, ...]) -> _Side:
    """A layout with ``_StridedShard``: a local tensor is then several boxes of the tensor
    (interleaved pieces of a dim). Per mesh coordinate, the global indices it holds along each dim are
    found by applying each placement's own split (torch's ``_split_tensor``) to index vectors, mesh dim
    by mesh dim as ``distribute_tensor`` does; each product of runs of consecutive indices is a box, in
    coordinate order, then local order (the op's source and target order)."""
    from torch.distributed.tensor import Shard as DShard
    from torch.distributed.tensor.placement_types import _StridedShard

    mesh_shape = tuple(mesh.mesh.shape)
    ranks = mesh.mesh.flatten().tolist()
    me = dist.get_rank()
    offsets, sizes, owners, mine = [], [], [], None
    for pos, coord in enumerate(itertools.product(*(range(n) for n in mesh_shape))):
        index = [torch.arange(n) for n in size]
        for mesh_dim, placement in enumerate(placements):
            if isinstance(placement, _StridedShard):
                along = _StridedShard(0, split_factor=placement.split_factor)
            elif isinstance(placement, DShard):
                along = DShard(0)
            else:
                continue
            dim = placement.dim % len(size)
            pieces, _ = along._split_tensor(index[dim], mesh_shape[mesh_dim], with_padding=False, contiguous=False)
            index[dim] = pieces[coord[mesh_dim]] if coord[mesh_dim] < len(pieces) else index[dim][:0]
        runs = [_runs(ix.tolist()) for ix in index]
        slices = []
        for combo in itertools.product(*runs):
            offsets.append([start for start, _, _ in combo])
            sizes.append([length for _, length, _ in combo])
            owners.append(group_ranks.index(ranks[pos]))
            slices.append(tuple(slice(at, at + length) for _, length, at in combo))
        if ranks[pos] == me:
            mine = (tuple(len(ix) for ix in index), tuple(slices))
    n = len(offsets)
    return _Side(
        torch.tensor(offsets, dtype=torch.int64).view(n, len(size)),
        torch.tensor(sizes, dtype=torch.int64).view(n, len(size)),
        owners,
        *mine,
    )


def _exchange(local: torch.Tensor, size: list[int], source: _Side, target: _Side, group_name: str) -> torch.Tensor:
    """``local`` (this rank's tensor in ``source``) moved to ``target`` in one exchange. Called from
    :class:`_Redistribute`, which is the autograd: the op runs below its own autograd kernel, which
    would only find grad mode off and add a Python call to every redistribute."""
    with torch._C._AutoDispatchBelowAutograd():
        pieces = torch.ops.torch_shard._redistribute(
            source.cut(local), local, size, source.offsets, source.sizes, source.owners, target.offsets,
            target.sizes, target.owners, group_name,
        )
    return target.assemble(pieces, local)


@dataclasses.dataclass(frozen=True, eq=False)
class _Move:
    """A placement change of one (size, dtype, mesh, placements, ranks), decided once (NOTE [ A
    placement change decided once ]): both layouts, ``narrow`` (this rank's target part of its own
    local tensor, where no rank needs an element it does not hold; then nothing is communicated
    forward), and the result's spec."""

    size: list[int]
    source: _Side
    target: _Side
    narrow: tuple[slice, ...] | None
    spec: object  # DTensorSpec

    def forward(self, local: torch.Tensor, group_name: str) -> torch.Tensor:
        if self.narrow is not None:
            return local[self.narrow].contiguous()
        return _exchange(local, self.size, self.source, self.target, group_name)

    def reverse(self, spec) -> _Move:
        """The move back to this move's source, whose DTensors have ``spec``: the reverse exchange, also
        after a narrow (a Replicate source gets the whole gradient on every replica, as in DTensor)."""
        return _Move(self.size, self.target, self.source, None, spec)


@functools.lru_cache(maxsize=256)
def _move(
    size: tuple[int, ...], dtype: torch.dtype, mesh, source: tuple, target: tuple, group_ranks: tuple[int, ...]
) -> _Move | None:
    """The :class:`_Move` from a DTensor's ``source`` placements (none Partial) to ``target`` (from
    :func:`_target_for`), or None where they are the same layout."""
    from torch.distributed.tensor._dtensor_spec import DTensorSpec, TensorMeta
    from torch.distributed.tensor.placement_types import _StridedShard

    if any(isinstance(p, _StridedShard) for p in (*source, *target)):
        if source == target:
            return None
        side, narrow = _piece_side, None
    else:
        source = tuple(_normalize_placements(source, mesh, len(size), _OP))
        if source == target:
            return None
        side, narrow = _box_side, _local_slice(size, mesh, source, target)
    meta = TensorMeta(torch.Size(size), _contiguous_strides(size), dtype)
    return _Move(
        list(size),
        side(size, mesh, source, group_ranks),
        side(size, mesh, target, group_ranks),
        narrow,
        DTensorSpec(mesh, target, tensor_meta=meta),
    )


class _Redistribute(torch.autograd.Function):
    """DTensor to DTensor through a :class:`_Move`. Backward: the gradient (first brought to the
    forward's target placements by DTensor, should it arrive in others, e.g. Partial) moves back
    through the reverse move, itself this Function, so higher-order gradients flow too."""

    @staticmethod
    def forward(ctx, dtensor, move: _Move, group_name: str):
        from torch.distributed.tensor import DTensor

        ctx.move, ctx.group_name, ctx.source_spec = move, group_name, dtensor._spec
        moved = move.forward(dtensor._local_tensor, group_name)
        return DTensor(moved, move.spec, requires_grad=dtensor.requires_grad)

    @staticmethod
    def backward(ctx, grad):
        move = ctx.move
        if tuple(grad.placements) != move.spec.placements:
            grad = grad.redistribute(grad.device_mesh, move.spec.placements)
        return _Redistribute.apply(grad, move.reverse(ctx.source_spec), ctx.group_name), None, None


class _Unchanged(torch.autograd.Function):
    """A redistribute to the placements ``dtensor`` already has, where autograd records it: the same
    local tensor forward; backward, the gradient brought to those placements (a Partial gradient is
    reduced), as every other redistribute's backward gives its source's placements."""

    @staticmethod
    def forward(ctx, dtensor):
        from torch.distributed.tensor import DTensor

        ctx.spec = dtensor._spec
        return DTensor(dtensor._local_tensor.view_as(dtensor._local_tensor), dtensor._spec, requires_grad=True)

    @staticmethod
    def backward(ctx, grad):
        if tuple(grad.placements) != ctx.spec.placements:
            grad = grad.redistribute(grad.device_mesh, ctx.spec.placements)
        return grad


def _target_for(wanted: tuple, mesh, ndim: int) -> tuple:
    """The target placements, normalized (non-negative Shard dims); ``_StridedShard`` targets as given.
    Raises what a caller can act on for a Partial target or a bad placement list."""
    try:
        hash(wanted)
    except TypeError:
        return _checked_target(list(wanted), mesh, ndim)  # raises, naming the placement that is no Placement
    return _cached_target(wanted, mesh, ndim)


@functools.lru_cache(maxsize=256)
def _cached_target(wanted: tuple, mesh, ndim: int) -> tuple:
    return _checked_target(wanted, mesh, ndim)


def _checked_target(wanted, mesh, ndim: int) -> tuple:
    from torch.distributed.tensor import Partial
    from torch.distributed.tensor.placement_types import _StridedShard

    if any(isinstance(p, _StridedShard) for p in wanted):
        return tuple(wanted)
    for mesh_dim, placement in enumerate(wanted):
        if isinstance(placement, Partial):
            raise ValueError(
                f"torch_shard.interop.redistribute: a Partial target placement (mesh dim {mesh_dim}) holds "
                f"unreduced values, not the tensor; use DTensor.redistribute for it"
            )
    return tuple(_normalize_placements(wanted, mesh, ndim, _OP))


def _reduce_partials(dtensor, target: Sequence):
    """``dtensor`` with its Partial mesh dims reduced by DTensor: to the target's Shard(d) on that mesh
    dim (a reduce-scatter), else to Replicate (an all-reduce)."""
    from torch.distributed.tensor import Replicate
    from torch.distributed.tensor import Shard as DShard

    reduced = []
    for current, wanted in zip(dtensor.placements, target):
        if current.is_partial():
            reduced.append(wanted if isinstance(wanted, DShard) else Replicate())
        else:
            reduced.append(current)
    return dtensor.redistribute(dtensor.device_mesh, reduced)


# NOTE [ redistribute under torch.compile ]
# redistribute moves data in an exchange over the mesh's group, which a graph cannot hold (the op's fake
# kernel raises), and dynamo tracing into it stops with an internal error. So, as for ShardedTensor's
# ops (NOTE [ ShardedTensor under torch.compile ]), dynamo breaks the graph at the call and runs it
# eagerly: under compilation the call goes to ``_untraced``, the implementation wrapped in
# ``torch._dynamo.disable`` once torch._dynamo is imported (torch_shard/_after_dynamo.py). In eager mode
# the test is one flag read. The gradient flows through the eager part as in eager mode;
# ``fullgraph=True`` raises torch._dynamo.exc.Unsupported naming GRAPH_BREAK_REASON, before any rank
# communicates.
GRAPH_BREAK_REASON = (
    "torch_shard.interop.redistribute cannot be traced (it moves data in one exchange over the mesh's "
    "group); it runs eagerly, outside the graph"
)
_untraced = None


def _prepare_for_compile(dynamo) -> None:
    global _untraced
    _untraced = dynamo.disable(_redistribute, reason=GRAPH_BREAK_REASON)


def redistribute(dtensor, device_mesh=None, placements: Sequence | None = None):
    """``dtensor`` moved to ``placements`` in one exchange over its mesh's group.

    Example (on each of 4 ranks)::

        mesh = init_device_mesh("cpu", (4,))
        rows = distribute_tensor(torch.randn(10, 6), mesh, [Shard(0)])
        cols = torch_shard.interop.redistribute(rows, mesh, [Shard(1)])  # as rows.redistribute(mesh, [Shard(1)])

    Behaviour:

    * Any change between ``Shard(d)`` and ``Replicate()`` placements, on 1-D and n-D meshes, with even or
      uneven sizes (split as ``torch.chunk``, as in DTensor), is one all-to-all that sends each element
      once to each rank that needs it and lacks it. A rank keeps what it already holds; a replicated
      source box is sent by the target rank's own copy, else by one replica per target, spread over the
      replicas. ``_StridedShard`` (FSDP2 + TP) on either side moves in one exchange too.
    * ``Partial`` source placements are first reduced by DTensor: to the target's ``Shard(d)`` on that
      mesh dim, else to ``Replicate()``.
    * Where no element changes rank (the same placements; ``Replicate`` -> ``Shard``; any change that only
      narrows what each rank holds) nothing is communicated: each rank takes its part of its own local
      tensor (a view where that part is contiguous), and a rank whose placements differ from its peers'
      is not detected.
    * Differentiable: the backward moves the gradient with the reverse exchange (a ``Replicate`` output's
      gradient is taken to be the same on every replica).
    * Collective: every rank of the mesh calls it. An n-D mesh must cover every rank of the default group
      (its group is then the default one); a 1-D mesh may be any sub-group. A rank outside the mesh gets
      an empty local tensor, as in DTensor.
    * Under ``torch.compile`` the call breaks the graph and runs eagerly
      (NOTE [ redistribute under torch.compile ]).

    Args:
        dtensor (DTensor): the tensor to move.
        device_mesh (DeviceMesh, optional): must be ``dtensor``'s own mesh.
        placements (Sequence[Placement], optional): one per mesh dim; by default ``dtensor``'s own.

    Returns:
        DTensor: on the same mesh, with ``placements``: ``dtensor`` itself when ``placements`` are its own
        and autograd does not record the call, else a new DTensor whose gradient comes back in ``dtensor``'s placements
        (a ``Partial`` one reduced, as in DTensor).

    Raises:
        TypeError: ``dtensor`` is not a DTensor, or a placement is not a Placement.
        ValueError: a ``Partial`` target, a placement list whose length is not the mesh's ndim, or a local
            tensor whose size does not match its placements.
        IndexError: a ``Shard`` dim out of range.
        NotImplementedError: ``device_mesh`` is another mesh (as in DTensor).

        An error in ``device_mesh``, ``placements`` or a local tensor on any rank raises on every rank
        of the mesh before any data moves.
    """
    if torch.compiler.is_compiling() and _untraced is not None:
        return _untraced(dtensor, device_mesh, placements)
    return _redistribute(dtensor, device_mesh, placements)


def _redistribute(dtensor, device_mesh, placements):
    from torch.distributed.tensor import DTensor

    if not isinstance(dtensor, DTensor):
        raise TypeError(
            f"torch_shard.interop.redistribute: expected a DTensor, but got {type(dtensor).__module__}."
            f"{type(dtensor).__qualname__}"
        )
    mesh = dtensor.device_mesh
    group = _default_group_for_mesh(mesh, _OP)
    size = tuple(dtensor.shape)
    if mesh.get_coordinate() is None:
        # Not a rank of the mesh: nothing to move, an empty local tensor (as DTensor gives such ranks).
        target = list(placements) if placements is not None else list(dtensor.placements)
        empty = torch.empty(0, dtype=dtensor.dtype, device=dtensor.device)
        return DTensor.from_local(empty, mesh, target, run_check=False, shape=dtensor.shape, stride=dtensor.stride())
    try:
        if device_mesh is not None and device_mesh is not mesh and device_mesh != mesh:
            raise NotImplementedError(
                "torch_shard.interop.redistribute: moving a DTensor to another device mesh is not supported "
                f"(as in DTensor.redistribute); device_mesh must be the DTensor's own mesh, {mesh}"
            )
        target = _target_for(tuple(dtensor.placements if placements is None else placements), mesh, len(size))
    except (ValueError, TypeError, IndexError, NotImplementedError) as exc:
        abort_and_raise(_OP, exc, group)
    if any(p.is_partial() for p in dtensor.placements):
        dtensor = _reduce_partials(dtensor, target)
    move = _move(size, dtensor.dtype, mesh, tuple(dtensor.placements), target, _group_ranks(group))
    if move is None:
        if dtensor.requires_grad and torch.is_grad_enabled():
            return _Unchanged.apply(dtensor)
        return dtensor
    local = dtensor._local_tensor
    if move.source.slices is not None and tuple(local.shape) != move.source.local_shape:
        mismatch = ValueError(
            f"torch_shard.interop.redistribute: the local tensor on rank {dist.get_rank()} has size "
            f"{list(local.shape)}, but its placements {list(dtensor.placements)} give it "
            f"{list(move.source.local_shape)}"
        )
        abort_and_raise(_OP, mismatch, group)
    return _Redistribute.apply(dtensor, move, group.group_name)


when_dynamo_imported(_prepare_for_compile, "torch_shard.interop.redistribute")
