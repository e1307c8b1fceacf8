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


# Tensor properties: torch function receives their getters (``torch.Tensor.shape.__get__``).
_PASSTHROUGH_PROPERTIES = (
    "shape", "dtype", "layout", "device", "is_meta", "is_cuda", "is_cpu", "is_sparse", "is_quantized",
    "ndim", "requires_grad", "grad", "grad_fn", "is_leaf",
)
_PASSTHROUGH_METHODS = (
    "size", "dim", "ndimension", "numel", "nelement", "element_size", "stride", "is_contiguous", "contiguous",
    "is_floating_point", "is_complex",
)
_PASSTHROUGH = [
    *(getattr(torch.Tensor, name).__get__ for name in _PASSTHROUGH_PROPERTIES),
    *(getattr(torch.Tensor, name) for name in _PASSTHROUGH_METHODS),
    torch.numel,
]

for _op in _PASSTHROUGH:
    _register_passthrough(_op)
