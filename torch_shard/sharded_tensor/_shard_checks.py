"""Python's side of NOTE [ A local shard against its shard ] (csrc/sharded_tensor_impl.h).

Whether a tensor fits a shard (layout, contiguity, size, the placement's device, dtype, pinned memory,
requires_grad) is decided in C++, by the same function the impl's constructor and setters use. The
constructors here call it once for all their shards, before anything is built or exchanged, and phrase
what it finds in the message their API documents (upstream's, which code written for it matches).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

_ops = torch.ops.torch_shard

# The codes of csrc/sharded_tensor_impl.h's ShardMismatch.
LAYOUT, CONTIGUITY, SIZE, DEVICE, DTYPE, PIN_MEMORY, REQUIRES_GRAD = range(1, 8)


def first_mismatch(
    tensors: Sequence[torch.Tensor],
    sizes: Sequence[Sequence[int]],
    devices: Sequence[torch.device | None] | None = None,
    *,
    dtype: torch.dtype | None = None,
    pin_memory: bool | None = None,
    requires_grad: bool | None = None,
    strided_contiguous: bool = False,
) -> tuple[int, int] | None:
    """``(k, code)`` for the first of ``tensors`` that does not fit its shard (``sizes[k]``,
    ``devices[k]``, and the properties given; None: not checked), or None when every one fits."""
    flat = [int(d) for size in sizes for d in size]
    ndims = [len(size) for size in sizes]
    names = [] if devices is None else ["" if d is None else str(d) for d in devices]
    found = _ops._local_shard_mismatch(
        list(tensors), flat, ndims, names, dtype, pin_memory, requires_grad, strided_contiguous
    )
    return (found[0], found[1]) if found else None


def shard_mismatch(tensor: torch.Tensor, size: Sequence[int], device: torch.device | None) -> int | None:
    """The code of what keeps ``tensor`` from being a shard of ``size`` placed on ``device``, or None.
    A tensor of exactly that size on exactly that device fits under any rule, so it answers without
    calling C++ (Shard is built for every local shard of every tensor)."""
    if tensor.size() == torch.Size(size) and (device is None or tensor.device == device):
        return None
    found = first_mismatch([tensor], [size], [device])
    return None if found is None else found[1]
