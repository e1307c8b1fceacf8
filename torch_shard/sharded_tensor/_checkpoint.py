"""torch.distributed.checkpoint (DCP) support: the checkpointable protocol on ShardedTensor.

DCP asks any object that has ``__create_write_items__``, ``__create_chunk_list__`` and
``__get_tensor_shard__`` for its write items, its chunks and its data. ShardedTensor answers with
one chunk per local shard, so ``dcp.save`` / ``dcp.load`` store a torch_shard tensor like upstream's
and reload it into any other layout: DCP reads, for every chunk of the loading tensor, the overlap
with each saved chunk.
"""

from __future__ import annotations

import torch

from ..metadata import ShardMetadata


def _dcp_chunk(md: ShardMetadata):
    from torch.distributed.checkpoint.metadata import ChunkStorageMetadata

    return ChunkStorageMetadata(offsets=torch.Size(md.shard_offsets), sizes=torch.Size(md.shard_sizes))


class _DCPCheckpointable:
    """Mixin of :class:`ShardedTensor` implementing DCP's checkpointable protocol."""

    def __create_write_items__(self, fqn: str, object) -> list:
        from torch.distributed.checkpoint.metadata import MetadataIndex
        from torch.distributed.checkpoint.planner import TensorWriteData, WriteItem, WriteItemType

        properties = self._dcp_properties()
        return [
            WriteItem(
                index=MetadataIndex(fqn, torch.Size(shard.metadata.shard_offsets)),
                type=WriteItemType.SHARD,
                tensor_data=TensorWriteData(
                    chunk=_dcp_chunk(shard.metadata), properties=properties, size=self.size()
                ),
            )
            for shard in self.local_shards()
        ]

    def __create_chunk_list__(self) -> list:
        return [_dcp_chunk(shard.metadata) for shard in self.local_shards()]

    def __get_tensor_shard__(self, index) -> torch.Tensor:
        offsets = list(index.offset) if index.offset is not None else None
        if offsets is None:
            raise ValueError(f"Cannot lookup {index.fqn} since its a ShardedTensor and no offset was provided")
        local_shards = self.local_shards()
        if index.index is not None and index.index < len(local_shards):
            hinted = local_shards[index.index]
            if list(hinted.metadata.shard_offsets) == offsets:
                return hinted.tensor
        for shard in local_shards:
            if list(shard.metadata.shard_offsets) == offsets:
                return shard.tensor
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
