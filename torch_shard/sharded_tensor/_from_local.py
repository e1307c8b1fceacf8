"""Assembling ShardedTensors from the shards each rank already holds (init_from_local_shards, and
init_from_local_shards_many for several tensors at once).

One metadata exchange per call, whatever the number of tensors: every rank contributes a compact
record per tensor (its local boxes as int64 buffers, the distinct placements they use, its tensor
properties, the global size it claims, and the error its local checks raised, if any) through one C++
exchange (``torch.ops.torch_shard._share_inputs``: one round, the records riding in its agreement round
when they are small). Every rank then runs the same checks on the same gathered data, so all ranks
accept or all raise the same error. Validation of each assembled layout runs in C++ (O(N) for
chunk-like layouts, O(N * 2^d) otherwise).
"""

from __future__ import annotations

import pickle
from array import array
from collections.abc import Sequence

import torch
import torch.distributed as dist

from .._support import _native
from .._support._agreement import _error_class, _error_code
from .._support._placement import _PlacementResolver
from .._support._tensor_metadata import ShardedTensorMetadata, TensorProperties
from .._support._torch_private import RemoteDevice
from ..metadata import ShardMetadata
from ._construction import _flatten_tensor_size
from ._packing import pack_shards
from ._shard_checks import CONTIGUITY, DEVICE, DTYPE, LAYOUT, PIN_MEMORY, REQUIRES_GRAD, SIZE, first_mismatch
from ._state import _BoundShard
from .shard import Shard

# Agreed with the other ranks by _share_inputs, so a rank in init_from_local_shards and a rank in a
# sharded embedding op raise instead of exchanging each other's data ("init" in ASCII).
_INIT_FLAGS = 0x696E6974


def _raise_if_mismatch(expected, actual, prop_name, ranks, is_local=True) -> None:
    if expected == actual:
        return
    if is_local:
        raise ValueError(
            f"Local shards' tensor {prop_name} property need to be the same on rank:{ranks}! "
            f"Found one local shard tensor {prop_name}={expected}, "
            f"the other local shard tensor {prop_name}={actual}."
        )
    raise ValueError(
        f"ShardedTensor {prop_name} property does not match from different ranks! "
        f"Found {prop_name}={expected} on rank:{ranks[0]}, and {prop_name}={actual} on rank:{ranks[1]}."
    )


def build_metadata_from_local_shards(
    local_shards: list[Shard], global_size: torch.Size, current_rank: int, pg
) -> ShardedTensorMetadata:
    """Check this rank's shards (placement rank, layout, contiguity, device, matching properties)
    and describe them as a "local" ShardedTensorMetadata claiming ``global_size``."""
    if not local_shards:
        raise ValueError("must have local shards!")
    first = local_shards[0].tensor
    resolve = _PlacementResolver(pg)
    devices = []
    for local_shard in local_shards:
        rank, local_device = resolve(local_shard.metadata.placement)
        if rank != current_rank:
            raise ValueError(
                f"Local shard metadata's rank does not match with the rank in its process group! "
                f"Found current rank in the process group: {current_rank}, local ShardMetadata "
                f"placement's rank: {rank}"
            )
        devices.append(local_device)
    # NOTE [ A local shard against its shard ]: one C++ check for all shards, then upstream's message.
    found = first_mismatch(
        [shard.tensor for shard in local_shards],
        [shard.metadata.shard_sizes for shard in local_shards],
        devices,
        dtype=first.dtype,
        pin_memory=first.is_pinned(),
        requires_grad=first.requires_grad,
        strided_contiguous=True,
    )
    if found is not None:
        k, code = found
        tensor, md = local_shards[k].tensor, local_shards[k].metadata
        if code == LAYOUT:
            raise ValueError(
                f"Only torch.strided layout is currently supported, but found {tensor.layout} on "
                f"rank:{current_rank}!"
            )
        if code == CONTIGUITY:
            raise ValueError("Only torch.contiguous_format memory_format is currently supported!")
        if code == DEVICE:
            raise ValueError(
                f"Local shard tensor device does not match with local Shard's placement! Found local "
                f"shard tensor device: {tensor.device}, local shard metadata placement device: {devices[k]}"
            )
        expected, actual, name = {
            SIZE: (md.shard_sizes, list(tensor.size()), "size"),
            PIN_MEMORY: (tensor.is_pinned(), first.is_pinned(), "pin_memory"),
            DTYPE: (tensor.dtype, first.dtype, "dtype"),
            REQUIRES_GRAD: (tensor.requires_grad, first.requires_grad, "requires_grad"),
        }[code]
        _raise_if_mismatch(expected, actual, name, current_rank)
    properties = TensorProperties.create_from_tensor(first)
    return ShardedTensorMetadata([s.metadata for s in local_shards], global_size, properties)


def _record(local_md: ShardedTensorMetadata | None, error: BaseException | None):
    """What one rank contributes to the exchange: (error code, error text, payload or None)."""
    if error is not None:
        return (_error_code(error), f"{type(error).__name__}: {error}", None)
    if local_md is None:
        return (0, "", None)
    props = local_md.tensor_properties
    return (
        0,
        "",
        (
            tuple(local_md.size),
            pack_shards(local_md.shards_metadata),
            (props.dtype, props.layout, props.requires_grad, props.pin_memory),
        ),
    )


def build_global_metadata(records: list, recalc_metadata: bool, me: int):
    """Check the gathered records against each other and assemble the global layout: (global size,
    tensor properties, box offsets, box sizes, placement index per box, distinct placements, index of
    this rank's first shard). Every rank computes the same result or raises the same error.

    No ShardMetadata objects are built: the layout goes to the C++ impl as int64 buffers, and
    ``metadata()`` builds the Python objects from it only when asked (16384 shards: most of the
    time this call took went into creating them, and the garbage collector's passes over them)."""
    for rank, (code, text, _) in enumerate(records):
        if code != 0 and rank != me:
            raise _error_class(code)(f"init_from_local_shards failed on rank {rank}: {text}")
    reference = None
    reference_rank = 0
    offsets_parts, sizes_parts = [], []
    count = 0  # boxes so far, over all ranks
    counts = []  # (rank, number of shards) of every rank that has shards
    name_index: dict[str, int] = {}  # distinct placements over all ranks, in first-seen order
    placement_of = array("q")
    my_first = 0
    ndim = 0
    for rank, (_, _, data) in enumerate(records):
        if data is None:
            continue
        size, packed, props = data
        if reference is None:
            reference, reference_rank, ndim = data, rank, packed[1]
        else:
            ref_size, _, ref_props = reference
            ranks = [reference_rank, rank]
            _raise_if_mismatch(torch.Size(ref_size), torch.Size(size), "global_size", ranks, is_local=False)
            _raise_if_mismatch(ref_props[0], props[0], "dtype", ranks, is_local=False)
            _raise_if_mismatch(ref_props[2], props[2], "requires_grad", ranks, is_local=False)
            _raise_if_mismatch(ref_props[3], props[3], "pin_memory", ranks, is_local=False)
            if packed[1] != ndim:
                raise ValueError(
                    f"Found inconsistent ranks for shards: {ndim}-dim shards on rank:{reference_rank} "
                    f"and {packed[1]}-dim shards on rank:{rank}"
                )
        if rank == me:
            my_first = count
        offsets_parts.append(packed[2])
        sizes_parts.append(packed[3])
        count += packed[0]
        counts.append((rank, packed[0]))
        remap = [name_index.setdefault(name, len(name_index)) for name in packed[4]]
        which = array("q")
        which.frombytes(packed[5])
        placement_of.extend(remap[w] for w in which)
    if reference is None:
        raise ValueError("ShardedTensor have no local shards on all ranks!")
    size, _, props = reference
    offsets = _native._as_box_tensor(array("q", b"".join(offsets_parts)), count, ndim).clone()
    sizes = _native._as_box_tensor(array("q", b"".join(sizes_parts)), count, ndim).clone()
    global_size = torch.Size(size)
    if recalc_metadata:
        # Every rank holds exactly one shard, so the rows can be laid out in rank order.
        for rank, n in counts:
            if n != 1 or len(counts) != len(records):
                bad = rank if n != 1 else next(r for r, (_, _, d) in enumerate(records) if d is None)
                raise ValueError(
                    "init_from_local_shards with None in the global size (row-wise recalculation) needs "
                    f"exactly one local shard per rank; rank {bad} has {n if n != 1 else 0}"
                )
        # Row-wise, in the gathered (rank) order: each shard starts where the previous one ends.
        offsets.zero_()
        rows = sizes[:, 0]
        offsets[:, 0] = torch.cumsum(rows, 0) - rows
        global_size = torch.Size([int(rows.sum())] + sizes[0, 1:].tolist())
    _native.validate_boxes(offsets, sizes, global_size)
    properties = TensorProperties(
        dtype=props[0],
        layout=props[1],
        requires_grad=props[2],
        memory_format=torch.contiguous_format,
        pin_memory=props[3],
    )
    names = list(name_index)
    index = torch.frombuffer(placement_of, dtype=torch.int64).clone() if len(placement_of) else torch.empty(0, dtype=torch.int64)
    return global_size, properties, offsets, sizes, index, names, my_first


def _local_record(local_shards: list[Shard], global_size, current_rank: int, process_group):
    """This rank's checks of one tensor's shards: (whether the size asks for row-wise recalculation,
    the record it contributes to the exchange, the error its checks raised or None)."""
    recalc = any(dim is None for dim in global_size)
    if recalc:
        global_size = tuple(0 if dim is None else dim for dim in global_size)
    error: BaseException | None = None
    local_md = None
    try:

        tensor_size = _flatten_tensor_size(global_size)
        if local_shards:
            local_md = build_metadata_from_local_shards(local_shards, tensor_size, current_rank, process_group)
    except Exception as exc:  # noqa: BLE001 - reported to every rank through the exchange
        error = exc
    return recalc, _record(local_md, error), error


def _for_tensor(error: Exception, index: int, count: int) -> Exception:
    """``error`` with the tensor it concerns named (same type; the original when it cannot be rebuilt)."""
    try:
        return type(error)(f"init_from_local_shards_many: tensor {index} of {count}: {error}")
    except Exception:  # noqa: BLE001 - an exception type with another constructor: keep it as it is
        return error


def _arguments(local_shards, global_sizes) -> tuple[list, list]:
    """init_from_local_shards_many's arguments as (list of shard lists, list of size tuples)."""
    if isinstance(local_shards, (Shard, torch.Tensor)) or not isinstance(local_shards, Sequence):
        raise TypeError(
            f"local_shards must be a sequence with one list of Shards per tensor, not {type(local_shards).__name__}"
        )
    if isinstance(global_sizes, torch.Tensor) or not isinstance(global_sizes, Sequence):
        raise TypeError(f"global_sizes must be a sequence with one size per tensor, not {type(global_sizes).__name__}")
    if len(global_sizes) != len(local_shards):
        raise ValueError(f"got {len(local_shards)} lists of local shards and {len(global_sizes)} global sizes")
    shards = []
    for i, entry in enumerate(local_shards):
        if isinstance(entry, Shard) or not isinstance(entry, Sequence):
            raise TypeError(f"local_shards[{i}] must be a list of Shards, not {type(entry).__name__}")
        shards.append(list(entry))
    sizes = [(size,) if size is None or isinstance(size, int) else tuple(size) for size in global_sizes]
    return shards, sizes


def _exchange(message, process_group) -> list:
    """Every rank's ``message`` (any picklable value), in group rank order: ONE agreed exchange."""
    payload = torch.frombuffer(bytearray(pickle.dumps(message, protocol=4)), dtype=torch.uint8)
    shared = torch.ops.torch_shard._share_inputs([payload], 0, _INIT_FLAGS, process_group.group_name)
    return [pickle.loads(part.numpy().tobytes()) for part in shared]


def _raise_first(own: BaseException | None, errors: list, what: str) -> None:
    """Raise this rank's own error if it has one, else the first other rank's ``(code, text)`` as its
    class."""
    if own is not None:
        raise own
    for rank, error in enumerate(errors):
        if error is not None:
            raise _error_class(error[0])(f"{what} failed on rank {rank}: {error[1]}")


def gather_global_metadata_many(local_shards, global_sizes, process_group, *, name_tensor: bool):
    """Run the local checks of every tensor, ONE exchange for all of them, then the global checks of
    each; see the module docstring. ``local_shards`` and ``global_sizes`` are the caller's arguments
    (checked here, so an argument error on one rank is raised on every rank instead of leaving the
    others waiting). Returns one ``(size, properties, local_shards, local_indices, layout_args)`` per
    tensor, ``local_shards`` being the shards to build it from (new Shard objects where the size was
    recalculated). Errors concern the first tensor (in order) that has one on any rank, so every rank
    raises the same; ``name_tensor`` prefixes their messages with the tensor's index.
    """
    current_rank = dist.get_rank()
    call_error = None
    checked = []
    try:
        local_shards, global_sizes = _arguments(local_shards, global_sizes)
        checked = [
            _local_record(shards, size, current_rank, process_group) for shards, size in zip(local_shards, global_sizes)
        ]
    except Exception as exc:  # noqa: BLE001 - reported to every rank through the exchange
        call_error = exc
    count = len(checked)
    wire_error = None if call_error is None else _record(None, call_error)[:2]
    gathered = _exchange((count, [record for _, record, _ in checked], wire_error), process_group)
    me = dist.get_rank(process_group)
    _raise_first(call_error, [error for _, _, error in gathered], "init_from_local_shards_many")
    counts = [n for n, _, _ in gathered]
    if any(n != count for n in counts):
        raise ValueError(
            "init_from_local_shards_many: every rank must pass the same number of tensors, got "
            + ", ".join(f"{n} on rank {rank}" for rank, n in enumerate(counts))
        )
    results = []
    resolve = _PlacementResolver(process_group)
    for i, (shards, (recalc, _, error)) in enumerate(zip(local_shards, checked)):
        try:
            if error is not None:
                raise error
            records = [records_of_rank[i] for _, records_of_rank, _ in gathered]
            size, properties, offsets, sizes, index, names, my_first = build_global_metadata(records, recalc, me)
        except Exception as exc:
            if not name_tensor:
                raise
            raise _for_tensor(exc, i, count) from exc
        if recalc:
            # Upstream writes the recalculated box into the caller's Shard; a Shard bound to another
            # ShardedTensor cannot take another box, so it is replaced by a new one here.
            first = shards[0]
            recalculated = ShardMetadata(offsets[my_first].tolist(), sizes[my_first].tolist(), first.metadata.placement)
            if isinstance(first, _BoundShard):
                shards = [Shard(first.tensor, recalculated), *shards[1:]]
            else:
                first.metadata = recalculated
        local_indices = list(range(my_first, my_first + len(shards)))
        owners = [resolve.owner(RemoteDevice(name)) if name else -1 for name in names]
        layout = _native.LayoutArgs(None, offsets, sizes, index, names, owners)
        results.append((size, properties, shards, local_indices, layout))
    return results
