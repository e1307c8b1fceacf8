"""Sharding specs: how a tensor is cut into shards and where each shard goes."""

from __future__ import annotations

import abc
import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from .._support import _native
from .._support._tensor_metadata import ShardedTensorMetadata, TensorProperties
from .._support._torch_private import RemoteDevice
from ..metadata import ShardMetadata
from ..op_registry_utils import _decorator_func
from ._internals import check_tensor

if TYPE_CHECKING:
    from .._support._native import LayoutArgs
    from .._support._placement import _PlacementResolver

__all__ = [
    "DevicePlacementSpec",
    "EnumerableShardingSpec",
    "PlacementSpec",
    "ShardingSpec",
    "custom_sharding_spec_op",
]


class PlacementSpec(abc.ABC):  # noqa: B024
    """Base class of placement specs: where a whole tensor or a shard lives."""


@dataclass
class DevicePlacementSpec(PlacementSpec):
    """Places an entire tensor on one device.

    Args:
        device (str | int | torch.device | torch.distributed._remote_device): e.g. ``"cuda:0"``,
            ``"rank:0/cpu"`` or ``torch.device(0)``.
    """

    device: RemoteDevice

    def __post_init__(self):
        if not isinstance(self.device, RemoteDevice):
            self.device = RemoteDevice(self.device)


class ShardingSpec(abc.ABC):
    """Base class of sharding specs.

    A spec turns a global size into shard metadata (:meth:`build_metadata`) and can scatter a full
    tensor into a ShardedTensor (:meth:`shard`). Any subclass works with the ``sharded_tensor``
    constructors, which only need :meth:`build_metadata`.
    """

    @abc.abstractmethod
    def build_metadata(
        self, tensor_sizes: torch.Size, tensor_properties: TensorProperties
    ) -> ShardedTensorMetadata:
        """Metadata of a tensor of ``tensor_sizes`` sharded by this spec."""

    @abc.abstractmethod
    def shard(self, tensor: torch.Tensor, src_rank: int = 0, process_group=None) -> torch.Tensor:
        """Scatter ``tensor`` held on ``src_rank`` into a ShardedTensor laid out by this spec."""

    def _is_chunk_layout(self) -> bool:
        """Whether this spec lays tensors out as the standard chunk split (``ChunkShardingSpec``'s,
        not overridden): the data ops then send it as its dim and placements."""
        return False

    def _layout_args(self, size, properties, resolve: _PlacementResolver | None) -> LayoutArgs:
        """The layout this spec gives a tensor of ``size``, as the C++ ops take it (see
        ``_native.layout_args_for_spec``); any spec: the shards of its :meth:`build_metadata`
        (``properties``: the TensorProperties, or a callable returning them)."""
        return _native.layout_args_for_metadata_of(self, size, properties, resolve)


# How ShardingSpec.shard builds its ShardedTensor: the ShardedTensor class registers its scatter here
# when it is defined (torch_shard/sharded_tensor/api.py). The ShardedTensor is built on the specs, so
# the specs do not import it (upstream's ChunkShardingSpec.shard imports it lazily instead).
_scatter: Callable | None = None


def _register_scatter(scatter: Callable) -> None:
    """``scatter(tensor, spec, src_rank, process_group)`` is how specs shard a tensor."""
    global _scatter
    _scatter = scatter


# Per-spec-class op tables: {spec class: {torch function: implementation}}. Keyed by the class object
# itself (upstream keys by __qualname__, so two spec classes with the same name collide).
_CUSTOM_SHARDING_SPEC_OPS: dict[type, dict[Callable, Callable]] = {}


def _has_custom_op(sharding_spec: ShardingSpec, op: Callable) -> bool:
    """True if ``op`` has an implementation registered for ``type(sharding_spec)``."""
    table = _CUSTOM_SHARDING_SPEC_OPS.get(type(sharding_spec))
    return table is not None and op in table


def _dispatch_custom_op(sharding_spec: ShardingSpec, op: Callable, types, args, kwargs, process_group):
    """Run the implementation of ``op`` registered for ``type(sharding_spec)``."""
    table = _CUSTOM_SHARDING_SPEC_OPS.get(type(sharding_spec), {})
    if op not in table:
        raise RuntimeError(f"Custom op: {op} not registered for {type(sharding_spec).__qualname__}")
    return table[op](types, args, kwargs, process_group)


def custom_sharding_spec_op(sharding_spec_class: type, func: Callable):
    """Decorator registering an implementation of torch function ``func`` for ShardedTensors whose
    spec is exactly ``sharding_spec_class``. It takes precedence over the built-in implementation.

    The decorated function must have the signature ``(types, args, kwargs, process_group)``.

    Example::

        @custom_sharding_spec_op(ChunkShardingSpec, torch.nn.functional.linear)
        def my_linear(types, args, kwargs, process_group):
            ...
    """
    table = _CUSTOM_SHARDING_SPEC_OPS.setdefault(sharding_spec_class, {})
    return functools.partial(_decorator_func, op=func, op_table=table)


@dataclass
class EnumerableShardingSpec(ShardingSpec):
    """A sharding spec that lists every shard explicitly.

    Shards must not overlap (zero-size shards never do); whether they cover a tensor is checked when
    the spec is applied to a size (:meth:`build_metadata`).

    Args:
        shards (List[ShardMetadata]): one entry per shard, with its offsets, sizes and placement.
    """

    shards: list[ShardMetadata]

    def __post_init__(self):
        if len(self.shards) == 0:
            raise ValueError(f"Empty shard list provided: {self.shards}")
        _native.validate_shards(self.shards)  # consistent ranks, then no overlap

    def build_metadata(
        self, tensor_sizes: torch.Size, tensor_properties: TensorProperties
    ) -> ShardedTensorMetadata:
        check_tensor(self.shards, tensor_sizes)
        return ShardedTensorMetadata(self.shards, tensor_sizes, tensor_properties)

    def _layout_args(self, size, properties, resolve: _PlacementResolver | None) -> LayoutArgs:
        # The shard list as it is (C++ checks it tiles the tensor), unless a subclass lays out otherwise.
        if type(self).build_metadata is EnumerableShardingSpec.build_metadata:
            return _native.layout_args_for_shards(self.shards, resolve)
        return super()._layout_args(size, properties, resolve)

    def shard(self, tensor: torch.Tensor, src_rank: int = 0, process_group=None) -> torch.Tensor:
        """Always raises ``NotImplementedError``, as upstream does: shard by chunks and reshard instead."""
        # Upstream's exact refusal, which callers and upstream's tests match on. The C++ op
        # torch.ops.torch_shard.shard scatters any layout, enumerable ones included; from Python, shard
        # by chunks and reshard, or call the op.
        raise NotImplementedError("EnumerableShardingSpec.shard not implemented yet!")
