// Which kernel serves which torch_shard op, for each dispatch key: every TORCH_LIBRARY_IMPL block of the
// library, one per key. The schemas are in csrc/torch_shard.cpp, the kernels in this folder (declared in
// their headers), the fake kernels and the autograd written in Python in
// torch_shard/_support/_op_registrations.py. tests/test_op_registrations.py checks every op's keys.

#include <string>

#include <torch/library.h>

#include "ops/collectives.h"
#include "ops/colwise_lookup.h"
#include "ops/data_ops.h"
#include "ops/impl_ops.h"
#include "ops/layout_ops.h"
#include "ops/lookup_checks.h"
#include "ops/redistribute.h"
#include "ops/renorm.h"
#include "ops/rowwise_lookup.h"
#include "ops/shared_inputs.h"

namespace torch_shard {
namespace ops {
namespace {

// A lookup op's kernels: `name` (its forward, through lookup_kernel) and `name`_backward.
template <LookupResult (*forward)(const LookupCall&),
          at::Tensor (*backward)(const at::Tensor&, at::TensorList, int64_t, c10::string_view,
                                 c10::string_view)>
void register_lookup(torch::Library& m, const std::string& name) {
  m.impl(name.c_str(), TORCH_FN(lookup_kernel<forward>));
  m.impl((name + "_backward").c_str(), TORCH_FN(backward));
}

// The ops that take and return plain tensors only (the sharded lookups, _redistribute); their fake
// kernels and autograd are in Python. One kernel per op serves CPU and CUDA tensors alike: the lookups
// pick the fused CPU loops or the ATen composition themselves (loops_for).
void register_tensor_kernels(torch::Library& m) {
  register_lookup<rowwise_lookup, rowwise_lookup_backward>(m, "_rowwise_lookup");
  register_lookup<colwise_lookup, colwise_lookup_backward>(m, "_colwise_lookup");
  m.impl("_redistribute", TORCH_FN(redistribute));
}

} // namespace
} // namespace ops

TORCH_LIBRARY_IMPL(torch_shard, CPU, m) {
  ops::register_tensor_kernels(m);
}

TORCH_LIBRARY_IMPL(torch_shard, CUDA, m) {
  ops::register_tensor_kernels(m);
}

// chunk_boxes takes no tensors, so its kernel must serve an empty key set; its outputs' shapes follow
// from its arguments, and its fake kernel lets it be traced (ops/layout_ops.cpp).
TORCH_LIBRARY_IMPL(torch_shard, CompositeExplicitAutograd, m) {
  m.impl("chunk_boxes", TORCH_FN(ops::chunk_boxes));
}

// Every other op, at the Autograd key: before the Python key a wrapped ShardedTensor carries, so a kernel
// reaches the impl without a detour through __torch_dispatch__ (ops/impl_ops.cpp). None has a fake
// kernel: those that cannot be traced raise under a tracing mode (NOTE [ Ops that cannot be traced ]).
TORCH_LIBRARY_IMPL(torch_shard, CompositeImplicitAutograd, m) {
  // Layout math (ops/layout_ops.cpp).
  m.impl("chunk_layout", TORCH_FN(ops::chunk_layout));
  m.impl("chunked_dim_size", TORCH_FN(ops::chunked_dim_size));
  m.impl("validate_shards", TORCH_FN(ops::validate_shards));
  m.impl("_find_overlap", TORCH_FN(ops::find_overlap));
  m.impl("_transfer_counts", TORCH_FN(ops::transfer_counts));
  m.impl("_layout_fingerprint", TORCH_FN(ops::layout_fingerprint));
  // The impl (ops/impl_ops.cpp).
  m.impl("_make_sharded", TORCH_FN(ops::make_sharded));
  m.impl("is_sharded", TORCH_FN(ops::is_sharded));
  m.impl("_local_shards", TORCH_FN(ops::local_shards));
  m.impl("_local_shard_indices", TORCH_FN(ops::local_shard_indices));
  m.impl("_version", TORCH_FN(ops::version));
  m.impl("_state", TORCH_FN(ops::state));
  m.impl("_layout", TORCH_FN(ops::layout_of));
  m.impl("_group_name", TORCH_FN(ops::group_name));
  m.impl("_set_local_shards", TORCH_FN(ops::set_local_shards));
  m.impl("_local_shard_mismatch", TORCH_FN(ops::local_shard_mismatch));
  // Data movement and agreement (ops/data_ops.cpp, ops/shared_inputs.cpp, ops/collectives.cpp).
  m.impl("shard", TORCH_FN(ops::shard));
  m.impl("gather", TORCH_FN(ops::gather));
  m.impl("reshard", TORCH_FN(ops::reshard));
  m.impl("_abort", TORCH_FN(ops::abort_op));
  m.impl("_agree_shard", TORCH_FN(ops::agree_shard));
  m.impl("_error_classes", TORCH_FN(ops::error_classes));
  m.impl("_share_inputs", TORCH_FN(ops::share_inputs_op));
  m.impl("_gather_values", TORCH_FN(ops::gather_values));
  m.impl("_all_ranks_true", TORCH_FN(ops::all_ranks_true));
  // max_norm of the sharded lookups (ops/renorm.cpp).
  m.impl("_embedding_renorm_", TORCH_FN(ops::embedding_renorm));
  // Counters (ops/collectives.cpp).
  m.impl("_comm_stats", TORCH_FN(ops::get_comm_stats));
}

} // namespace torch_shard
