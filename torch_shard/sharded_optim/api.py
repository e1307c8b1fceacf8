"""ShardedOptimizer: a regular optimizer over the local shards of ShardedTensor parameters."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch.optim as optim
from torch import Tensor

from ..sharded_tensor import ShardedTensor

__all__ = ["ShardedOptimizer"]


class ShardedOptimizer(optim.Optimizer):
    """Wraps ``optimizer_class`` so that every ShardedTensor parameter contributes its local shards.

    Each rank optimizes the shards it holds; dense parameters are optimized as usual (each rank
    steps its own replica).

    Args:
        named_params (Mapping[str, Tensor | ShardedTensor]): e.g. the output of
            :func:`~torch_shard.sharded_optim.named_params_with_sharded_tensor`.
        optimizer_class: e.g. ``torch.optim.SGD``.
        *optimizer_args: positional arguments passed to ``optimizer_class``.
        **optimizer_kwargs: keyword arguments passed to ``optimizer_class``.
    """

    def __init__(self, named_params: Mapping[str, Tensor | ShardedTensor], optimizer_class, *optimizer_args, **optimizer_kwargs):
        tensors: list[Tensor] = []
        for value in named_params.values():
            if isinstance(value, ShardedTensor):
                tensors.extend(shard.tensor for shard in value.local_shards())
            else:
                tensors.append(value)
        self.named_params = named_params
        self._optim = optimizer_class(tensors, *optimizer_args, **optimizer_kwargs)
        self.param_groups = self._optim.param_groups
        self.state = self._optim.state

    def zero_grad(self, set_to_none: bool = True) -> None:  # type: ignore[override]
        """Reset the gradients of every local shard and dense parameter."""
        self._optim.zero_grad(set_to_none)

    def step(self, closure=None):
        """One optimizer step on the local shards and dense parameters."""
        return self._optim.step(closure)

    def state_dict(self) -> dict[str, Any]:
        raise NotImplementedError("ShardedOptimizer state_dict not implemented yet!")

    def load_state_dict(self, state_dict: Mapping[str, Any]) -> None:
        raise NotImplementedError("ShardedOptimizer load_state_dict not implemented yet!")

    def add_param_group(self, param_group: Any) -> None:
        raise NotImplementedError("ShardedOptimizer add_param_group not implemented yet!")
