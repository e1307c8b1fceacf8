"""ShardedTensor under torch.compile: dynamo breaks the graph at every op on a ShardedTensor.

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
contains :data:`GRAPH_BREAK_REASON`.
A ShardedTensor passed as an argument of the compiled function itself is an object dynamo cannot wrap
as a tensor: the first Tensor method called on it (``t.numel()``) breaks the graph with dynamo's own
reason, which names the class ("... method `numel` of class `ShardedTensor`"), and that call runs
eagerly too; ``fullgraph=True`` raises ``torch._dynamo.exc.Unsupported`` with that reason.

torch_shard does not import torch._dynamo: it takes seconds, and it imports torch.distributed._shard,
which torch_shard.compat must alias before anything imports it. The wrappers are installed when
torch._dynamo is imported (by torch.compile, usually), by a meta path finder that runs after the module
has executed, or at once if it is already imported.
"""

from __future__ import annotations

import importlib.abc
import sys
import warnings

GRAPH_BREAK_REASON = (
    "torch_shard: a ShardedTensor cannot be traced (its C++ impl holds this rank's shards and its ops "
    "communicate); the op runs eagerly, outside the graph"
)

_DYNAMO = "torch._dynamo"
_installed = False


def _install(cls, dynamo) -> None:
    """Wrap ``cls``'s ``__torch_function__`` and ``__torch_dispatch__`` in ``dynamo.disable`` (what
    torch.compiler.disable calls; ``dynamo`` is the torch._dynamo module, which may still be finishing
    its import, so it is used directly rather than through ``torch``)."""
    global _installed
    if _installed:
        return
    for name in ("__torch_function__", "__torch_dispatch__"):
        method = cls.__dict__[name]  # a classmethod
        setattr(cls, name, classmethod(dynamo.disable(method.__func__, reason=GRAPH_BREAK_REASON)))
    _installed = True


class _AfterDynamoImport(importlib.abc.MetaPathFinder):
    """Finds nothing itself: when torch._dynamo is looked up, it wraps the loader of the spec the other
    finders return so that ``callback(module)`` runs once the module has executed, and then leaves
    ``sys.meta_path``. It stays until then: a lookup that does not import (``importlib.util.find_spec``)
    must not use it up."""

    def __init__(self, callback) -> None:
        self._callback = callback

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
        callback = self._callback
        finder = self

        def exec_module(module) -> None:
            loader_exec(module)
            if finder in sys.meta_path:
                sys.meta_path.remove(finder)
            try:
                callback(module)
            except Exception as exc:  # noqa: BLE001 - never fail torch._dynamo's import because of us
                warnings.warn(
                    f"torch_shard: could not prepare ShardedTensor for torch.compile ({exc!r}); dynamo may "
                    "trace into torch_shard and break the graph more than once per sharded op",
                    RuntimeWarning,
                    stacklevel=2,
                )

        # The loader is this lookup's own object (path-based finders make one per spec).
        spec.loader.exec_module = exec_module
        return spec


def prepare_for_compile(cls) -> None:
    """Install the wrappers on ``cls`` now if torch._dynamo is imported, else when it is."""
    module = sys.modules.get(_DYNAMO)
    if module is not None and hasattr(module, "disable"):
        _install(cls, module)
        return
    sys.meta_path.insert(0, _AfterDynamoImport(lambda dynamo: _install(cls, dynamo)))
