"""Pickling, ``torch.save`` / ``torch.load`` and deepcopy of ShardedTensors.

``Tensor.__reduce_ex__`` and ``Tensor.__deepcopy__`` would read storage, which a ShardedTensor has
none of. A ShardedTensor pickles as what its C++ impl holds: the local shard tensors and the index of
the layout shard each one is (read together, so they can never be paired wrongly), the layout in a
compact form (``_packing``), the tensor properties and spec, and the ranks it was saved from, which
must match on load (each rank's file holds only its own shards).
"""

from __future__ import annotations

import copy
from contextlib import contextmanager
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch.distributed import distributed_c10d

from .._support import _torch_private as private
from .._support._native import LayoutArgs
from .._support._placement import _PlacementResolver
from .._support._tensor_metadata import TensorProperties
from .._support._torch_private import RemoteDevice
from . import _packing, _state
from ._construction import build
from ._converted import pinned_leaf_copy
from .shard import Shard


@dataclass
class ProcessGroupState:
    """Ranks and world sizes at save time, checked again when a ShardedTensor is loaded."""

    local_rank: int
    global_rank: int
    local_world_size: int
    global_world_size: int


# The group ShardedTensors unpickled inside load_with_process_group join (torch_shard.api exports both).
_CURRENT_PROCESS_GROUP = None


@contextmanager
def load_with_process_group(process_group):
    """Context manager: ShardedTensors unpickled inside it join ``process_group``."""
    global _CURRENT_PROCESS_GROUP
    if _CURRENT_PROCESS_GROUP is not None:
        raise RuntimeError('ProcessGroup already set by previous "load_with_process_group" context manager')
    _CURRENT_PROCESS_GROUP = process_group
    try:
        yield process_group
    finally:
        _CURRENT_PROCESS_GROUP = None


def _get_current_process_group():
    """The group set by :func:`load_with_process_group`, else the default group."""
    if _CURRENT_PROCESS_GROUP is None:
        return private.default_group()
    return _CURRENT_PROCESS_GROUP


def _rebuild_sharded_tensor(
    cls: type,
    local_tensors: list[torch.Tensor],
    local_indices: list[int],
    packed_shards: tuple,
    size: tuple,
    properties: TensorProperties,
    pg_state: ProcessGroupState,
    sharding_spec,
    init_rrefs: bool,
):
    """Unpickle a ShardedTensor: the same ranks must load what they saved. The process group is the
    one set by ``load_with_process_group``, else the default group."""
    if not distributed_c10d.is_initialized():
        raise RuntimeError(
            'Need to initialize default process group using "init_process_group" before loading '
            "ShardedTensor"
        )
    pg = _get_current_process_group()
    now = ProcessGroupState(dist.get_rank(pg), dist.get_rank(), dist.get_world_size(pg), dist.get_world_size())
    for field, label in (
        ("local_rank", "Local rank"),
        ("global_rank", "Global rank"),
        ("local_world_size", "Local world size"),
        ("global_world_size", "Global world size"),
    ):
        saved, current = getattr(pg_state, field), getattr(now, field)
        if saved != current:
            raise RuntimeError(f"{label} at save time was {saved}, but at load time was {current}")

    # The layout goes to the impl as buffers (validated there); ShardMetadata objects are made for
    # the local shards only (metadata() builds the rest from the impl when asked).
    offsets, sizes, index, names = _packing.unpack_boxes(packed_shards)
    parsed = [RemoteDevice(name) if name else None for name in names]
    if len(local_tensors) != len(local_indices) or any(not 0 <= i < len(index) for i in local_indices):
        raise ValueError("corrupt ShardedTensor pickle: local shard indices do not match the layout")
    which = index.tolist()
    local_shards = [
        Shard(
            _repin(tensor, properties.pin_memory),
            _state._new_shard_metadata(offsets[i].tolist(), sizes[i].tolist(), parsed[which[i]]),
        )
        for tensor, i in zip(local_tensors, local_indices)
    ]
    resolve = _PlacementResolver(pg)
    owners = [resolve.owner(p) if p is not None else -1 for p in parsed]
    st = build(
        cls,
        local_shards,
        list(local_indices),
        None,
        sharding_spec,
        pg,
        layout_args=LayoutArgs(None, offsets, sizes, index, names, owners),
        size=torch.Size(size),
        properties=properties,
    )
    st._post_init(init_rrefs)
    return st


class _Pickling:
    """Mixin of :class:`ShardedTensor`: ``__reduce_ex__`` and ``__deepcopy__``."""

    def __reduce_ex__(self, protocol):
        pg = self._process_group
        pg_state = ProcessGroupState(
            dist.get_rank(pg), dist.get_rank(), dist.get_world_size(pg), dist.get_world_size()
        )
        view = _state.read_state(self)
        return (
            _rebuild_sharded_tensor,
            (
                type(self),
                list(view.tensors),
                list(view.indices),
                _packing.pack_layout_of(self),
                tuple(_state._tensor_facts(self)[2]),
                _state.properties_of(self, view.pin_memory),
                pg_state,
                self.sharding_spec(),
                self._init_rrefs,
            ),
        )

    def __deepcopy__(self, memo):
        # Deep-copy the shard tensors and the metadata; share the process group.
        view = _state.read_state(self)
        metadata = copy.deepcopy(self.metadata(), memo)
        local_shards = [
            Shard(_deepcopy_shard(tensor, memo, view.pin_memory), metadata.shards_metadata[idx])
            for tensor, idx in zip(view.tensors, view.indices)
        ]
        return self._with_local_shards(local_shards, metadata, self._init_rrefs)


def _deepcopy_shard(tensor: torch.Tensor, memo, pinned: bool) -> torch.Tensor:
    """``copy.deepcopy`` of a local shard; a CPU shard of a pinned ShardedTensor is copied into pinned
    memory (deepcopy hands back pageable memory)."""
    if not (pinned and tensor.device.type == "cpu"):
        return copy.deepcopy(tensor, memo)
    if id(tensor) not in memo:
        memo[id(tensor)] = pinned_leaf_copy(tensor)
    return memo[id(tensor)]


def _repin(tensor: torch.Tensor, pinned: bool) -> torch.Tensor:
    # torch.load hands back pageable CPU tensors: a pinned ShardedTensor's shards are pinned again.
    if pinned and tensor.device.type == "cpu" and not tensor.is_pinned():
        return pinned_leaf_copy(tensor)
    return tensor
