"""Conversions between torch_shard's ShardedTensor and DTensor, sharing local tensors.

* :func:`to_dtensor` wraps a ShardedTensor as a ``DTensor`` on a device mesh. When the tensor already
  has the layout the DTensor placements describe (``Shard(d)`` on a 1-D mesh in rank order is
  ``ChunkShardingSpec(dim=d)`` over the mesh's ranks in mesh order; on an n-D mesh the matching grid of
  boxes), each rank's shard becomes the DTensor's local tensor. Otherwise the data is resharded once
  into that layout first (the argument is left untouched).
* :func:`from_dtensor` wraps a ``DTensor``'s local tensor as the local shard of a ShardedTensor.

The layouts themselves (placements, boxes per mesh coordinate: NOTE [ DTensor layouts as shard
boxes ]) are ``_layouts.py``'s.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.distributed as dist

from .._support import _native
from .._support import _torch_private as private
from .._support._agreement import abort_and_raise
from .._support._placement import _PlacementResolver
from .._support._tensor_metadata import ShardedTensorMetadata, TensorProperties
from ..metadata import ShardMetadata
from ..sharded_tensor import Shard, ShardedTensor, init_from_local_shards
from ..sharding_spec import ChunkShardingSpec, EnumerableShardingSpec
from ._common import Box, is_empty, require_sharded_tensor
from ._layouts import _contiguous_strides, _default_group_for_mesh, _mesh_layout, _normalize_placements

__all__ = ["from_dtensor", "to_dtensor"]


def _rank_device(rank: int, device_type: str, known: dict[int, torch.device]) -> str:
    """The device of ``rank`` for a placement string: one it already uses, else the mesh's convention
    (``cpu``, or accelerator ``rank % device_count``)."""
    if rank in known:
        return str(known[rank])
    if device_type == "cpu":
        return "cpu"
    return f"{device_type}:{rank % torch.get_device_module(device_type).device_count()}"


def _mesh_device(mesh) -> torch.device:
    if mesh.device_type == "cpu":
        return torch.device("cpu")
    return torch.device(mesh.device_type, torch.get_device_module(mesh.device_type).current_device())


def _layout_by_rank(st: ShardedTensor) -> tuple[dict[int, list[Box]], dict[int, torch.device]]:
    """Non-empty boxes of ``st`` per global rank, and the device each rank's shards are on."""
    resolve = _PlacementResolver(st._process_group)
    boxes: dict[int, list[Box]] = {}
    devices: dict[int, torch.device] = {}
    for md in st.metadata().shards_metadata:
        rank, device = resolve(md.placement)
        devices.setdefault(rank, device)
        if not is_empty(md.shard_sizes):
            boxes.setdefault(rank, []).append((list(md.shard_offsets), list(md.shard_sizes)))
    return boxes, devices


def to_dtensor(st: ShardedTensor, device_mesh, placements: Sequence):
    """A ``DTensor`` on ``device_mesh`` with ``placements`` holding the values of ``st``.

    Example (``st`` chunked along dim 0 over the mesh's 2 ranks, as :func:`from_dtensor` gives it)::

        dt = torch_shard.interop.to_dtensor(st, init_device_mesh("cpu", (2,)), [Shard(0)])  # zero-copy

    Zero-copy when ``st`` already has the layout the placements describe: ``Shard(d)`` on a 1-D mesh is
    ``ChunkShardingSpec(dim=d)`` placed on the mesh's ranks in mesh order, and on an n-D mesh each rank
    holds the box its mesh coordinate gets (for example ``[Shard(0), Shard(1)]`` on a 2 x 2 mesh is a
    2 x 2 grid of blocks). Then each rank's non-empty shard is the DTensor's local tensor (through
    ``DTensor.from_local``, so the DTensor's ``to_local()`` shares its memory and autograd connects
    the two); empty shards may sit anywhere. Otherwise a NEW ShardedTensor over the same local shards
    is resharded into that layout first (one all-to-all over ``st``'s process group; ``st`` itself is
    not modified), and its shards become the local tensors.

    ``Replicate()`` placements are reached from the sharded layout in which the replicated mesh dims
    split the tensor's largest dim not already split, followed by ``DTensor.redistribute`` (an
    all-gather); the result does not share memory with ``st``.

    Args:
        st (ShardedTensor): the tensor to convert; its devices must be of the mesh's device type.
        device_mesh (DeviceMesh): the mesh of the result. Its ranks (global ranks) must belong to
            ``st``'s process group.
        placements (Sequence[Placement]): one ``Shard(d)`` or ``Replicate()`` per mesh dim.

    Returns:
        DTensor: with ``st``'s global size and dtype.

    Collective over ``st``'s process group when a reshard or a redistribute is needed (every rank of
    the group must call it then); decided from the global metadata, identically on every rank. Ranks
    outside the mesh get a DTensor with an empty local tensor, as ``distribute_tensor`` gives them.
    """
    from torch.distributed.tensor import DTensor
    from torch.distributed.tensor import Shard as DShard

    require_sharded_tensor(st, "to_dtensor")
    size = list(st.size())
    ndim = len(size)
    placements = _normalize_placements(placements, device_mesh, ndim, "to_dtensor")
    current, devices = _layout_by_rank(st)
    device_types = {device.type for device in devices.values()}
    if device_types and device_types != {device_mesh.device_type}:
        raise ValueError(
            f"torch_shard.interop.to_dtensor: expected shards on '{device_mesh.device_type}' devices (the "
            f"mesh's device type), but got shards on {sorted(device_types)}"
        )

    sharded = list(placements)
    if any(not isinstance(p, DShard) for p in placements):
        split = {p.dim for p in placements if isinstance(p, DShard)}
        free = [d for d in range(ndim) if d not in split] or list(range(ndim))
        fill = max(free, key=lambda d: size[d])
        sharded = [p if isinstance(p, DShard) else DShard(fill) for p in placements]

    layout = _mesh_layout(size, device_mesh, sharded)
    target = {rank: box for rank, box in layout}
    matches = all(
        current.get(rank, []) == ([box] if not is_empty(box[1]) else []) for rank, box in layout
    ) and all(rank in target for rank in current)

    me = dist.get_rank()
    source = st
    if not matches:
        placement = {
            rank: f"rank:{rank}/{_rank_device(rank, device_mesh.device_type, devices)}" for rank, _ in layout
        }
        if device_mesh.ndim == 1:
            spec = ChunkShardingSpec(dim=sharded[0].dim, placements=[placement[rank] for rank, _ in layout])
        else:
            spec = EnumerableShardingSpec(
                [ShardMetadata(list(box[0]), list(box[1]), placement[rank]) for rank, box in layout]
            )
        md = st.metadata()
        source = ShardedTensor._init_from_local_shards_and_global_metadata(
            list(st.local_shards()),
            ShardedTensorMetadata(list(md.shards_metadata), md.size, md.tensor_properties),
            process_group=st._process_group,
            sharding_spec=st.sharding_spec(),
        )
        source.reshard(spec)

    props = st.metadata().tensor_properties
    local_shards = [s for s in source.local_shards() if not is_empty(s.metadata.shard_sizes)]
    device = local_shards[0].tensor.device if local_shards else _mesh_device(device_mesh)
    if me in target:
        box = target[me]
        if is_empty(box[1]):
            local = torch.empty(box[1], dtype=props.dtype, device=device, requires_grad=props.requires_grad)
        else:
            (shard,) = local_shards
            local = shard.tensor
    else:
        local = torch.empty(0, dtype=props.dtype, device=device, requires_grad=props.requires_grad)
    dt = DTensor.from_local(
        local, device_mesh, sharded, run_check=False, shape=torch.Size(size), stride=_contiguous_strides(size)
    )
    if sharded != placements:
        dt = dt.redistribute(device_mesh, placements)
    return dt


def from_dtensor(dt, *, process_group=None, run_check: bool = False) -> ShardedTensor:
    """A ShardedTensor whose local shard is ``dt``'s local tensor (zero-copy).

    Example (on each of 2 ranks, after ``import torch_shard.interop``)::

        dt = distribute_tensor(torch.randn(10, 6), init_device_mesh("cpu", (2,)), [Shard(0)])
        st = torch_shard.interop.from_dtensor(dt)  # ChunkShardingSpec(dim=0); no data moves

    ``Shard(d)`` placements on any mesh dim of a 1-D or n-D mesh, uneven sizes included: the rank at
    mesh coordinate ``c`` holds the box DTensor gives ``c`` (see NOTE [ DTensor layouts as shard
    boxes ]). On a 1-D mesh with ``Shard(d)`` the result is sharded by
    ``ChunkShardingSpec(dim=d, placements=<the mesh's ranks in mesh order>)``; otherwise by an
    ``EnumerableShardingSpec`` of those boxes.

    ``Replicate()`` on a mesh dim: every element is owned exactly once, by the ranks whose coordinate
    along that mesh dim is 0; the other ranks of the mesh hold no shard of it (their copies are not
    referenced). ``Partial`` placements raise ValueError (the local tensors are unreduced partial
    values); ``_StridedShard`` raises NotImplementedError.

    A DTensor whose local tensor is a ``LocalShardsWrapper`` (several shards per rank at arbitrary
    offsets, as TorchRec builds) converts too: its shards are the local shards, placed by one metadata
    exchange over the process group (then the call is collective).

    The local shard is the DTensor's own local tensor object (not the view ``to_local()`` returns), so
    in-place updates through either object are seen by the other; a non-contiguous local tensor is
    copied (ShardedTensor shards are contiguous). Autograd does not connect the two objects; the shard
    keeps the local tensor's ``requires_grad``.

    Args:
        dt (DTensor): the tensor to convert.

    Keyword args:
        process_group (ProcessGroup, optional): the group of the result. Defaults to the mesh's group
            for a 1-D mesh, and to the default group for an n-D mesh covering every rank; an n-D mesh
            over a subset of the ranks needs it. Placements name global ranks, which must belong to it.
        run_check (bool): exchange a fingerprint of the layout and every rank's verdict over the group
            (one small all-gather), so a rank whose local tensor does not match its box makes every
            rank raise. Without it (the default, as ``DTensor.from_local``) nothing is communicated and
            only the offending rank raises.

    Returns:
        ShardedTensor: same global size and dtype.
    """
    from torch.distributed.tensor import DTensor
    from torch.distributed.tensor import Shard as DShard

    if not isinstance(dt, DTensor):
        raise TypeError(
            f"torch_shard.interop.from_dtensor: expected a DTensor, but got {type(dt).__module__}."
            f"{type(dt).__qualname__}"
        )
    mesh = dt.device_mesh
    size = list(dt.shape)
    placements = _normalize_placements(dt.placements, mesh, len(size), "from_dtensor")
    pg = process_group if process_group is not None else _default_group_for_mesh(mesh)
    local = private.local_tensor(dt)
    me = dist.get_rank()

    if isinstance(local, private.LocalShardsWrapper):
        return _from_local_shards_wrapper(local, size, mesh, pg)

    device = local.device
    known = {me: device}
    layout = _mesh_layout(size, mesh, placements)
    properties = TensorProperties.create_from_tensor(local)
    spec = None
    if mesh.ndim == 1 and isinstance(placements[0], DShard):
        spec = ChunkShardingSpec(
            dim=placements[0].dim,
            placements=[f"rank:{rank}/{_rank_device(rank, mesh.device_type, known)}" for rank, _ in layout],
        )
        shards_md = spec.build_metadata(torch.Size(size), properties).shards_metadata
        mine = [md for (rank, _), md in zip(layout, shards_md) if rank == me]
    else:
        shards_md, mine = [], []
        for rank, box in layout:
            if box is None:
                continue
            md = ShardMetadata(box[0], box[1], f"rank:{rank}/{_rank_device(rank, mesh.device_type, known)}")
            shards_md.append(md)
            if rank == me:
                mine.append(md)

    error: BaseException | None = None
    local_shards = []
    try:
        for md in mine:
            if list(local.shape) != list(md.shard_sizes):
                raise ValueError(
                    f"torch_shard.interop.from_dtensor: expected a local tensor of size {md.shard_sizes} "
                    f"on rank {me} (mesh coordinate {mesh.get_coordinate()}, placements {placements}, "
                    f"global size {size}), but got {list(local.shape)}"
                )
            tensor = local if local.is_contiguous() else local.contiguous()
            local_shards.append(Shard(tensor, md))
    except ValueError as exc:
        error = exc
    if run_check:
        if error is not None:
            abort_and_raise("compare", error, pg)
        fp = _native.layout_fingerprint(
            _native.layout_args_for_shards(shards_md, _PlacementResolver(pg)), size, dt.dtype
        )
        if any(v != fp for v in torch.ops.torch_shard._gather_values(fp, pg.group_name)):
            raise ValueError(
                "torch_shard.interop.from_dtensor: the ranks of the process group disagree on the "
                "DTensor's global size, dtype, mesh or placements"
            )
    elif error is not None:
        raise error
    metadata = ShardedTensorMetadata(shards_md, torch.Size(size), properties)
    return ShardedTensor._init_from_local_shards_and_global_metadata(
        local_shards, metadata, process_group=pg, sharding_spec=spec
    )


def _from_local_shards_wrapper(wrapper, size: list[int], mesh, pg) -> ShardedTensor:
    """ShardedTensor over the shards of a ``LocalShardsWrapper`` (one metadata exchange)."""
    me = dist.get_rank()
    shards = []
    for tensor, offsets in zip(wrapper.local_shards(), wrapper.local_offsets()):
        tensor = tensor if tensor.is_contiguous() else tensor.contiguous()
        shards.append(Shard.from_tensor_and_offsets(tensor, list(offsets), me))
    return init_from_local_shards(shards, *size, process_group=pg)
