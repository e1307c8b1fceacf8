"""Sharder: a user-defined strategy that turns a module into its sharded counterpart."""

from __future__ import annotations

import abc

import torch.nn as nn

__all__ = ["Sharder"]


class Sharder(abc.ABC):
    """Shards a whole submodule (e.g. an embedding collection) in a custom way.

    Used as a value in a :class:`~torch_shard.sharding_plan.ShardingPlan`; ``shard_module`` replaces
    the submodule with what :meth:`shard` returns.
    """

    @abc.abstractmethod
    def shard(self, module: nn.Module) -> nn.Module:
        """Return the sharded version of ``module`` (may be ``module`` itself, modified in place)."""
