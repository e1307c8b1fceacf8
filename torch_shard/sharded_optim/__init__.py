"""Optimizing modules whose parameters are ShardedTensors."""

from __future__ import annotations

from collections.abc import Iterator

import torch.nn as nn

from ..sharded_tensor import ShardedTensor
from .api import ShardedOptimizer

__all__ = ["ShardedOptimizer", "named_params_with_sharded_tensor"]


def named_params_with_sharded_tensor(
    module: nn.Module, prefix: str = "", recurse: bool = True
) -> Iterator[tuple[str, nn.Parameter | ShardedTensor]]:
    """Like ``module.named_parameters()``, but also yielding ShardedTensor attributes of the
    module's submodules (first, each once), so an optimizer can see them."""
    modules = module.named_modules(prefix=prefix) if recurse else [(prefix, module)]
    seen: set[int] = set()
    for mod_prefix, mod in modules:
        for name, value in vars(mod).items():
            if isinstance(value, ShardedTensor) and id(value) not in seen:
                seen.add(id(value))
                yield (mod_prefix + ("." if mod_prefix else "") + name, value)
    yield from module.named_parameters(prefix=prefix, recurse=recurse)
