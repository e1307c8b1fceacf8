"""Checks and helpers shared by ShardedTensor op implementations."""

from __future__ import annotations

from collections.abc import Callable

from ._support import _torch_private as private

# The classes the op tables serve. ``torch_shard.sharded_tensor.api`` registers ShardedTensorBase when
# it defines it: the op tables sit below the ShardedTensor (the specs' tables too), so they do not
# import it.
_SHARDED_TYPES: tuple[type, ...] = ()


def _register_sharded_type(cls: type) -> None:
    """Make instances of ``cls`` count as distributed tensors in :func:`_basic_validation`."""
    global _SHARDED_TYPES
    if cls not in _SHARDED_TYPES:
        _SHARDED_TYPES = (*_SHARDED_TYPES, cls)


def _sharded_tensors_in(args, kwargs) -> list:
    leaves = private.pytree.tree_leaves((args, kwargs or {}))
    return [leaf for leaf in leaves if isinstance(leaf, _SHARDED_TYPES)]


def _basic_validation(op: Callable, args=(), kwargs=None) -> None:
    """Reject calls without inputs, without any ShardedTensor, or mixing process groups."""
    if len(args) == 0 and (kwargs is None or len(kwargs) == 0):
        raise ValueError(f" No input for '{op.__name__}'!")
    sharded = _sharded_tensors_in(args, kwargs)
    if not sharded:
        raise TypeError(
            f"torch function '{op.__name__}', with args: {args} and kwargs: {kwargs} are called "
            f"without any distributed tensor!"
        )
    pg = getattr(sharded[0], "_process_group", None)
    for st in sharded[1:]:
        if getattr(st, "_process_group", None) is not pg:
            raise RuntimeError(
                "All distributed tensors should use the same ProcessGroup if used together in an op."
            )


def _register_default_op(op: Callable, decorator: Callable) -> None:
    """Register ``op`` so it runs as on a plain tensor (metadata reads served by the TensorImpl)."""

    @decorator(op)
    def tensor_default_op(types, args=(), kwargs=None, pg=None):
        with private.DisableTorchFunctionSubclass():
            return op(*args, **(kwargs or {}))
