"""DTensor layouts: placements normalized, the box of every mesh coordinate, and a change between two
layouts decided once. :func:`~torch_shard.interop.to_dtensor`, :func:`~torch_shard.interop.from_dtensor`
and :func:`~torch_shard.interop.redistribute` read placements and meshes through this module alone.

NOTE [ DTensor layouts as shard boxes ]
DTensor splits a dim like ``torch.chunk``: ``ceil(n / k)`` elements per chunk, the trailing chunks
shorter or empty. Placements apply in mesh-dim order, so ``[Shard(0), Shard(0)]`` on a 2 x 2 mesh
splits dim 0 in two along mesh dim 0 and each half in two again along mesh dim 1. The box of the rank
at mesh coordinate ``c`` is therefore a pure function of the global size, the mesh shape and the
placements, which every rank computes for every coordinate without communicating. ChunkShardingSpec
uses the same split, so the non-empty boxes agree; empty boxes differ only in where they sit (DTensor
puts them at the end of the dim, ChunkShardingSpec at ``split * i``), which carries no data, so layouts
are compared on their non-empty boxes.

NOTE [ A placement change decided once ]
Everything about a change except the data is a function of (global size, dtype, mesh, source and
target placements, the group's ranks): the op's box arguments for both directions, whether each rank
already holds its target (then nothing is communicated), how a ``_StridedShard`` local tensor is cut
into boxes, the result's DTensorSpec. :func:`_move` computes that once per key (:class:`_Move`); a
redistribute then costs a cache lookup, the exchange, and one DTensor built straight from the moved
local tensor by one autograd Function (``_redistribute.py``), not ``to_local`` / ``from_local`` and
their two autograd Functions. Small tensors pay this per-op cost in full, where it is a large share of
a call's CPU time (docs/performance.md, "DTensor placement changes").
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
from collections.abc import Sequence

import torch
import torch.distributed as dist

from .._support import _native
from .._support import _torch_private as private
from ._common import Box

_OP = "redistribute"


def _chunk(length: int, chunks: int, index: int) -> tuple[int, int]:
    """(start, size) of chunk ``index`` of ``length`` elements split like ``torch.chunk`` (and like
    ChunkShardingSpec, whose chunk math this is), an empty chunk starting at the end."""
    offsets, lengths = _native.chunk_layout(length, chunks)
    return min(offsets[index], length), lengths[index]


def _normalize_placements(placements, mesh, ndim: int, op: str) -> list:
    """Placements with non-negative Shard dims; the errors a caller can act on for anything else."""
    from torch.distributed.tensor import Partial, Replicate
    from torch.distributed.tensor import Shard as DShard

    placements = list(placements)
    if len(placements) != mesh.ndim:
        raise ValueError(
            f"torch_shard.interop.{op}: expected one placement per mesh dim ({mesh.ndim}), but got "
            f"{len(placements)}: {placements}"
        )
    out = []
    for mesh_dim, placement in enumerate(placements):
        if isinstance(placement, private.StridedShard):
            raise NotImplementedError(
                f"torch_shard.interop.{op}: {placement} on mesh dim {mesh_dim} is not a box of the "
                f"tensor (strided shards interleave); redistribute to Shard or Replicate first"
            )
        if isinstance(placement, DShard):
            dim = placement.dim
            if not -ndim <= dim < ndim:
                raise IndexError(
                    f"torch_shard.interop.{op}: Shard(dim={dim}) on mesh dim {mesh_dim} is out of range "
                    f"for a {ndim}-D tensor"
                )
            out.append(DShard(dim % ndim))
        elif isinstance(placement, Replicate):
            out.append(placement)
        elif isinstance(placement, Partial):
            raise ValueError(
                f"torch_shard.interop.{op}: expected Shard or Replicate placements, but got {placement} "
                f"on mesh dim {mesh_dim}: a Partial DTensor holds unreduced values, not the tensor. "
                f"Call .redistribute(mesh, [...Replicate() or Shard(d)...]) first"
            )
        else:
            raise TypeError(
                f"torch_shard.interop.{op}: unknown placement {placement!r} on mesh dim {mesh_dim}"
            )
    return out


def _target_for(wanted: tuple, mesh, ndim: int) -> tuple:
    """A redistribute's target placements, normalized (non-negative Shard dims); ``_StridedShard``
    targets as given. Raises what a caller can act on for a Partial target or a bad placement list."""
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

    if any(isinstance(p, private.StridedShard) for p in wanted):
        return tuple(wanted)
    for mesh_dim, placement in enumerate(wanted):
        if isinstance(placement, Partial):
            raise ValueError(
                f"torch_shard.interop.redistribute: a Partial target placement (mesh dim {mesh_dim}) holds "
                f"unreduced values, not the tensor; use DTensor.redistribute for it"
            )
    return tuple(_normalize_placements(wanted, mesh, ndim, _OP))


def _reduced_placements(current: Sequence, target: Sequence) -> list:
    """``current`` with each Partial mesh dim reduced: to the target's Shard(d) on that mesh dim (DTensor
    reduce-scatters), else to Replicate (DTensor all-reduces)."""
    from torch.distributed.tensor import Replicate
    from torch.distributed.tensor import Shard as DShard

    return [
        (wanted if isinstance(wanted, DShard) else Replicate()) if placement.is_partial() else placement
        for placement, wanted in zip(current, target)
    ]


def _mesh_layout(size: Sequence[int], mesh, placements, replicas: bool = False) -> list[tuple[int, Box | None]]:
    """(global rank, box) for every mesh coordinate in row-major order; see NOTE [ DTensor layouts as
    shard boxes ]. Along a Replicate mesh dim only coordinate 0 owns its box (the others get None),
    unless ``replicas``: then every coordinate gets the box it holds a copy of."""
    from torch.distributed.tensor import Shard as DShard

    mesh_shape = tuple(mesh.mesh.shape)
    ranks = mesh.mesh.flatten().tolist()
    layout = []
    for pos, coord in enumerate(itertools.product(*(range(n) for n in mesh_shape))):
        offsets, sizes = [0] * len(size), list(size)
        owner = True
        for mesh_dim, placement in enumerate(placements):
            if isinstance(placement, DShard):
                start, length = _chunk(sizes[placement.dim], mesh_shape[mesh_dim], coord[mesh_dim])
                offsets[placement.dim] += start
                sizes[placement.dim] = length
            elif coord[mesh_dim] != 0 and not replicas:
                owner = False
        for d, length in enumerate(sizes):
            if length == 0:
                offsets[d] = size[d]
        layout.append((ranks[pos], (offsets, sizes) if owner else None))
    return layout


def _contiguous_strides(size: Sequence[int]) -> tuple[int, ...]:
    strides, acc = [], 1
    for length in reversed(list(size)):
        strides.append(acc)
        acc *= max(length, 1)
    return tuple(reversed(strides))


def _default_group_for_mesh(mesh, op: str = "from_dtensor"):
    """The process group of ``mesh``: its own on a 1-D mesh, the default group for an n-D mesh over
    every rank; ValueError otherwise (an n-D mesh has no single group)."""
    if mesh.ndim == 1:
        return mesh.get_group(0)
    # A mesh's ranks are distinct ranks of the default group, so it covers them all exactly when it has
    # as many; the size is what the layout gives directly (``mesh.mesh`` builds a tensor on every read,
    # and this runs on every redistribute).
    if dist.is_initialized() and mesh.size() == dist.get_world_size():
        return private.default_group()
    ranks = sorted(mesh.mesh.flatten().tolist())
    needs = "process_group=: a process group containing those ranks" if op == "from_dtensor" else "to cover every rank"
    raise ValueError(
        f"torch_shard.interop.{op}: a DTensor on a {mesh.ndim}-D mesh over ranks {ranks} needs {needs} "
        f"(the mesh has no single group)"
    )


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

    mesh_shape = tuple(mesh.mesh.shape)
    ranks = mesh.mesh.flatten().tolist()
    me = dist.get_rank()
    offsets, sizes, owners, mine = [], [], [], None
    for pos, coord in enumerate(itertools.product(*(range(n) for n in mesh_shape))):
        index = [torch.arange(n) for n in size]
        for mesh_dim, placement in enumerate(placements):
            if isinstance(placement, private.StridedShard):
                along = private.strided_shard(0, placement.split_factor)
            elif isinstance(placement, DShard):
                along = DShard(0)
            else:
                continue
            dim = placement.dim % len(size)
            pieces = private.split_indices(along, index[dim], mesh_shape[mesh_dim])
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
    """``local`` (this rank's tensor in ``source``) moved to ``target`` in one exchange. The op has no
    autograd of its own: its one caller is the forward of redistribute's autograd Function, where grad
    mode is off, so the op's Autograd key passes straight to its kernel."""
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
    if any(isinstance(p, private.StridedShard) for p in (*source, *target)):
        if source == target:
            return None
        side, narrow = _piece_side, None
    else:
        source = tuple(_normalize_placements(source, mesh, len(size), _OP))
        if source == target:
            return None
        side, narrow = _box_side, _local_slice(size, mesh, source, target)
    return _Move(
        list(size),
        side(size, mesh, source, group_ranks),
        side(size, mesh, target, group_ranks),
        narrow,
        private.dtensor_spec(mesh, target, size, _contiguous_strides(size), dtype),
    )
