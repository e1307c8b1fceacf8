"""torch_shard.interop.redistribute: a DTensor moved to other placements in one exchange.

``DTensor.redistribute`` changes placements one mesh dim at a time through collectives chosen per
pair (all-gather, then chunk; all-to-all for Shard(i) -> Shard(j) on some backends; several steps on
an n-D mesh). :func:`redistribute` describes the source and the target as boxes per mesh coordinate
(NOTE [ DTensor layouts as shard boxes ], ``_dtensor.py``; Replicate mesh dims repeat a box) and moves
every element once per rank that needs it and lacks it, in one exchange over the mesh's group: the
op ``torch_shard._redistribute`` (NOTE [ Redistributing replicated layouts ],
``csrc/ops/redistribute.cpp``), whose backward is the same op with the layouts swapped.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

import torch
import torch.distributed as dist

from .._agreement import abort_and_raise
from ._dtensor import _contiguous_strides, _default_group_for_mesh, _mesh_layout, _normalize_placements

__all__ = ["redistribute"]

_OP = "redistribute"


@functools.lru_cache(maxsize=256)
def _layout_args(size: tuple[int, ...], mesh, placements: tuple, group) -> tuple[torch.Tensor, torch.Tensor, list[int]]:
    """(offsets, sizes, owners) of every mesh coordinate's box for ``torch_shard._redistribute``: one row
    per coordinate in row-major order, replicas included, owners as ranks of ``group``."""
    layout = _mesh_layout(size, mesh, placements, replicas=True)
    offsets = torch.tensor([box[0] for _, box in layout], dtype=torch.int64).view(len(layout), len(size))
    sizes = torch.tensor([box[1] for _, box in layout], dtype=torch.int64).view(len(layout), len(size))
    owners = [dist.get_group_rank(group, rank) for rank, _ in layout]
    return offsets, sizes, owners


def _target_placements(placements, mesh, ndim: int) -> list:
    from torch.distributed.tensor import Partial

    placements = list(placements)
    for mesh_dim, placement in enumerate(placements):
        if isinstance(placement, Partial):
            raise ValueError(
                f"torch_shard.interop.redistribute: a Partial target placement (mesh dim {mesh_dim}) holds "
                f"unreduced values, not the tensor; use DTensor.redistribute for it"
            )
    return _normalize_placements(placements, mesh, ndim, _OP)


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


def redistribute(dtensor, device_mesh=None, placements: Sequence | None = None):
    """``dtensor`` with ``placements``, moved by torch_shard's exchange: one all-to-all over the mesh's
    group that sends each element once to each rank that needs it and does not hold it.

    The arguments mirror ``DTensor.redistribute``. Every change between ``Shard(d)`` and ``Replicate()``
    placements, on 1-D and n-D meshes, even and uneven sizes (split as ``torch.chunk``, as DTensor
    does), moves in one exchange: a rank keeps what it already holds, a replicated source box is sent
    by the replica nearest the need (the target rank's own copy, else one replica per target, spread
    over the replicas). Differentiable: the backward moves the gradient back with the reverse exchange,
    as ``DTensor.redistribute``'s backward does (a Replicate output's gradient is taken as the same on
    every replica).

    ``Partial`` source placements are first reduced by DTensor (to the target's ``Shard(d)`` on that mesh
    dim, else to ``Replicate()``); a ``Partial`` target raises ValueError. ``_StridedShard`` on either
    side goes through ``DTensor.redistribute`` itself.

    Args:
        dtensor (DTensor): the tensor to move.
        device_mesh (DeviceMesh, optional): must be ``dtensor``'s own mesh (as in DTensor, moving to
            another mesh is not supported).
        placements (Sequence[Placement], optional): one per mesh dim; by default ``dtensor``'s own.

    Returns:
        DTensor: on the same mesh, with ``placements``; ``dtensor`` itself when they are its own.

    Collective over the mesh's group (every rank of the mesh calls it). Bad arguments on any rank (a
    placement list of the wrong length, a dim out of range, another mesh, a local tensor that does not
    match its shard) raise on every rank of the mesh before any data moves. An n-D mesh must cover every
    rank of the default group (its group is then the default one); a 1-D mesh may be any sub-group.
    """
    from torch.distributed.tensor import DTensor
    from torch.distributed.tensor.placement_types import _StridedShard

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
        if device_mesh is not None and device_mesh != mesh:
            raise NotImplementedError(
                "torch_shard.interop.redistribute: moving a DTensor to another device mesh is not supported "
                f"(as in DTensor.redistribute); device_mesh must be the DTensor's own mesh, {mesh}"
            )
        wanted = list(dtensor.placements) if placements is None else list(placements)
        if any(isinstance(p, _StridedShard) for p in (*wanted, *dtensor.placements)):
            strided = True
        else:
            strided = False
            target = _target_placements(wanted, mesh, len(size))
    except (ValueError, TypeError, IndexError, NotImplementedError) as exc:
        abort_and_raise(_OP, exc, group)
    if strided:
        return dtensor.redistribute(mesh, wanted)
    if any(p.is_partial() for p in dtensor.placements):
        dtensor = _reduce_partials(dtensor, target)
    source = _normalize_placements(dtensor.placements, mesh, len(size), _OP)
    if source == target:
        return dtensor
    src_offsets, src_sizes, src_owners = _layout_args(size, mesh, tuple(source), group)
    dst_offsets, dst_sizes, dst_owners = _layout_args(size, mesh, tuple(target), group)
    local = dtensor.to_local()
    (moved,) = torch.ops.torch_shard._redistribute(
        [local], local, list(size), src_offsets, src_sizes, src_owners, dst_offsets, dst_sizes, dst_owners,
        group.group_name,
    )
    return DTensor.from_local(
        moved, mesh, target, run_check=False, shape=dtensor.shape, stride=_contiguous_strides(size)
    )
