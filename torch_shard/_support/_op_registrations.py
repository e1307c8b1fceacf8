"""The Python half of the C++ ops' registrations: fake kernels and autograd.

``csrc/torch_shard.cpp`` defines every schema and ``csrc/ops/`` registers the kernels per dispatch key.
What is written in Python lives here, imported once with the extension:

* the fake kernel (``torch.library.register_fake``) of the one op that can be traced, ``chunk_boxes``:
  the outputs' shapes from its arguments (FakeTensorMode, torch.compile, torch.export);
* the autograd of ``_rowwise_lookup`` and ``_colwise_lookup`` (a whole sharded lookup in one call; each
  backward is the op of the same name with ``_backward``), and their fake kernels and make_fx rules,
  which raise: they communicate;
* the fake kernel and make_fx rule of ``_redistribute`` (torch_shard.interop.redistribute's exchange),
  which raise too; its autograd is redistribute's own autograd Function, on DTensors.

The other ops taking or returning tensors cannot be traced either and raise a RuntimeError under
FakeTensorMode / make_fx (NOTE [ Ops that cannot be traced ] in csrc/ops/untraceable.h): the
data ops communicate, the impl ops build or read a ShardedTensor's C++ impl, and the layout ops
``validate_shards``, ``_find_overlap``, ``_transfer_counts`` and ``_layout_fingerprint`` return what
they read from their tensors' values.
"""

from __future__ import annotations

import torch
from torch.fx.experimental.proxy_tensor import ProxyTorchDispatchMode

from . import _torch_private as private


@torch.library.register_fake("torch_shard::chunk_boxes")
def _chunk_boxes_fake(global_size, dim, num_chunks):
    """(N, ndim) int64 CPU offsets and sizes. They depend on the integer arguments only, so the real
    kernel runs (raising what it raises for a bad dim or count) and its results' shapes are returned."""
    with private.DisableTorchDispatch():
        offsets, _ = torch.ops.torch_shard.chunk_boxes(global_size, dim, num_chunks)
    return torch.empty(offsets.shape, dtype=torch.int64), torch.empty(offsets.shape, dtype=torch.int64)


def _cannot_trace(op: str) -> RuntimeError:
    """The error of the C++ check_not_tracing (csrc/ops/untraceable.h), word for word."""
    return RuntimeError(
        f"torch_shard.{op} communicates over its process group, so it cannot be traced: it cannot run under "
        "FakeTensorMode or make_fx (torch.compile, torch.export). Call it outside the traced region (e.g. in "
        "a torch.compiler.disable'd function)."
    )


def _refuse_proxy(mode, func, types, args, kwargs):
    """make_fx without fake tensors (tracing_mode="real") reaches ProxyTorchDispatchMode, not the fake
    kernel: it would record the op and run it once, communicating at trace time."""
    raise _cannot_trace(private.op_name(func).split("::", 1)[1])


# A whole sharded lookup in one call, row-wise or column-wise (NOTE [ A row-wise lookup in one call ]
# in csrc/ops/rowwise_lookup.cpp, NOTE [ A column-wise lookup in one call ] in
# csrc/ops/colwise_lookup.cpp): CPU and CUDA kernels; their autograd here (each backward is the second
# op, also one call), and fake kernels that raise: these ops communicate.
_ROWWISE = "torch_shard::_rowwise_lookup"
_COLWISE = "torch_shard::_colwise_lookup"
LOOKUP_OPS = (_ROWWISE, _ROWWISE + "_backward", _COLWISE, _COLWISE + "_backward")


def _raising_fake(name: str):
    def fake(*args, **kwargs):
        raise _cannot_trace(name)

    fake.__doc__ = f"Raises: run under FakeTensorMode, torch_shard.{name} would exchange nothing (NOTE [ Ops that cannot be traced ])."
    return fake


# torch_shard.interop.redistribute's exchange (NOTE [ Redistributing replicated layouts ]): it
# communicates, so its fake kernel raises too. It has no autograd here: redistribute's autograd Function
# (torch_shard/interop/_redistribute.py) is its one caller that differentiates, works on DTensors (so
# it can bring a Partial gradient to the forward's placements first) and runs the op with grad mode off.
_REDISTRIBUTE = "torch_shard::_redistribute"

for _op in (*LOOKUP_OPS, _REDISTRIBUTE):
    torch.library.register_fake(_op)(_raising_fake(_op.split("::", 1)[1]))
    torch.library.register_torch_dispatch(_op, ProxyTorchDispatchMode, _refuse_proxy)


# Both forward schemas: (local, ids, offsets, per_sample_weights, block_starts, block_sizes, num_embeddings,
# padding_idx, mode, include_last_offset, needs_grad, fingerprint, arguments, group_name); what the backward
# needs besides these is in the forward's second output.
_FORWARD_INPUTS = 14


def _lookup_setup_context(ctx, inputs, output) -> None:
    ctx.lookup = (inputs[7], inputs[8], inputs[13])  # padding_idx, mode, group_name
    ctx.save_for_backward(*output[1])
    # What the backward needs is not differentiable, and autograd must not fill a zero gradient for
    # each of those tensors (a kernel each on a GPU) before every backward.
    ctx.mark_non_differentiable(*output[1])
    ctx.set_materialize_grads(False)


def _backward_of(op):
    def backward(ctx, grad, *unused):
        padding_idx, mode, group_name = ctx.lookup
        # The other outputs are not differentiable, so autograd runs this only for a gradient of the
        # result: every rank that ran the forward gets here with one, and all communicate alike.
        assert grad is not None
        # (the ops take any strides: what they send is a copy they make anyway)
        grad_local = op(grad, list(ctx.saved_tensors), padding_idx, mode, group_name)
        return (grad_local,) + (None,) * (_FORWARD_INPUTS - 1)

    return backward


torch.library.register_autograd(
    _ROWWISE, _backward_of(torch.ops.torch_shard._rowwise_lookup_backward), setup_context=_lookup_setup_context
)
torch.library.register_autograd(
    _COLWISE, _backward_of(torch.ops.torch_shard._colwise_lookup_backward), setup_context=_lookup_setup_context
)
