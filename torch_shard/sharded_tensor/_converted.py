"""One local shard converted to another device or dtype, keeping the pin_memory promise.

A ShardedTensor created with ``pin_memory=True`` promises that every CPU shard is in pinned memory (the
impl checks it at every write). ``Tensor.to``, ``clone`` and ``copy.deepcopy`` hand back pageable
memory, and a non-blocking copy from a GPU hands back PINNED memory whatever the promise says, so the
shard conversions of ``to``/``cuda``/``cpu``/``clone``/``type_as``/deepcopy allocate their result
here, pinned exactly when the result's promise says so, and copy into it.
"""

from __future__ import annotations

import torch


def _same_device(a: torch.device, b: torch.device) -> bool:
    # "cpu" and "cpu:0" are one device; a CUDA device always carries its index here.
    return a.type == b.type and (a.type == "cpu" or a.index == b.index)


def converted(
    tensor: torch.Tensor,
    *,
    device: torch.device | None = None,
    dtype: torch.dtype | None = None,
    pinned: bool = False,
    non_blocking: bool = False,
    copy: bool = False,
) -> torch.Tensor:
    """``tensor`` on ``device`` as ``dtype``; the tensor itself when nothing changes and ``copy`` is False.

    ``pinned``: the result's pin_memory promise; a CPU result is then allocated in pinned memory. (An
    unpromised result is pageable, even after a non-blocking copy from a GPU, which ``Tensor.to`` would
    pin.) Differentiable like ``Tensor.to``: the copy carries autograd history from ``tensor``.
    """
    device = tensor.device if device is None else torch.device(device)
    dtype = tensor.dtype if dtype is None else dtype
    pin = pinned and device.type == "cpu"
    if not copy and dtype == tensor.dtype and _same_device(device, tensor.device) and (tensor.is_pinned() or not pin):
        return tensor
    out = torch.empty(tensor.shape, dtype=dtype, device=device, pin_memory=pin)
    return out.copy_(tensor, non_blocking=non_blocking)


def pinned_leaf_copy(tensor: torch.Tensor) -> torch.Tensor:
    """A copy of the CPU ``tensor`` in pinned memory, a leaf with ``tensor``'s ``requires_grad`` (what
    ``copy.deepcopy`` and ``torch.load`` hand back, but pinned)."""
    with torch.no_grad():
        out = converted(tensor, pinned=True, copy=True)
    return out.requires_grad_(tensor.requires_grad)
