"""Sharding plans, as in ``torch.distributed._shard.sharding_plan``."""

from .api import ShardingPlan, ShardingPlanner

__all__ = ["ShardingPlan", "ShardingPlanner"]
