"""Placement parsing, under upstream's module name (``torch.distributed._shard.sharded_tensor.utils``).

The code lives in ``torch_shard/_support/_placement.py``, below the specs and the ShardedTensor that
both use it.
"""

from .._support._placement import _group_ranks, _parse_and_validate_remote_device, _PlacementResolver

__all__ = ["_PlacementResolver", "_group_ranks", "_parse_and_validate_remote_device"]
