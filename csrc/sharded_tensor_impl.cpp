#include "sharded_tensor_impl.h"

#include <ATen/core/Tensor.h>
#include <c10/core/TensorOptions.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <c10/core/impl/TorchDispatchModeTLS.h>
#include <torch/version.h>

#include "layout/box.h"

// The impl overrides TensorImpl virtuals whose set and signatures move between releases; the range
// below is the one this code is built and reviewed against.
static_assert(TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 11 && TORCH_VERSION_MINOR <= 14,
              "torch_shard supports torch 2.11 to 2.14");

namespace torch_shard {

namespace {

constexpr const char* kNoStorageMessage =
    "torch_shard.ShardedTensor has no single storage: its data lives in per-rank shards; "
    "use local_shards() or local_tensor()";

c10::DispatchKeySet keys_for(c10::ScalarType dtype, c10::Device device) {
  // Only the backend bit (CPU, CUDA, Meta, ...); the TensorImpl constructor adds the matching
  // Autograd and ADInplaceOrView keys. The Python key arrives when Python wraps the tensor with
  // _make_subclass (TENSORIMPL_NOTES.md B.6): never set it from C++.
  return c10::DispatchKeySet(c10::computeDispatchKey(dtype, c10::kStrided, device));
}

}  // namespace

ShardedTensorImpl::ShardedTensorImpl(caffe2::TypeMeta dtype,
                                     c10::Device device,
                                     layout::Dims global_size,
                                     std::vector<layout::Box> global_shards,
                                     std::vector<int64_t> shard_ranks,
                                     std::vector<at::Tensor> local_shards,
                                     std::vector<int64_t> local_shard_indices,
                                     std::string group_name,
                                     bool pin_memory)
    : c10::TensorImpl(keys_for(dtype.toScalarType(), device), dtype, device),
      global_size_(std::move(global_size)),
      global_shards_(std::move(global_shards)),
      shard_ranks_(std::move(shard_ranks)),
      local_shards_(std::move(local_shards)),
      local_shard_indices_(std::move(local_shard_indices)),
      group_name_(std::move(group_name)),
      pin_memory_(pin_memory) {
  // Global sizes with contiguous strides, as DTensor reports; numel/is_contiguous follow from them.
  c10::TensorImpl::set_sizes_contiguous(global_size_);
  release_storage_and_set_meta_custom_data_ptr_error_msg_(std::string(kNoStorageMessage));
}

void ShardedTensorImpl::copy_sharded_fields_from(const ShardedTensorImpl& src) {
  global_size_ = src.global_size_;
  global_shards_ = src.global_shards_;
  shard_ranks_ = src.shard_ranks_;
  local_shards_ = src.local_shards_;
  local_shard_indices_ = src.local_shard_indices_;
  group_name_ = src.group_name_;
  pin_memory_ = src.pin_memory_;
}

void ShardedTensorImpl::set_layout(std::vector<layout::Box> global_shards,
                                   std::vector<int64_t> shard_ranks,
                                   std::vector<at::Tensor> local_shards,
                                   std::vector<int64_t> local_shard_indices) {
  TORCH_INTERNAL_ASSERT(global_shards.size() == shard_ranks.size());
  TORCH_INTERNAL_ASSERT(local_shards.size() == local_shard_indices.size());
  global_shards_ = std::move(global_shards);
  shard_ranks_ = std::move(shard_ranks);
  local_shards_ = std::move(local_shards);
  local_shard_indices_ = std::move(local_shard_indices);
}

// NOTE [ ShardedTensorImpl detach ]
// detach(), Tensor._make_subclass and nn.Parameter all end in shallow_copy_and_detach. The base class
// would return a plain TensorImpl and silently drop the shards, so both overloads are overridden.
// When the tensor carries the Python key (it is a wrapped ShardedTensor) or a TorchDispatchMode is
// active, and Python is not TLS-excluded, we defer to the base class: it asks the Python interpreter
// to run aten.detach through __torch_dispatch__, which answers with a ShardedTensor. That keeps the
// Python object, its class and a dispatch mode's view of the call intact, and avoids touching the
// PyInterpreter API, which changed in torch 2.9 (pytorch/pytorch#158427). Otherwise we build the copy
// here: same shards (shared, not cloned), same metadata, no Python key (copy_tensor_metadata keeps the
// destination's Python bits, and a fresh impl has none).
template <typename VariableVersion>
c10::intrusive_ptr<c10::TensorImpl> ShardedTensorImpl::shallow_copy_and_detach_core(
    VariableVersion&& version_counter,
    bool allow_tensor_metadata_change) const {
  const bool python_may_answer =
      !c10::impl::tls_is_dispatch_key_excluded(c10::DispatchKey::Python) &&
      (key_set_.has(c10::DispatchKey::Python) ||
       c10::impl::TorchDispatchModeTLS::stack_len() > 0);
  if (python_may_answer) {
    return c10::TensorImpl::shallow_copy_and_detach(
        std::forward<VariableVersion>(version_counter), allow_tensor_metadata_change);
  }
  auto impl = c10::make_intrusive<ShardedTensorImpl>(
      dtype(), device(), global_size_, global_shards_, shard_ranks_, local_shards_,
      local_shard_indices_, group_name_, pin_memory_);
  copy_tensor_metadata(
      /*src_impl=*/this,
      /*dest_impl=*/impl.get(),
      /*version_counter=*/std::forward<VariableVersion>(version_counter),
      /*allow_tensor_metadata_change=*/allow_tensor_metadata_change);
  return impl;
}

c10::intrusive_ptr<c10::TensorImpl> ShardedTensorImpl::shallow_copy_and_detach(
    const c10::VariableVersion& version_counter,
    bool allow_tensor_metadata_change) const {
  return shallow_copy_and_detach_core(version_counter, allow_tensor_metadata_change);
}

c10::intrusive_ptr<c10::TensorImpl> ShardedTensorImpl::shallow_copy_and_detach(
    c10::VariableVersion&& version_counter,
    bool allow_tensor_metadata_change) const {
  return shallow_copy_and_detach_core(std::move(version_counter), allow_tensor_metadata_change);
}

void ShardedTensorImpl::shallow_copy_from(const c10::intrusive_ptr<c10::TensorImpl>& impl) {
  // `st.data = dense` reaches here because any two dense CPU impls count as compatible.
  const auto* src = dynamic_cast<const ShardedTensorImpl*>(impl.get());
  TORCH_CHECK_TYPE(src != nullptr,
                   "torch_shard.ShardedTensor: cannot assign a ", impl->dtype(),
                   " dense tensor's data to a ShardedTensor; build a new ShardedTensor instead");
  copy_tensor_metadata(
      /*src_impl=*/src,
      /*dest_impl=*/this,
      /*version_counter=*/version_counter(),
      /*allow_tensor_metadata_change=*/allow_tensor_metadata_change());
  copy_sharded_fields_from(*src);
}

void ShardedTensorImpl::set_size(int64_t, int64_t) {
  TORCH_CHECK(false, "torch_shard.ShardedTensor: sizes are fixed by the shard layout; reshard instead");
}

void ShardedTensorImpl::set_stride(int64_t, int64_t) {
  TORCH_CHECK(false, "torch_shard.ShardedTensor: strides are fixed by the shard layout");
}

void ShardedTensorImpl::set_storage_offset(int64_t) {
  TORCH_CHECK(false, "torch_shard.ShardedTensor: has no storage, so no storage offset");
}

bool is_sharded_tensor(const at::Tensor& tensor) {
  return tensor.defined() &&
         dynamic_cast<const ShardedTensorImpl*>(tensor.unsafeGetTensorImpl()) != nullptr;
}

ShardedTensorImpl* unsafe_get_sharded_impl(const at::Tensor& tensor, const char* op) {
  auto* impl = tensor.defined() ? dynamic_cast<ShardedTensorImpl*>(tensor.unsafeGetTensorImpl())
                                : nullptr;
  TORCH_CHECK_TYPE(impl != nullptr, "torch_shard.", op,
                   ": expected a ShardedTensor, but got a tensor whose impl is ",
                   tensor.defined() ? "a dense TensorImpl" : "undefined");
  return impl;
}

at::Tensor make_sharded_tensor(std::vector<at::Tensor> local_shards,
                               std::vector<int64_t> local_shard_indices,
                               layout::Dims global_size,
                               std::vector<layout::Box> global_shards,
                               std::vector<int64_t> shard_ranks,
                               c10::ScalarType dtype,
                               c10::Device device,
                               bool pin_memory,
                               std::string group_name) {
  TORCH_CHECK_VALUE(global_shards.size() == shard_ranks.size(),
                    "torch_shard._make_sharded: expected one rank per shard, but got ",
                    shard_ranks.size(), " ranks for ", global_shards.size(), " shards");
  TORCH_CHECK_VALUE(local_shards.size() == local_shard_indices.size(),
                    "torch_shard._make_sharded: expected one global shard index per local shard, "
                    "but got ", local_shard_indices.size(), " indices for ", local_shards.size(),
                    " local shards");
  for (int64_t s : global_size) {
    TORCH_CHECK_VALUE(s >= 0, "torch_shard._make_sharded: negative global size ",
                      layout::dims_str(global_size));
  }
  for (size_t i = 0; i < local_shards.size(); ++i) {
    const at::Tensor& t = local_shards[i];
    const int64_t idx = local_shard_indices[i];
    TORCH_CHECK_INDEX(idx >= 0 && idx < static_cast<int64_t>(global_shards.size()),
                      "torch_shard._make_sharded: local shard ", i, " claims global shard ", idx,
                      ", but there are ", global_shards.size(), " shards");
    TORCH_CHECK_VALUE(t.defined(), "torch_shard._make_sharded: local shard ", i, " is undefined");
    TORCH_CHECK_TYPE(t.scalar_type() == dtype, "torch_shard._make_sharded: local shard ", i,
                     " has dtype ", t.scalar_type(), ", but the ShardedTensor has dtype ", dtype);
    const auto& box = global_shards[idx];
    TORCH_CHECK_VALUE(t.sizes().vec() == box.sizes, "torch_shard._make_sharded: local shard ", i,
                      " has size ", t.sizes(), ", but its metadata says ",
                      layout::dims_str(box.sizes));
    TORCH_CHECK_VALUE(box.offsets.size() == global_size.size(),
                      "torch_shard._make_sharded: shard ", idx, " has ", box.offsets.size(),
                      " dims, but the tensor has ", global_size.size());
  }
  return at::detail::make_tensor<ShardedTensorImpl>(
      caffe2::TypeMeta::fromScalarType(dtype), device, std::move(global_size),
      std::move(global_shards), std::move(shard_ranks), std::move(local_shards),
      std::move(local_shard_indices), std::move(group_name), pin_memory);
}

}  // namespace torch_shard
