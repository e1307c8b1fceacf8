"""Error codes of the agreements, read from the one table in C++ (ErrorCode, csrc/comm/exchange.h).

The data ops agree in C++ (see NOTE [ Agreed exchange ] in csrc/comm/exchange.cpp).
"""

from __future__ import annotations

import builtins

import torch
import torch.distributed as dist

from .. import _C  # noqa: F401  (registers torch.ops.torch_shard.*)


def _load_error_classes() -> list[type[BaseException]]:
    # The one table of error codes is C++'s (ErrorCode in csrc/comm/exchange.h): code k + 1 is
    # class names[k].
    classes = []
    for name in torch.ops.torch_shard._error_classes():
        cls = getattr(dist, name, None) or getattr(builtins, name, None)
        if not (isinstance(cls, type) and issubclass(cls, BaseException)):
            raise ImportError(f"torch_shard: the C++ error table names an unknown exception class {name!r}")
        classes.append(cls)
    return classes


_ERROR_CLASSES: list[type[BaseException]] = _load_error_classes()


def _error_code(error: BaseException | None) -> int:
    """The code a rank reports for ``error``: its most derived class in the table (an
    UnsupportedReshardError, both a NotImplementedError and a ValueError, reports NotImplementedError,
    the earlier base in its MRO); a class outside the table reports RuntimeError's code."""
    return 0 if error is None else _class_code(type(error))


def _class_code(error_class: type[BaseException]) -> int:
    """The code of exceptions of ``error_class`` (see :func:`_error_code`)."""
    for cls in error_class.__mro__:
        if cls in _ERROR_CLASSES:
            return _ERROR_CLASSES.index(cls) + 1
    return _ERROR_CLASSES.index(RuntimeError) + 1


def _error_class(code: int) -> type[BaseException]:
    """The class the other ranks raise for a rank that reported ``code``."""
    return _ERROR_CLASSES[code - 1] if 1 <= code <= len(_ERROR_CLASSES) else RuntimeError


def _error_class_name(error: BaseException) -> str:
    """The table's name for ``error``'s class (see :func:`_error_code`)."""
    return _error_class(_error_code(error)).__name__


def abort_and_raise(op: str, error: BaseException, process_group) -> None:
    """Tell the other ranks of ``process_group``, which are running data op ``op``, that this rank's
    arguments failed (so they raise the same class, from the one error table, carrying this error's
    class and message: NOTE [ Reasons travel ] in csrc/comm/reasons.cpp), then raise ``error``."""
    torch.ops.torch_shard._abort(
        op, _error_class_name(error), process_group.group_name, f"{type(error).__name__}: {error}"
    )
    raise error
