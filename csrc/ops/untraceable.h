// The ops that cannot be traced, and the error they raise when something tries.
//
// NOTE [ Ops that cannot be traced ]
// torch.compile, torch.export and make_fx trace an op by running it under FakeTensorMode (tensors
// without data) or ProxyTorchDispatchMode (recording a graph). Two kinds of torch_shard ops have no
// meaning there:
//   * the data ops communicate over a process group: run while tracing, they would exchange fake
//     buffers (or real ones once, at trace time, leaving nothing in the graph);
//   * the impl ops read or write a ShardedTensorImpl, which no fake tensor is, and which is what
//     the data ops move.
// Most stay CompositeImplicitAutograd (they must run at the Autograd key, before the Python key a
// wrapped ShardedTensor carries; see the header of ops/impl_ops.cpp). Such a kernel runs before
// FakeTensorMode sees the op (or, for an op without tensor arguments, FakeTensorMode runs it as the
// op's decomposition), and torch.library refuses a fake kernel for it: so the kernel itself checks,
// before it touches any tensor, that no tracing mode is active, and raises this RuntimeError instead.
// The sharded lookups (_rowwise_lookup, _colwise_lookup and their backward ops), which take and return
// plain tensors, have CPU and CUDA kernels instead (for their registered autograd); FakeTensorMode
// reaches their fake kernels, which raise the same error (torch_shard/_support/_op_registrations.py).
// Under torch.compile a ShardedTensor never reaches these ops inside a graph (dynamo breaks the graph at
// the sharded op: NOTE [ ShardedTensor under torch.compile ]); the error is for code that calls them on
// plain tensors while tracing.
// The value-reading layout ops (validate_shards, _find_overlap, _transfer_counts, _layout_fingerprint)
// raise it too when they are given fake or meta tensors: their results are the values they read.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/impl/TorchDispatchModeTLS.h>
#include <c10/util/Exception.h>

namespace torch_shard {

inline bool tracing_mode_active() {
  using c10::impl::TorchDispatchModeKey;
  using c10::impl::TorchDispatchModeTLS;
  return TorchDispatchModeTLS::get_mode(TorchDispatchModeKey::FAKE).has_value() ||
         TorchDispatchModeTLS::get_mode(TorchDispatchModeKey::PROXY).has_value();
}

// `what` completes "torch_shard.<op> ...", e.g. "communicates over the process group".
inline void check_not_tracing(const char* op, const char* what) {
  TORCH_CHECK(!tracing_mode_active(), "torch_shard.", op, " ", what,
              ", so it cannot be traced: it cannot run under FakeTensorMode or make_fx (torch.compile, "
              "torch.export). Call it outside the traced region (e.g. in a torch.compiler.disable'd "
              "function).");
}

// For ops whose result is the values of `t`: meta tensors have none, and neither have fake tensors
// (FakeTensor: a meta storage behind a CPU or CUDA device, met outside the mode too), tensors with
// symbolic sizes or tensors without storage.
inline bool has_values(const at::Tensor& t) {
  if (!t.defined()) {
    return true;
  }
  const c10::TensorImpl* impl = t.unsafeGetTensorImpl();
  return !t.is_meta() && !impl->has_symbolic_sizes_strides() && impl->has_storage() &&
         impl->unsafe_storage().device_type() != c10::DeviceType::Meta;
}

inline void check_has_values(const char* op, const at::Tensor& t) {
  TORCH_CHECK(has_values(t), "torch_shard.", op,
              " reads the values of its tensor arguments, so it cannot be traced: it got a fake or meta "
              "tensor (FakeTensorMode, torch.compile, torch.export). Call it with real tensors.");
}

} // namespace torch_shard
