"""Device and dtype moves of a ShardedTensor: ``cpu()``, ``cuda()``, ``to()``.

Each converts the local shards and returns a new ShardedTensor whose placements name the new device
type (ranks kept), as upstream does; a CUDA target is always this rank's current device. This rank's
placements name its device exactly; other ranks' placements name only the device type (their index is
their owner's business), so every rank builds a layout the others agree with.
"""

from __future__ import annotations

import copy
import warnings

import torch
import torch.distributed as dist

from .._support import _torch_private as private
from .._support._placement import _PlacementResolver
from ._converted import converted
from .shard import Shard


def _check_memory_format(memory_format) -> None:
    if memory_format not in (torch.preserve_format, torch.contiguous_format):
        raise RuntimeError("Only `torch.contiguous_format` or `torch.preserve_format` is supported!")


class _DeviceMoves:
    """Mixin of :class:`ShardedTensor`: ``cpu``, ``cuda``, ``to``."""

    def cpu(self, memory_format: torch.memory_format = torch.preserve_format, process_group=None):
        """This tensor with every shard on the CPU (``self`` when all placements already are)."""
        _check_memory_format(memory_format)
        if all(md.placement.device().type == "cpu" for md in self.metadata().shards_metadata):
            return self
        return self._moved(torch.device("cpu"), self.dtype, process_group, non_blocking=False)

    def cuda(
        self,
        device=None,
        non_blocking: bool = False,
        memory_format: torch.memory_format = torch.preserve_format,
        process_group=None,
    ):
        """A new ShardedTensor with every shard on this rank's current CUDA device."""
        _check_memory_format(memory_format)
        if device is not None:
            device = torch.device(device) if not isinstance(device, torch.device) else device
            if device.index is not None and device.index != torch.cuda.current_device():
                raise AssertionError(
                    'Only device without device id (e.g. "cpu" or "cuda") is expected for ShardedTensor!'
                )
        current = torch.device("cuda", torch.cuda.current_device())
        return self._moved(current, self.dtype, process_group, non_blocking=non_blocking)

    def to(self, *args, **kwargs):  # type: ignore[override]
        """Convert dtype and/or device, as ``Tensor.to``: ``to(dtype)``, ``to(device)``,
        ``to(device, dtype)``, ``to(tensor)``, or keywords ``dtype``, ``device``, ``copy``,
        ``non_blocking``, ``memory_format``, ``process_group``. A CUDA target is this rank's current
        device. Returns ``self`` when nothing changes and ``copy`` is False; with ``copy=True`` every
        local shard is a new tensor. A pinned ShardedTensor converted on the CPU stays pinned; on CUDA
        it is not pinned."""
        current_device = self.device  # the impl's: its shards' device, or the group's
        current_dtype = self.dtype
        device_to, dtype_to = current_device, current_dtype
        if len(args) == 1:
            if isinstance(args[0], torch.dtype):
                dtype_to = args[0]
            elif isinstance(args[0], torch.device):
                device_to = args[0]
            elif isinstance(args[0], (str, int)):
                device_to = torch.device(args[0])
            elif isinstance(args[0], torch.Tensor):
                dtype_to, device_to = args[0].dtype, args[0].device
            else:
                raise RuntimeError(f"ShardedTensor.to() have wrong arguments: {args}")
        elif len(args) == 2:
            device_to, dtype_to = args
        elif len(args) > 2:
            raise RuntimeError(f"ShardedTensor.to() have wrong arguments: {args}")
        dtype_to = kwargs.get("dtype", dtype_to)
        device_to = kwargs.get("device", device_to)
        device_to = torch.device(device_to) if isinstance(device_to, (str, int)) else device_to
        if device_to.type == "cuda":
            current_idx = torch.cuda.current_device()
            if device_to.index != current_idx:
                warnings.warn(
                    "ShardedTensor.to only move tensor to its current device"
                    "If you want to put to different device, use `reshard` instead.",
                    stacklevel=2,
                )
            device_to = torch.device("cuda", current_idx)
        copy_tensor = kwargs.get("copy", False)
        non_blocking = kwargs.get("non_blocking", False)
        _check_memory_format(kwargs.get("memory_format", torch.preserve_format))
        process_group = kwargs.get("process_group")
        if not copy_tensor and dtype_to == current_dtype and device_to == current_device:
            return self
        return self._moved(device_to, dtype_to, process_group, non_blocking=non_blocking, copy_shards=copy_tensor)

    def _moved(self, device, dtype, process_group, non_blocking: bool, copy_shards: bool = False, empty: bool = False):
        """A new ShardedTensor with local shards converted to ``device``/``dtype`` (copies when
        ``copy_shards``; uninitialised tensors of the shards' sizes when ``empty``) and every placement
        in the metadata rewritten to ``device``'s type (ranks kept), this rank's own to ``device``
        exactly."""
        device = torch.device(device)
        # pin_memory is a promise about CPU shards: it holds for a CPU result (whose shards are then
        # allocated pinned, see _converted) and means nothing for a CUDA one. The same decision on
        # every rank: it depends on the tensor's global properties and the arguments only.
        pinned = self.is_pinned() and device.type == "cpu"
        local_shards = []
        for shard in self.local_shards():
            if empty:
                tensor = torch.empty(shard.tensor.shape, dtype=dtype, device=device, pin_memory=pinned)
            else:
                tensor = converted(
                    shard.tensor, device=device, dtype=dtype, pinned=pinned, non_blocking=non_blocking, copy=copy_shards
                )
            md = copy.deepcopy(shard.metadata)
            private.set_remote_device_device(md.placement, tensor.device)
            local_shards.append(Shard(tensor, md))
        metadata = copy.deepcopy(self.metadata())
        metadata.tensor_properties.dtype = dtype
        metadata.tensor_properties.pin_memory = pinned
        me = dist.get_rank(self._process_group)
        resolve = _PlacementResolver(self._process_group)
        for md in metadata.shards_metadata:
            # This rank's shards are where their tensors now are, exactly (cuda:1 -> the current cuda:0
            # too). Another rank's shards get the device TYPE only: the index is its owner's (which GPU
            # of its host); ranks agree on owners and device types, not on each other's indices (NOTE
            # [ What ranks agree on about a placement ], csrc/layout/layout.h). Upstream writes this
            # rank's device everywhere.
            if resolve.owner(md.placement) == me:
                private.set_remote_device_device(md.placement, device)
            elif md.placement.device().type != device.type:
                private.set_remote_device_device(md.placement, torch.device(device.type))
        pg = process_group if process_group is not None else self._process_group
        return type(self)._init_from_local_shards_and_global_metadata(
            local_shards, metadata, process_group=pg, init_rrefs=self._init_rrefs
        )
