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

The wrappers are installed when torch._dynamo is imported, without torch_shard importing it
(``torch_shard/_after_dynamo.py``).
"""

from __future__ import annotations

from .._after_dynamo import when_dynamo_imported

GRAPH_BREAK_REASON = (
    "torch_shard: a ShardedTensor cannot be traced (its C++ impl holds this rank's shards and its ops "
    "communicate); the op runs eagerly, outside the graph"
)

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


def prepare_for_compile(cls) -> None:
    """Install the wrappers on ``cls`` now if torch._dynamo is imported, else when it is."""
    when_dynamo_imported(lambda dynamo: _install(cls, dynamo), "ShardedTensor")
