"""Ops that behave as on a plain tensor: metadata reads the C++ TensorImpl answers by itself."""

from __future__ import annotations

import torch

from ..._support import _torch_private as private
from ..api import _PASSTHROUGH_OPS, _SHARDED_OPS


def _register_passthrough(op) -> None:
    # Registered straight into the table (no per-call argument validation): these are called on every
    # size()/dtype access and only read fields of the ShardedTensorImpl.
    def tensor_default_op(types, args=(), kwargs=None, pg=None):
        with private.DisableTorchFunctionSubclass():
            return op(*args, **(kwargs or {}))

    _SHARDED_OPS[op] = tensor_default_op
    _PASSTHROUGH_OPS[op] = tensor_default_op


_PASSTHROUGH = [
    torch.Tensor.shape.__get__,  # type: ignore[attr-defined]
    torch.Tensor.dtype.__get__,  # type: ignore[attr-defined]
    torch.Tensor.layout.__get__,  # type: ignore[attr-defined]
    torch.Tensor.device.__get__,  # type: ignore[attr-defined]
    torch.Tensor.is_meta.__get__,  # type: ignore[attr-defined]
    torch.Tensor.is_cuda.__get__,  # type: ignore[attr-defined]
    torch.Tensor.is_cpu.__get__,  # type: ignore[attr-defined]
    torch.Tensor.is_sparse.__get__,  # type: ignore[attr-defined]
    torch.Tensor.is_quantized.__get__,  # type: ignore[attr-defined]
    torch.Tensor.ndim.__get__,  # type: ignore[attr-defined]
    torch.Tensor.requires_grad.__get__,  # type: ignore[attr-defined]
    torch.Tensor.grad.__get__,  # type: ignore[attr-defined]
    torch.Tensor.grad_fn.__get__,  # type: ignore[attr-defined]
    torch.Tensor.is_leaf.__get__,  # type: ignore[attr-defined]
    torch.Tensor.size,
    torch.Tensor.dim,
    torch.Tensor.ndimension,
    torch.Tensor.numel,
    torch.Tensor.nelement,
    torch.Tensor.element_size,
    torch.Tensor.stride,
    torch.Tensor.is_contiguous,
    torch.Tensor.contiguous,
    torch.Tensor.is_floating_point,
    torch.Tensor.is_complex,
    torch.numel,
]

for _op in _PASSTHROUGH:
    _register_passthrough(_op)
