"""torch.distributed.checkpoint (DCP) support: the checkpointable protocol on ShardedTensor.

DCP asks any object that has ``__create_write_items__``, ``__create_chunk_list__`` and
``__get_tensor_shard__`` for its write items, its chunks and its data. ShardedTensor answers with
one chunk per non-empty local shard, so ``dcp.save`` / ``dcp.load`` store a torch_shard tensor like
upstream's and reload it into any other layout: DCP reads, for every chunk of the loading tensor, the
overlap with each saved chunk.

NOTE [ Empty shards in DCP ]
A layout may hold empty shards anywhere: ChunkShardingSpec gives the trailing chunks of a short dim
size 0 at offset ``split * i``, which can lie past the end of the dim, and EnumerableShardingSpec
accepts empty shards at any offset. DCP's save planner rejects a chunk that ends past the tensor
("out of bounds chunk") and its overlap test reports an empty chunk that sits inside another chunk's
range as overlapping. An empty shard holds no data, so it is left out of the write items and of the
chunk list: a save writes only the non-empty shards, and a load asks only for them. The one
exception is a tensor with no elements at all: DCP needs one chunk to record the tensor (its size and
properties) in the checkpoint's metadata, so the rank holding the first shard of the layout writes a
single chunk covering the whole (empty) tensor at offset 0. Checkpoints written by others may carry
empty chunks (DTensor places them at the end of the dim); they never overlap a non-empty chunk, so a
load never reads from them.
"""

from __future__ import annotations

import math

import torch
import torch.distributed as dist

from .._support._placement import _PlacementResolver
from ..metadata import ShardMetadata
from . import _state
from .shard import Shard


def _dcp_chunk(offsets, sizes):
    from torch.distributed.checkpoint.metadata import ChunkStorageMetadata

    return ChunkStorageMetadata(offsets=torch.Size(offsets), sizes=torch.Size(sizes))


def _is_empty(md: ShardMetadata) -> bool:
    return any(size == 0 for size in md.shard_sizes)


class _DCPCheckpointable:
    """Mixin of :class:`ShardedTensor` implementing DCP's checkpointable protocol."""

    def _dcp_shards(self) -> list:
        """The local shards DCP sees: the non-empty ones, in local order (see NOTE [ Empty shards in
        DCP ])."""
        return [shard for shard in self.local_shards() if not _is_empty(shard.metadata)]

    def _dcp_writes_whole_empty_tensor(self) -> bool:
        """Whether this rank records a tensor with no elements (it holds the layout's first shard)."""
        if math.prod(self.size()) != 0:
            return False

        placement = self.metadata().shards_metadata[0].placement
        if placement is None or not dist.is_initialized():
            return False
        owner, _ = _PlacementResolver(self._process_group)(placement)  # worker names too
        return owner == dist.get_rank()

    def __create_write_items__(self, fqn: str, object) -> list:
        """One ``WriteItem`` per non-empty local shard (one for the whole tensor if it has no elements
        and this rank holds its first shard)."""
        from torch.distributed.checkpoint.metadata import MetadataIndex
        from torch.distributed.checkpoint.planner import TensorWriteData, WriteItem, WriteItemType

        properties = self._dcp_properties()
        size = self.size()
        if self._dcp_writes_whole_empty_tensor():
            boxes = [([0] * len(size), list(size))]
        else:
            boxes = [(s.metadata.shard_offsets, s.metadata.shard_sizes) for s in self._dcp_shards()]
        return [
            WriteItem(
                index=MetadataIndex(fqn, torch.Size(offsets)),
                type=WriteItemType.SHARD,
                tensor_data=TensorWriteData(
                    chunk=_dcp_chunk(offsets, sizes), properties=properties, size=size
                ),
            )
            for offsets, sizes in boxes
        ]

    def __create_chunk_list__(self) -> list:
        """The chunks a load fills: one per non-empty local shard, in local order."""
        return [_dcp_chunk(s.metadata.shard_offsets, s.metadata.shard_sizes) for s in self._dcp_shards()]

    def __get_tensor_shard__(self, index) -> torch.Tensor:
        """The local tensor DCP writes from or reads into, found by the chunk's offsets (``index.index``
        is only a hint: DCP sets it to a position in this rank's chunk list on load and in the global
        chunk list on save)."""
        if index.offset is None:
            raise ValueError(
                f"Cannot lookup {index.fqn} since its a ShardedTensor and no offset was provided"
            )
        offsets = list(index.offset)
        shards = self._dcp_shards()
        if index.index is not None and 0 <= index.index < len(shards):
            hinted = shards[index.index]
            if list(hinted.metadata.shard_offsets) == offsets:
                return hinted.tensor
        for shard in shards:
            if list(shard.metadata.shard_offsets) == offsets:
                return shard.tensor
        if math.prod(self.size()) == 0 and offsets == [0] * len(self.size()):
            props = self.metadata().tensor_properties
            local = self.local_shards()
            device = local[0].tensor.device if local else torch.device("cpu")
            return torch.empty(self.size(), dtype=props.dtype, device=device)
        raise ValueError(f"Could not find shard at '{index.offset}' for FQN: '{index.fqn}'")

    def _dcp_properties(self):
        from torch.distributed.checkpoint.metadata import TensorProperties as DCPTensorProperties

        props = self.metadata().tensor_properties
        return DCPTensorProperties(
            dtype=props.dtype,
            layout=props.layout,
            requires_grad=props.requires_grad,
            memory_format=props.memory_format,
            pin_memory=props.pin_memory,
        )


# NOTE [ Staging a ShardedTensor with DCP's default stager ]
# ``dcp.async_save`` without a stager of the caller's copies the state dict with DCP's
# ``StateDictStager`` (torch/distributed/checkpoint/_state_dict_stager.py). For a tensor whose
# ``data_ptr()`` is 0 (a subclass with no storage of its own: DTensor, ShardedTensor) it makes
# ``y = x.new_empty(x.size(), device="cpu")`` and then sets on ``y`` a staged copy of every entry of
# ``x.__dict__`` (tensors in them copied to the CPU, the rest deep-copied). A subclass's data must
# therefore be reachable from its ``__dict__`` and every entry must survive that copy. A ShardedTensor
# keeps its data in the C++ impl, so:
# * ``data_ptr()`` is 0 and ``new_empty(size, device=...)`` of the tensor's own size is an
#   uninitialised ShardedTensor with this layout on that device (placements moved as ``.to`` does);
# * the process group sits in ``__dict__`` inside a :class:`_GroupHandle`, which a deep copy shares
#   (a ProcessGroup cannot be copied); ``_process_group`` reads and writes it;
# * the cached state view copies as None (a cache: the copy builds its own);
# * ``__dict__["_staged_shards"]`` holds a :class:`_LocalShardsForStaging`, whose deep copy (through
#   ``__reduce_ex__``, so the stager copies the shard tensors with its own options: pinned, shared,
#   non-blocking from CUDA) is a :class:`_StagedLocalShards`; setting that on the new ShardedTensor
#   makes the copies its local shards. The staged ShardedTensor then holds the values the shards had
#   when ``async_save`` was called, and DCP saves it as it would the original.


class _GroupHandle:
    """The process group of a ShardedTensor, as held in its ``__dict__``: copies share it."""

    __slots__ = ("group",)

    def __init__(self, group):
        self.group = group

    def __deepcopy__(self, memo):
        return self

    def __copy__(self):
        return self

    def __reduce__(self):
        # Never pickled with the tensor (ShardedTensor pickles through its own __reduce_ex__).
        raise TypeError("a ShardedTensor's process group handle cannot be pickled")


class _StagedLocalShards:
    """Copies of a ShardedTensor's local shard tensors, in ``local_shards()`` order."""

    __slots__ = ("tensors",)

    def __init__(self, tensors):
        self.tensors = tuple(tensors)


class _LocalShardsForStaging:
    """The entry of a ShardedTensor's ``__dict__`` through which DCP's stager copies its local shards
    (NOTE [ Staging a ShardedTensor with DCP's default stager ])."""

    __slots__ = ("_owner",)

    def __init__(self, owner):
        import weakref

        self._owner = weakref.ref(owner)

    def __reduce_ex__(self, protocol):
        owner = self._owner()
        tensors = tuple(s.tensor.detach() for s in owner.local_shards()) if owner is not None else ()
        return (_StagedLocalShards, (tensors,))


def _install_staged_shards(st, staged: _StagedLocalShards) -> None:
    """Make ``staged``'s tensors ``st``'s local shards (``st`` has the layout they were copied from)."""

    shards = st.local_shards()
    if len(shards) != len(staged.tensors):
        raise RuntimeError(
            f"staging a ShardedTensor: {len(staged.tensors)} staged shards for {len(shards)} local shards"
        )
    _state.replace_local_shards(st, [Shard(t, s.metadata) for t, s in zip(staged.tensors, shards)])
