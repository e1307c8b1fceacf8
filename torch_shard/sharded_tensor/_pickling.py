"""Pickling, ``torch.save`` / ``torch.load`` and deepcopy of ShardedTensors.

``Tensor.__reduce_ex__`` and ``Tensor.__deepcopy__`` would read storage, which a ShardedTensor has
none of. A ShardedTensor pickles as what its C++ impl holds: the local shard tensors and the index of
the layout shard each one is (read together, so they can never be paired wrongly), the layout in a
compact form (``_packing``), the tensor properties and spec, and the ranks it was saved from, which
must match on load (each rank's file holds only its own shards).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch.distributed import distributed_c10d

from . import _packing, _state
from .metadata import ShardedTensorMetadata, TensorProperties
from .shard import Shard


@dataclass
class ProcessGroupState:
    """Ranks and world sizes at save time, checked again when a ShardedTensor is loaded."""

    local_rank: int
    global_rank: int
    local_world_size: int
    global_world_size: int


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
    from ..api import _get_current_process_group as current_process_group

    if not distributed_c10d.is_initialized():
        raise RuntimeError(
            'Need to initialize default process group using "init_process_group" before loading '
            "ShardedTensor"
        )
    pg = current_process_group()
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
    from ._construction import build

    shards_md = _packing.unpack_shards(packed_shards)
    metadata = ShardedTensorMetadata(shards_md, torch.Size(size), properties)
    local_shards = [Shard(tensor, shards_md[idx]) for tensor, idx in zip(local_tensors, local_indices)]
    st = build(cls, local_shards, list(local_indices), metadata, sharding_spec, pg)
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
        metadata = self.metadata()
        return (
            _rebuild_sharded_tensor,
            (
                type(self),
                list(view.tensors),
                list(view.indices),
                _packing.pack_shards(metadata.shards_metadata),
                tuple(metadata.size),
                metadata.tensor_properties,
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
            Shard(copy.deepcopy(tensor, memo), metadata.shards_metadata[idx])
            for tensor, idx in zip(view.tensors, view.indices)
        ]
        return self._with_local_shards(local_shards, metadata, self._init_rrefs)
