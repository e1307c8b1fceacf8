"""torch_shard under torch.compile: where dynamo breaks the graph, and how that is prepared.

NOTE [ ShardedTensor under torch.compile ]
A ShardedTensor is a storage-less C++ impl holding this rank's shards. Dynamo traces a tensor by making
a fake copy of it (FakeTensorMode), which such an impl has no meaning for, and every op on a ShardedTensor
communicates or reads the impl (NOTE [ Ops that cannot be traced ] in csrc/ops/untraceable.h). So dynamo
must not trace into one: ``ShardedTensorBase.__torch_function__`` and ``__torch_dispatch__`` are wrapped
in ``torch.compiler.disable``. In a compiled function or model, where a ShardedTensor enters a torch
function (``F.embedding_bag(ids, sharded_weight)`` inside ``nn.EmbeddingBag.forward``), dynamo breaks
the graph ONCE, at the outermost call of the compiled frame that leads there (the embedding module's
call), runs that call eagerly with dynamo off inside (so none of torch_shard's Python is traced and no
nested frame is compiled), and compiles the code before and after it; gradients flow through the eager
part as in eager mode. ``fullgraph=True`` raises ``torch._dynamo.exc.Unsupported`` whose message
contains :data:`SHARDED_TENSOR_GRAPH_BREAK_REASON`.
A ShardedTensor passed as an argument of the compiled function itself is an object dynamo cannot wrap
as a tensor: the first Tensor method called on it (``t.numel()``) breaks the graph with dynamo's own
reason, which names the class ("... method `numel` of class `ShardedTensor`"), and that call runs
eagerly too; ``fullgraph=True`` raises ``torch._dynamo.exc.Unsupported`` with that reason.

NOTE [ redistribute under torch.compile ]
``torch_shard.interop.redistribute`` moves data in an exchange over the mesh's group, which a graph
cannot hold (the op's fake kernel raises), and dynamo tracing into it stops with an internal error. So,
as for ShardedTensor's ops, dynamo breaks the graph at the call and runs it eagerly: under compilation
the call goes to :data:`untraced_redistribute`, the implementation wrapped in ``dynamo.disable``. In
eager mode the test is one flag read. The gradient flows through the eager part as in eager mode;
``fullgraph=True`` raises ``torch._dynamo.exc.Unsupported`` naming
:data:`REDISTRIBUTE_GRAPH_BREAK_REASON`, before any rank communicates.

Both are installed when torch._dynamo is imported, not before: torch_shard does not import torch._dynamo,
because that takes seconds and imports torch.distributed._shard, which torch_shard.compat must alias
before anything imports it. A meta path finder runs every preparation right after torch._dynamo has
executed (usually imported by torch.compile), or at once if it is already imported.
"""

from __future__ import annotations

import importlib.abc
import sys
import warnings
from collections.abc import Callable
from types import ModuleType

from ._torch_private import DYNAMO_MODULE

SHARDED_TENSOR_GRAPH_BREAK_REASON = (
    "torch_shard: a ShardedTensor cannot be traced (its C++ impl holds this rank's shards and its ops "
    "communicate); the op runs eagerly, outside the graph"
)
REDISTRIBUTE_GRAPH_BREAK_REASON = (
    "torch_shard.interop.redistribute cannot be traced (it moves data in one exchange over the mesh's "
    "group); it runs eagerly, outside the graph"
)

# redistribute's implementation wrapped in dynamo.disable; None until torch._dynamo is imported, and
# nothing can be compiling before then.
untraced_redistribute = None


class _AfterDynamoImport(importlib.abc.MetaPathFinder):
    """Finds nothing itself: when torch._dynamo is looked up, it wraps the loader of the spec the other
    finders return so that every waiting callback runs once the module has executed, and then leaves
    ``sys.meta_path``. It stays until then: a lookup that does not import (``importlib.util.find_spec``)
    must not use it up. One instance serves every callback (two would ask each other forever)."""

    def __init__(self) -> None:
        self.waiting: list[tuple[Callable[[ModuleType], None], str]] = []

    def find_spec(self, fullname, path, target=None):
        if fullname != DYNAMO_MODULE:
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
    module = sys.modules.get(DYNAMO_MODULE)
    if module is not None and hasattr(module, "disable"):
        callback(module)
        return
    _finder.waiting.append((callback, what))
    if _finder not in sys.meta_path:
        sys.meta_path.insert(0, _finder)


def prepare_sharded_tensor(cls) -> None:
    """Wrap ``cls``'s ``__torch_function__`` and ``__torch_dispatch__`` (classmethods) in
    ``dynamo.disable``, what torch.compiler.disable calls, now if torch._dynamo is imported, else when it
    is (NOTE [ ShardedTensor under torch.compile ])."""

    if cls in _prepared:
        return
    _prepared.add(cls)

    def install(dynamo) -> None:
        for name in ("__torch_function__", "__torch_dispatch__"):
            method = cls.__dict__[name]
            setattr(cls, name, classmethod(dynamo.disable(method.__func__, reason=SHARDED_TENSOR_GRAPH_BREAK_REASON)))

    when_dynamo_imported(install, "ShardedTensor")


# The classes prepare_sharded_tensor has taken: each is wrapped once, however often it is asked.
_prepared: set[type] = set()


def prepare_redistribute(implementation: Callable) -> None:
    """Set :data:`untraced_redistribute` to ``implementation`` wrapped in ``dynamo.disable``, now if
    torch._dynamo is imported, else when it is (NOTE [ redistribute under torch.compile ])."""

    def install(dynamo) -> None:
        global untraced_redistribute
        untraced_redistribute = dynamo.disable(implementation, reason=REDISTRIBUTE_GRAPH_BREAK_REASON)

    when_dynamo_imported(install, "torch_shard.interop.redistribute")
