"""Global metadata of a ShardedTensor: its shards, size and tensor properties.

A leaf module (it needs only ``ShardMetadata``): specs build this metadata and the ShardedTensor holds
it, so it sits below both. The classes keep upstream's module name,
``torch_shard.sharded_tensor.metadata``, which re-exports them: pickles name that module, old ones
included.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum

import torch

from ..metadata import ShardMetadata

__all__ = ["MEM_FORMAT_ENCODING", "ShardedTensorMetadata", "TensorProperties"]


class MEM_FORMAT_ENCODING(Enum):  # noqa: N801 - upstream's name, kept for drop-in use
    # torch.memory_format objects do not pickle; TensorProperties stores one of these instead.
    TORCH_CONTIGUOUS_FORMAT = 0
    TORCH_CHANNELS_LAST = 1
    TORCH_PRESERVE_FORMAT = 2


_ENCODE = {
    torch.contiguous_format: MEM_FORMAT_ENCODING.TORCH_CONTIGUOUS_FORMAT,
    torch.channels_last: MEM_FORMAT_ENCODING.TORCH_CHANNELS_LAST,
    torch.preserve_format: MEM_FORMAT_ENCODING.TORCH_PRESERVE_FORMAT,
}
_DECODE = {v: k for k, v in _ENCODE.items()}


@dataclass
class TensorProperties:
    """Properties every shard of a ShardedTensor shares (and the global tensor reports)."""

    dtype: torch.dtype = field(default_factory=torch.get_default_dtype)
    layout: torch.layout = field(default=torch.strided)
    requires_grad: bool = False
    memory_format: torch.memory_format = field(default=torch.contiguous_format)
    pin_memory: bool = False

    def __getstate__(self):
        if self.memory_format not in _ENCODE:
            raise RuntimeError(f"Invalid torch.memory_format: {self.memory_format}")
        return (
            self.dtype,
            self.layout,
            self.requires_grad,
            _ENCODE[self.memory_format],
            self.pin_memory,
        )

    def __setstate__(self, state):
        dtype, layout, requires_grad, mem_format_encoding, pin_memory = state
        if mem_format_encoding not in _DECODE:
            raise RuntimeError(f"Invalid torch.memory_format encoding: {mem_format_encoding}")
        self.dtype = dtype
        self.layout = layout
        self.requires_grad = requires_grad
        self.memory_format = _DECODE[mem_format_encoding]
        self.pin_memory = pin_memory

    @staticmethod
    def create_from_tensor(tensor: torch.Tensor) -> TensorProperties:
        """The properties of ``tensor`` (its memory format is reported as contiguous)."""
        return TensorProperties(
            dtype=tensor.dtype,
            layout=tensor.layout,
            requires_grad=tensor.requires_grad,
            memory_format=torch.contiguous_format,
            pin_memory=tensor.is_pinned(),
        )


@dataclass
class ShardedTensorMetadata:
    """Everything every rank knows about a ShardedTensor: all shards, the global size, properties."""

    shards_metadata: list[ShardMetadata] = field(default_factory=list)
    size: torch.Size = field(default=torch.Size([]))
    tensor_properties: TensorProperties = field(default_factory=TensorProperties)


# Pickles (and reprs) name the public module users import these from, not this private one, so a pickle
# does not depend on where the classes are defined.
for _cls in (MEM_FORMAT_ENCODING, TensorProperties, ShardedTensorMetadata):
    _cls.__module__ = "torch_shard.sharded_tensor.metadata"
del _cls
