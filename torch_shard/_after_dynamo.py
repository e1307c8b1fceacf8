"""Run code when torch._dynamo is imported, without importing it.

torch_shard does not import torch._dynamo: it takes seconds, and it imports torch.distributed._shard,
which torch_shard.compat must alias before anything imports it. What must be ready for torch.compile
(the compiler-disable wrappers of NOTE [ ShardedTensor under torch.compile ] and of NOTE [ redistribute
under torch.compile ]) is therefore installed when torch._dynamo is imported (by torch.compile, usually),
by a meta path finder that runs after the module has executed, or at once if it is already imported.
"""

from __future__ import annotations

import importlib.abc
import sys
import warnings
from collections.abc import Callable
from types import ModuleType

_DYNAMO = "torch._dynamo"


class _AfterDynamoImport(importlib.abc.MetaPathFinder):
    """Finds nothing itself: when torch._dynamo is looked up, it wraps the loader of the spec the other
    finders return so that every waiting callback runs once the module has executed, and then leaves
    ``sys.meta_path``. It stays until then: a lookup that does not import (``importlib.util.find_spec``)
    must not use it up. One instance serves every callback (two would ask each other forever)."""

    def __init__(self) -> None:
        self.waiting: list[tuple[Callable[[ModuleType], None], str]] = []

    def find_spec(self, fullname, path, target=None):
        if fullname != _DYNAMO:
            return None
        spec = None
        for finder in list(sys.meta_path):
            find = getattr(finder, "find_spec", None)
            if finder is self or find is None:
                continue
            spec = find(fullname, path, target)
            if spec is not None:
                break
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        loader_exec = spec.loader.exec_module
        finder = self

        def exec_module(module) -> None:
            loader_exec(module)
            if finder in sys.meta_path:
                sys.meta_path.remove(finder)
            waiting, finder.waiting = finder.waiting, []
            for callback, what in waiting:
                try:
                    callback(module)
                except Exception as exc:  # noqa: BLE001 - never fail torch._dynamo's import because of us
                    warnings.warn(
                        f"torch_shard: could not prepare {what} for torch.compile ({exc!r}); dynamo may "
                        "trace into torch_shard and break the graph more than once per call",
                        RuntimeWarning,
                        stacklevel=2,
                    )

        # The loader is this lookup's own object (path-based finders make one per spec).
        spec.loader.exec_module = exec_module
        return spec


_finder = _AfterDynamoImport()


def when_dynamo_imported(callback: Callable[[ModuleType], None], what: str) -> None:
    """``callback(torch._dynamo)`` now if torch._dynamo is imported, else right after it is. ``what``
    names what the callback prepares, for the warning given if it fails. The module may still be
    finishing its import when the callback runs: use it directly (``dynamo.disable``), not through
    ``torch``."""
    module = sys.modules.get(_DYNAMO)
    if module is not None and hasattr(module, "disable"):
        callback(module)
        return
    _finder.waiting.append((callback, what))
    if _finder not in sys.meta_path:
        sys.meta_path.insert(0, _finder)
