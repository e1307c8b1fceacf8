"""Staging a state dict for ``dcp.async_save``: CPU copies of every tensor, ShardedTensors included.

DCP's stagers copy a tensor through its storage (``data_ptr``, ``untyped_storage``, ``set_``), which a
ShardedTensor does not have: its data is its local shards, held by the C++ impl. Staging copies each
local shard to the CPU instead and wraps the copies in :class:`StagedShardedTensor`, a tensor that
answers DCP's checkpointable protocol with exactly the write items the ShardedTensor gave when it was
staged, so the background save writes the same checkpoint a blocking ``dcp.save`` would, while the
training loop goes on changing the ShardedTensor. CUDA shards are copied to the CPU the same way.
"""

from __future__ import annotations

import copy
import dataclasses
from typing import Any

import torch

from ..sharded_tensor import ShardedTensor


class StagedShardedTensor(torch.Tensor):
    """A CPU snapshot of a ShardedTensor's local shards that DCP saves like the ShardedTensor.

    Only for saving: it has the ShardedTensor's global size and dtype but no data of its own, and any
    torch operation on it raises.
    """

    _write_items: list
    _shards: dict

    @staticmethod
    def __new__(cls, st):
        obj = torch.Tensor._make_wrapper_subclass(cls, st.size(), dtype=st.dtype, device="cpu")
        # The fqn is known only when DCP plans the save; "" is replaced then.
        obj._write_items = st.__create_write_items__("", st)
        obj._shards = {
            tuple(item.index.offset): st.__get_tensor_shard__(item.index).detach().to("cpu", copy=True)
            for item in obj._write_items
        }
        return obj

    def __init__(self, *args, **kwargs):
        super().__init__()

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        raise NotImplementedError(f"{func} is not supported on a StagedShardedTensor (it is only saved)")

    def __create_write_items__(self, fqn: str, object: Any) -> list:
        return [dataclasses.replace(w, index=dataclasses.replace(w.index, fqn=fqn)) for w in self._write_items]

    def __create_chunk_list__(self) -> list:
        return [w.tensor_data.chunk for w in self._write_items]

    def __get_tensor_shard__(self, index) -> torch.Tensor:
        return self._shards[tuple(index.offset)]

    def __repr__(self) -> str:
        return f"StagedShardedTensor(size={list(self.size())}, dtype={self.dtype}, chunks={list(self._shards)})"


def stage_state_dict(state_dict: Any) -> Any:
    """A copy of ``state_dict`` whose tensors are CPU copies (ShardedTensors as StagedShardedTensor)."""
    if isinstance(state_dict, ShardedTensor):
        return StagedShardedTensor(state_dict)
    if isinstance(state_dict, StagedShardedTensor):
        return state_dict
    if isinstance(state_dict, torch.Tensor):
        return state_dict.detach().to("cpu", copy=True)
    if isinstance(state_dict, dict):
        return type(state_dict)((k, stage_state_dict(v)) for k, v in state_dict.items())
    if isinstance(state_dict, (list, tuple)) and not hasattr(state_dict, "_fields"):
        return type(state_dict)(stage_state_dict(v) for v in state_dict)
    return copy.deepcopy(state_dict)
