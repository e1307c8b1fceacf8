"""Python side of the data ops: scatter a tensor into shards, gather it back, reshard in place.

Each function checks its arguments locally, agrees with the other ranks (``_agreement.agree``), then
calls one C++ op (``torch.ops.torch_shard.shard / gather / reshard``) that plans the box
intersections and moves exactly the bytes that change owner in one all-to-all.
"""

from __future__ import annotations

import pickle
import warnings
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist
from torch.distributed import distributed_c10d

from .. import _native
from .._agreement import agree, fingerprint
from ..metadata import ShardMetadata
from .metadata import ShardedTensorMetadata, TensorProperties
from .shard import Shard
from .utils import _PlacementResolver

if TYPE_CHECKING:
    from ..sharding_spec import ShardingSpec
    from .api import ShardedTensor

_ops = torch.ops.torch_shard


def resolve_owners(shards: list[ShardMetadata], process_group) -> tuple[list[int], list[torch.device]]:
    """(group rank of each shard's owner, device of each shard), validating every placement."""
    resolve = _PlacementResolver(process_group)
    owners, devices = [], []
    for shard in shards:
        rank, device = resolve(shard.placement)
        owners.append(resolve.group_rank(rank))
        devices.append(device)
    return owners, devices


def layout_fingerprint(shards: list[ShardMetadata], size, dtype: torch.dtype) -> int:
    """Digest of a layout (boxes, placements, size, dtype): equal on every rank iff the layouts are."""
    offsets, sizes = _native.shard_box_tensors(shards)
    placements = ";".join(str(s.placement) for s in shards)
    return fingerprint(
        offsets.numpy().tobytes(), sizes.numpy().tobytes(), placements, list(size), str(dtype)
    )


def spec_fingerprint(spec: ShardingSpec) -> int:
    """Digest of a sharding spec's content (pickled when possible, else its repr)."""
    try:
        data = pickle.dumps(spec, protocol=4)
    except Exception:  # noqa: BLE001 - specs that do not pickle compare by repr
        data = repr(spec).encode()
    return fingerprint(type(spec).__qualname__, data)


def comm_device(process_group, *candidates: torch.Tensor | None) -> torch.device:
    """Device for agreement and transfer buffers: the group's device for NCCL, else that of the
    first given tensor, else cpu."""
    if process_group is not None and dist.get_backend(process_group) == dist.Backend.NCCL:
        return torch.device("cuda", torch.cuda.current_device())
    for tensor in candidates:
        if tensor is not None:
            return tensor.device
    return torch.device("cpu")


def _allocate_local_shards(shards_md, owners, devices, me: int, dtype) -> tuple[list[Shard], list[int]]:
    """Uninitialised tensors for the shards of a layout that group rank ``me`` owns, and their
    indices in the layout: the targets a data op fills."""
    local_shards, local_indices = [], []
    for idx, (shard_md, owner, device) in enumerate(zip(shards_md, owners, devices)):
        if owner == me:
            local_shards.append(Shard(torch.empty(shard_md.shard_sizes, dtype=dtype, device=device), shard_md))
            local_indices.append(idx)
    return local_shards, local_indices


def sync_local_shards(st) -> None:
    """Make the C++ impl hold the tensors ``st.local_shards()`` holds now.

    Python code may swap ``st.local_shards()[i].tensor`` or the list itself (upstream's own tests do);
    the C++ data ops read the impl, so bring it in step before they run.
    """
    from .api import _match_local_indices

    tensors = [shard.tensor for shard in st._local_shards]
    current = _ops._local_shards(st)
    if len(current) == len(tensors) and all(a is b for a, b in zip(current, tensors)):
        return
    indices = _match_local_indices(st._local_shards, st._metadata.shards_metadata)
    _ops._set_local_shards(st, tensors, indices)


def _raise_mismatch(rows, mine, index: int, name: str, me: int, describe=None) -> None:
    for rank, row in enumerate(rows):
        if row[index] != mine:
            theirs = describe(rank) if describe else row[index]
            mine_text = describe(me) if describe else mine
            raise ValueError(
                f"{name}={mine_text} on rank: {me} does not match with {name}={theirs} on rank: {rank}"
            )


def check_src_and_spec(process_group, device, error, src_rank: int, spec) -> None:
    """Upstream's _shard_tensor agreement: every rank must pass the same src_rank and spec."""
    spec_fp = spec_fingerprint(spec) if error is None else 0
    rows = agree(process_group, device, "shard", error, [src_rank, spec_fp])
    me = dist.get_rank(process_group)
    _raise_mismatch(rows, src_rank, 0, "src_rank", me)
    if any(row[1] != spec_fp for row in rows):
        # Only on this (collective, but rare) error path do the specs themselves travel.
        specs = [None] * len(rows)
        dist.all_gather_object(specs, spec, group=process_group)
        _raise_mismatch(rows, spec_fp, 1, "sharding_spec", me, describe=lambda r: specs[r])


def scatter(tensor: torch.Tensor, spec: ShardingSpec, src_rank: int, process_group) -> ShardedTensor:
    """Shard ``tensor`` (its data read on group rank ``src_rank`` only) by ``spec``.

    Every rank builds the target metadata from its own ``tensor``'s size; sizes and dtypes are checked
    to agree before any data moves. Each rank receives only its own shards.
    """
    from .api import ShardedTensor

    pg = process_group if process_group is not None else distributed_c10d._get_default_group()
    me = dist.get_rank(pg)
    error: BaseException | None = None
    try:
        properties = TensorProperties.create_from_tensor(tensor)
        metadata = spec.build_metadata(tensor.size(), properties)
        owners, devices = resolve_owners(metadata.shards_metadata, pg)
        layout_fp = layout_fingerprint(metadata.shards_metadata, tensor.size(), tensor.dtype)
    except Exception as exc:  # noqa: BLE001 - reported to every rank by agree()
        error, layout_fp = exc, 0
    device = comm_device(pg, tensor)
    rows = agree(pg, device, "shard", error, [layout_fp])
    if any(row[0] != layout_fp for row in rows):
        raise ValueError(
            f"shard: the tensor size, dtype or sharding_spec on rank {me} ({tuple(tensor.size())}, "
            f"{tensor.dtype}) gives a different layout than on rank "
            f"{next(r for r, row in enumerate(rows) if row[0] != layout_fp)}; every rank must pass "
            f"a tensor of the same size and dtype and the same spec"
        )

    local_shards, local_indices = _allocate_local_shards(metadata.shards_metadata, owners, devices, me, tensor.dtype)
    out = [shard.tensor for shard in local_shards]
    offsets, sizes = _native.shard_box_tensors(metadata.shards_metadata)
    with torch.no_grad():
        _ops.shard(
            tensor.detach() if me == src_rank else None,
            src_rank,
            list(tensor.size()),
            out,
            local_indices,
            offsets,
            sizes,
            owners,
            tensor.dtype,
            device,
            pg.group_name,
        )
    for buffer in out:
        buffer.requires_grad_(tensor.requires_grad)
    return ShardedTensor._from_parts(
        local_shards, local_indices, metadata, spec, pg, shard_ranks=owners
    )


def gather(st: ShardedTensor, dst: int, out: torch.Tensor | None, enforce_dtype: bool, dtype) -> None:
    """Assemble ``st`` into ``out`` on group rank ``dst``."""
    if enforce_dtype:
        warnings.warn("`enforce_dtype` is deprecated. Please use `dtype` instead.", FutureWarning, stacklevel=3)
    pg = st._process_group
    me = dist.get_rank(pg)
    error: BaseException | None = None
    if me == dst:
        if out is None:
            error = ValueError(f"Argument ``dst_tensor`` must be specified on destination rank {dst}")
        elif out.size() != st.size():
            error = ValueError(f"Argument ``dst_tensor`` have size {out.size()},but should be {st.size()}")
        elif dtype is not None and out.dtype != dtype:
            error = TypeError(f"Argument ``dst_tensor`` has dtype {out.dtype}, but dtype={dtype} was asked for")
    elif out is not None:
        error = ValueError("Argument ``dst_tensor`` must NOT be specified on non-destination ranks.")
    try:
        sync_local_shards(st)
    except Exception as exc:  # noqa: BLE001 - reported to every rank by agree()
        error = error or exc
    layout_fp = layout_fingerprint(st.metadata().shards_metadata, st.size(), st.dtype)
    rows = agree(pg, comm_device(pg, *(s.tensor for s in st.local_shards()), out), "gather", error, [dst, layout_fp])
    _raise_mismatch(rows, dst, 0, "dst", me)
    _raise_mismatch(rows, layout_fp, 1, "layout", me)
    with torch.no_grad():
        _ops.gather(st, dst, out if me == dst else None, pg.group_name)


def reshard(st: ShardedTensor, spec: ShardingSpec) -> ShardedTensor:
    """Move ``st`` to the layout of ``spec`` in place; returns ``st``."""
    pg = st._process_group
    me = dist.get_rank(pg)
    props = st.metadata().tensor_properties
    error: BaseException | None = None
    try:
        sync_local_shards(st)
        from ..sharding_spec import ShardingSpec as _Spec

        if not isinstance(spec, _Spec):
            raise TypeError(f"reshard expects a ShardingSpec, but got {type(spec).__name__}")
        target = spec.build_metadata(st.size(), props)
        owners, devices = resolve_owners(target.shards_metadata, pg)
        # Upstream keeps resharded metadata in rank order (stable for several shards per rank). Sort
        # by the resolved owner, so worker-name placements ("worker1/cpu") order correctly too.
        order = sorted(range(len(owners)), key=lambda i: owners[i])
        shards_md = [target.shards_metadata[i] for i in order]
        owners = [owners[i] for i in order]
        devices = [devices[i] for i in order]
        target_fp = layout_fingerprint(shards_md, st.size(), st.dtype)
    except Exception as exc:  # noqa: BLE001 - reported to every rank by agree()
        error, target_fp = exc, 0
    source_fp = layout_fingerprint(st.metadata().shards_metadata, st.size(), st.dtype)
    device = comm_device(pg, *(s.tensor for s in st.local_shards()))
    rows = agree(pg, device, "reshard", error, [source_fp, target_fp])
    _raise_mismatch(rows, source_fp, 0, "layout", me)
    _raise_mismatch(rows, target_fp, 1, "sharding_spec", me)

    same = [(m.shard_offsets, m.shard_sizes, str(m.placement)) for m in st.metadata().shards_metadata] == [
        (m.shard_offsets, m.shard_sizes, str(m.placement)) for m in shards_md
    ]
    if not same:
        local_shards, local_indices = _allocate_local_shards(shards_md, owners, devices, me, st.dtype)
        out = [shard.tensor for shard in local_shards]
        offsets, sizes = _native.shard_box_tensors(shards_md)
        with torch.no_grad():
            _ops.reshard(st, out, local_indices, offsets, sizes, owners, pg.group_name)
        for buffer in out:
            buffer.requires_grad_(props.requires_grad)
        st._local_shards = local_shards
        st._metadata = ShardedTensorMetadata(shards_md, st.size(), props)
    st._sharding_spec = spec
    return st
