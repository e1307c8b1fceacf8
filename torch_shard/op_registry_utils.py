"""Registration of ShardedTensor op implementations into the op tables."""

from __future__ import annotations

import functools
from collections.abc import Callable
from inspect import signature

from .common_op_utils import _basic_validation


def _register_op(op: Callable, func: Callable, op_table: dict) -> None:
    """Put ``func`` in ``op_table`` for ``op`` after checking its signature."""
    if len(signature(func).parameters) != 4:
        raise TypeError(
            f"Custom sharded op function expects signature: (types, args, kwargs, process_group), "
            f"but received signature: {signature(func)}"
        )
    op_table[op] = func


def _decorator_func(wrapped_func: Callable, op: Callable, op_table: dict) -> Callable:
    """Wrap ``wrapped_func`` with the common argument checks and register it for ``op``."""

    @functools.wraps(wrapped_func)
    def wrapper(types, args, kwargs, process_group):
        _basic_validation(op, args, kwargs)
        return wrapped_func(types, args, kwargs, process_group)

    _register_op(op, wrapper, op_table)
    return wrapper
