"""ShardingPlan: which parameters and submodules of a module to shard, and how."""

from __future__ import annotations

import abc
from dataclasses import dataclass

import torch.nn as nn

from ..sharder import Sharder
from ..sharding_spec import ShardingSpec

__all__ = ["ShardingPlan", "ShardingPlanner"]


@dataclass
class ShardingPlan:
    """What ``shard_module`` does to a module.

    Args:
        plan (Dict[str, ShardingSpec | Sharder]): parameter path (``"fc1.weight"``) -> spec to shard
            it with, or submodule path (``"ebc"``) -> Sharder that replaces the submodule.
        output_plan (Dict[str, ShardingSpec], optional): submodule path -> spec its ShardedTensor
            output is resharded to.
        return_local_tensor (List[str], optional): submodule paths whose ShardedTensor output is
            turned into the local tensor (``""`` is the root module).
    """

    plan: dict[str, ShardingSpec | Sharder]
    output_plan: dict[str, ShardingSpec] | None = None
    return_local_tensor: list[str] | None = None


class ShardingPlanner(abc.ABC):
    """Builds a ShardingPlan for a module."""

    @abc.abstractmethod
    def build_plan(self, module: nn.Module) -> ShardingPlan:
        """The plan for ``module``."""
