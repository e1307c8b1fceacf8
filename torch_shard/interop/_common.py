"""What both conversions use: a box, and the check that an argument is torch_shard's ShardedTensor."""

from __future__ import annotations

from collections.abc import Sequence

from ..sharded_tensor import ShardedTensor

Box = tuple[list[int], list[int]]  # (offsets, sizes)


def is_empty(sizes: Sequence[int]) -> bool:
    return any(s == 0 for s in sizes)


def require_sharded_tensor(st, op: str) -> None:
    if not isinstance(st, ShardedTensor):
        raise TypeError(
            f"torch_shard.interop.{op}: expected a torch_shard ShardedTensor, but got {type(st).__module__}."
            f"{type(st).__qualname__}"
        )
