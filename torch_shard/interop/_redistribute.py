"""torch_shard.interop.redistribute: a DTensor moved to other placements in one exchange.

``DTensor.redistribute`` changes placements one mesh dim at a time through collectives chosen per
pair (all-gather, then chunk; all-to-all for Shard(i) -> Shard(j) on some backends; several steps on
an n-D mesh). :func:`redistribute` describes the source and the target as boxes per mesh coordinate
(NOTE [ DTensor layouts as shard boxes ], ``_layouts.py``; Replicate mesh dims repeat a box) and moves
every element once per rank that needs it and lacks it, in one exchange over the mesh's group: the
op ``torch_shard._redistribute`` (NOTE [ Redistributing replicated layouts ],
``csrc/ops/redistribute.cpp``).

The layouts, and the change between two of them decided once per key (NOTE [ A placement change
decided once ]), are ``_layouts.py``'s; this module is the call: its checks, the Partial reduction,
and the one autograd Function that turns the moved local tensor into the result.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.distributed as dist

from .._support import _compile
from .._support import _torch_private as private
from .._support._agreement import abort_and_raise
from ._layouts import _OP, _default_group_for_mesh, _group_ranks, _move, _reduced_placements, _target_for

__all__ = ["redistribute"]


class _Redistribute(torch.autograd.Function):
    """DTensor to DTensor through a ``_layouts._Move``; redistribute's only autograd (the op
    ``torch_shard._redistribute`` has none of its own). Backward: the gradient (first brought to the
    forward's target placements by DTensor, should it arrive in others, e.g. Partial) moves back
    through the reverse move, itself this Function, so higher-order gradients flow too."""

    @staticmethod
    def forward(ctx, dtensor, move, group_name: str):
        ctx.move, ctx.group_name, ctx.source_spec = move, group_name, private.spec_of(dtensor)
        moved = move.forward(private.local_tensor(dtensor), group_name)
        return private.dtensor_with_spec(moved, move.spec, dtensor.requires_grad)

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
        ctx.spec = private.spec_of(dtensor)
        local = private.local_tensor(dtensor)
        return private.dtensor_with_spec(local.view_as(local), ctx.spec, True)

    @staticmethod
    def backward(ctx, grad):
        if tuple(grad.placements) != ctx.spec.placements:
            grad = grad.redistribute(grad.device_mesh, ctx.spec.placements)
        return grad


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
      (NOTE [ redistribute under torch.compile ] in ``torch_shard/_support/_compile.py``).

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
    if torch.compiler.is_compiling() and _compile.untraced_redistribute is not None:
        return _compile.untraced_redistribute(dtensor, device_mesh, placements)
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
    ranks = _group_ranks(group)
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
        dtensor = dtensor.redistribute(mesh, _reduced_placements(dtensor.placements, target))
    move = _move(size, dtensor.dtype, mesh, tuple(dtensor.placements), target, ranks)
    if move is None:
        if dtensor.requires_grad and torch.is_grad_enabled():
            return _Unchanged.apply(dtensor)
        return dtensor
    local = private.local_tensor(dtensor)
    if move.source.slices is not None and tuple(local.shape) != move.source.local_shape:
        mismatch = ValueError(
            f"torch_shard.interop.redistribute: the local tensor on rank {dist.get_rank()} has size "
            f"{list(local.shape)}, but its placements {list(dtensor.placements)} give it "
            f"{list(move.source.local_shape)}"
        )
        abort_and_raise(_OP, mismatch, group)
    return _Redistribute.apply(dtensor, move, group.group_name)


_compile.prepare_redistribute(_redistribute)
