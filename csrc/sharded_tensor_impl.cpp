#include "sharded_tensor_impl.h"

#include <algorithm>
#include <atomic>
#include <unordered_set>

#include <ATen/core/Tensor.h>
#include <c10/core/TensorOptions.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <c10/core/impl/TorchDispatchModeTLS.h>
#include <torch/version.h>

// The impl overrides TensorImpl virtuals whose set and signatures move between releases; the range
// below is the one this code is built and reviewed against.
static_assert(TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 11 && TORCH_VERSION_MINOR <= 15,
              "torch_shard supports torch 2.11 to 2.15");

namespace torch_shard {

namespace {

constexpr const char* kNoStorageMessage =
    "torch_shard.ShardedTensor has no single storage: its data lives in per-rank shards; "
    "use local_shards() or local_tensor()";

c10::DispatchKeySet keys_for(c10::ScalarType dtype, c10::Device device) {
  // Only the backend bit (CPU, CUDA, Meta, ...); the TensorImpl constructor adds the matching
  // Autograd and ADInplaceOrView keys. The Python key arrives when Python wraps the tensor with
  // _make_subclass (see NOTE [ ShardedTensorImpl detach ]): it is never set from C++, because the
  // Python fallback needs a tensor bound to a Python object.
  return c10::DispatchKeySet(c10::computeDispatchKey(dtype, c10::kStrided, device));
}

int64_t next_version() {
  static std::atomic<int64_t> counter{0};
  return ++counter;
}

} // namespace

// NOTE [ ShardedTensor state ]
// The impl is the single source of truth of a ShardedTensor: the layout (boxes, placements, owners)
// and the local shards live here and nowhere else. Python's metadata() and local_shards() are built
// from the impl and cached under version(), which changes on every write (reshard, set_local_shards),
// so a cache can never show a stale state, whichever path (Python method or a direct
// torch.ops.torch_shard call) wrote it. Python code that assigns `st.local_shards()[i].tensor` goes
// through set_local_shards. Detached copies (detach(), nn.Parameter(st)) get their own impl sharing
// the same shard tensors and layout; a later write to one does not change the other, as with
// upstream's detach, which builds a new ShardedTensor over detached shards.
ShardedTensorImpl::ShardedTensorImpl(caffe2::TypeMeta dtype, c10::Device device,
                                     std::shared_ptr<const layout::Layout> layout,
                                     std::vector<at::Tensor> local_shards,
                                     std::vector<int64_t> local_shard_indices, std::string group_name,
                                     int64_t rank, bool pin_memory)
    : c10::TensorImpl(keys_for(dtype.toScalarType(), device), dtype, device), layout_(std::move(layout)),
      local_shards_(std::move(local_shards)), local_shard_indices_(std::move(local_shard_indices)),
      group_name_(std::move(group_name)), rank_(rank), pin_memory_(pin_memory), version_(next_version()) {
  // Global sizes with contiguous strides, as DTensor reports; numel/is_contiguous follow from them.
  c10::TensorImpl::set_sizes_contiguous(layout_->global_size());
  release_storage_and_set_meta_custom_data_ptr_error_msg_(std::string(kNoStorageMessage));
}

void ShardedTensorImpl::copy_sharded_fields_from(const ShardedTensorImpl& src) {
  layout_ = src.layout_;
  local_shards_ = src.local_shards_;
  local_shard_indices_ = src.local_shard_indices_;
  group_name_ = src.group_name_;
  rank_ = src.rank_;
  pin_memory_ = src.pin_memory_;
  version_ = next_version();
}

void ShardedTensorImpl::check_shards_against(const layout::Layout& layout,
                                             const std::vector<at::Tensor>& tensors,
                                             const std::vector<int64_t>& indices, const char* op) const {
  TORCH_CHECK_VALUE(tensors.size() == indices.size(), "torch_shard.", op, ": ", tensors.size(),
                    " local shards but ", indices.size(), " shard indices");
  const auto dtype = this->dtype().toScalarType();
  for (size_t k = 0; k < tensors.size(); ++k) {
    const at::Tensor& t = tensors[k];
    const int64_t idx = indices[k];
    TORCH_CHECK_INDEX(idx >= 0 && idx < static_cast<int64_t>(layout.num_shards()), "torch_shard.", op,
                      ": local shard ", k, " claims shard ", idx, ", but the layout has ",
                      layout.num_shards(), " shards");
    TORCH_CHECK_VALUE(t.defined(), "torch_shard.", op, ": local shard ", k, " is undefined");
    TORCH_CHECK_TYPE(!is_sharded_tensor(t), "torch_shard.", op, ": local shard ", k,
                     " is itself a ShardedTensor");
    const layout::Box& box = layout.box(static_cast<size_t>(idx));
    const layout::Placement& placement = layout.placement(static_cast<size_t>(idx));
    // NOTE [ A local shard against its shard ]. Tensors without a group (ShardedTensorBase, e.g. a
    // checkpoint loaded to another device) are not checked against their placements.
    ShardExpectation expected;
    expected.sizes = box.sizes;
    expected.dtype = dtype;
    if (!placement.name.empty() && !group_name_.empty()) {
      expected.device = placement.device;
    }
    switch (shard_mismatch(t, expected)) {
      case ShardMismatch::kNone:
        break;
      case ShardMismatch::kSize:
        TORCH_CHECK_VALUE(false, "torch_shard.", op, ": local shard ", k, " has size ", t.sizes(),
                          ", but shard ", layout::describe_box(box, idx), " has size ",
                          layout::dims_str(box.sizes));
      case ShardMismatch::kDevice:
        TORCH_CHECK_VALUE(false, "torch_shard.", op, ": local shard ", k, " is on ", t.device(),
                          ", but its placement '", placement.name, "' puts it on ", placement.device);
      case ShardMismatch::kDtype:
        TORCH_CHECK_TYPE(false, "torch_shard.", op, ": local shard ", k, " has dtype ", t.scalar_type(),
                         ", but the ShardedTensor has dtype ", dtype);
      default:
        TORCH_INTERNAL_ASSERT(false, "unexpected shard mismatch");
    }
    // pin_memory is a promise about every CPU shard (TensorProperties.pin_memory, is_pinned()): a shard
    // that breaks it would make the flag lie after a write or a reshard. (A pinned shard of a tensor
    // without the promise is allowed here; constructors from local shards require the flags to match.)
    TORCH_CHECK_VALUE(!pin_memory_ || !t.is_cpu() || t.is_pinned(), "torch_shard.", op, ": local shard ", k,
                      " is not in pinned memory, but the ShardedTensor was created with pin_memory=True");
  }
}

ShardMismatch shard_mismatch(const at::Tensor& t, const ShardExpectation& expected) {
  if (expected.strided_contiguous && t.layout() != c10::kStrided) {
    return ShardMismatch::kLayout;
  }
  if (expected.strided_contiguous && !t.is_contiguous()) {
    return ShardMismatch::kContiguity;
  }
  if (t.sizes() != expected.sizes) {
    return ShardMismatch::kSize;
  }
  if (expected.device.has_value() && !layout::on_placement_device(t.device(), *expected.device)) {
    return ShardMismatch::kDevice;
  }
  if (expected.dtype.has_value() && t.scalar_type() != *expected.dtype) {
    return ShardMismatch::kDtype;
  }
  if (expected.pin_memory.has_value() && t.is_pinned() != *expected.pin_memory) {
    return ShardMismatch::kPinMemory;
  }
  if (expected.requires_grad.has_value() && t.requires_grad() != *expected.requires_grad) {
    return ShardMismatch::kRequiresGrad;
  }
  return ShardMismatch::kNone;
}

void ShardedTensorImpl::follow_shard_device() {
  if (local_shards_.empty()) {
    return;
  }
  const c10::Device device = local_shards_.front().device();
  if (device_opt_.has_value() && *device_opt_ == device) {
    return;
  }
  const auto old_backend = key_set_.highestBackendKey();
  const auto new_backend =
      c10::toBackendComponent(c10::computeDispatchKey(dtype().toScalarType(), c10::kStrided, device));
  if (old_backend != new_backend) {
    key_set_ = key_set_.remove_backend(old_backend) | c10::DispatchKeySet(new_backend);
  }
  device_opt_ = device;
}

void ShardedTensorImpl::set_layout(std::shared_ptr<const layout::Layout> layout,
                                   std::vector<at::Tensor> local_shards,
                                   std::vector<int64_t> local_shard_indices) {
  TORCH_INTERNAL_ASSERT(layout && layout->global_size() == layout_->global_size());
  check_shards_against(*layout, local_shards, local_shard_indices, "reshard");
  layout_ = std::move(layout);
  local_shards_ = std::move(local_shards);
  local_shard_indices_ = std::move(local_shard_indices);
  version_ = next_version();
  // pin_memory is a promise about CPU shards. A layout with no CPU placement has none to keep it
  // about, and is_pinned() then says false on every rank (as Tensor.is_pinned() of a CUDA tensor
  // does); the placements are global, so every rank decides the same.
  const auto& placements = layout_->placements();
  if (pin_memory_ && std::none_of(placements.begin(), placements.end(),
                                  [](const layout::Placement& p) { return p.device.is_cpu(); })) {
    pin_memory_ = false;
  }
  follow_shard_device();
}

void ShardedTensorImpl::set_local_shards(std::vector<at::Tensor> local_shards,
                                         std::vector<int64_t> local_shard_indices) {
  check_shards_against(*layout_, local_shards, local_shard_indices, "_set_local_shards");
  local_shards_ = std::move(local_shards);
  local_shard_indices_ = std::move(local_shard_indices);
  version_ = next_version();
  follow_shard_device();
}

void ShardedTensorImpl::check_local_shards(const char* op) const {
  const auto mine = layout_->shards_of(rank_);
  std::unordered_set<int64_t> expected(mine.begin(), mine.end());
  std::unordered_set<int64_t> seen;
  for (int64_t idx : local_shard_indices_) {
    TORCH_CHECK_VALUE(seen.insert(idx).second, "torch_shard.", op, ": rank ", rank_, " holds shard ",
                      layout::describe_box(layout_->box(idx), idx), " more than once among its local shards");
    TORCH_CHECK_VALUE(expected.count(idx), "torch_shard.", op, ": rank ", rank_, " holds shard ",
                      layout::describe_box(layout_->box(idx), idx),
                      ", which the metadata places on "
                      "group rank ",
                      layout_->owner(idx));
  }
  for (int64_t idx : mine) {
    TORCH_CHECK_VALUE(seen.count(idx), "torch_shard.", op, ": rank ", rank_,
                      " has no local tensor for "
                      "its shard ",
                      layout::describe_box(layout_->box(idx), idx));
  }
}

// NOTE [ ShardedTensorImpl detach ]
// detach(), Tensor._make_subclass and nn.Parameter all end in shallow_copy_and_detach. The base class
// would return a plain TensorImpl and silently drop the shards, so both overloads are overridden.
// When the tensor carries the Python key (it is a wrapped ShardedTensor) or a TorchDispatchMode is
// active, and Python is not TLS-excluded, we defer to the base class: it asks the Python interpreter
// to run aten.detach through __torch_dispatch__, which answers with a ShardedTensor. That keeps the
// Python object, its class and a dispatch mode's view of the call intact, and avoids touching the
// PyInterpreter API, which is not stable across torch releases (it changed in 2.9). Otherwise we build
// the copy here: same shards (shared, not cloned), same layout, no Python key (copy_tensor_metadata
// keeps the destination's Python bits, and a fresh impl has none).
template <typename VariableVersion>
c10::intrusive_ptr<c10::TensorImpl>
ShardedTensorImpl::shallow_copy_and_detach_core(VariableVersion&& version_counter,
                                                bool allow_tensor_metadata_change) const {
  const bool python_may_answer =
      !c10::impl::tls_is_dispatch_key_excluded(c10::DispatchKey::Python) &&
      (key_set_.has(c10::DispatchKey::Python) || c10::impl::TorchDispatchModeTLS::stack_len() > 0);
  if (python_may_answer) {
    return c10::TensorImpl::shallow_copy_and_detach(std::forward<VariableVersion>(version_counter),
                                                    allow_tensor_metadata_change);
  }
  auto impl = c10::make_intrusive<ShardedTensorImpl>(dtype(), device(), layout_, local_shards_,
                                                     local_shard_indices_, group_name_, rank_, pin_memory_);
  copy_tensor_metadata(
      /*src_impl=*/this,
      /*dest_impl=*/impl.get(),
      /*version_counter=*/std::forward<VariableVersion>(version_counter),
      /*allow_tensor_metadata_change=*/allow_tensor_metadata_change);
  return impl;
}

c10::intrusive_ptr<c10::TensorImpl>
ShardedTensorImpl::shallow_copy_and_detach(const c10::VariableVersion& version_counter,
                                           bool allow_tensor_metadata_change) const {
  return shallow_copy_and_detach_core(version_counter, allow_tensor_metadata_change);
}

c10::intrusive_ptr<c10::TensorImpl>
ShardedTensorImpl::shallow_copy_and_detach(c10::VariableVersion&& version_counter,
                                           bool allow_tensor_metadata_change) const {
  return shallow_copy_and_detach_core(std::move(version_counter), allow_tensor_metadata_change);
}

void ShardedTensorImpl::shallow_copy_from(const c10::intrusive_ptr<c10::TensorImpl>& impl) {
  // `st.data = dense` reaches here because any two dense CPU impls count as compatible.
  const auto* src = dynamic_cast<const ShardedTensorImpl*>(impl.get());
  TORCH_CHECK_TYPE(src != nullptr, "torch_shard.ShardedTensor: cannot assign a ", impl->dtype(),
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
  return tensor.defined() && dynamic_cast<const ShardedTensorImpl*>(tensor.unsafeGetTensorImpl()) != nullptr;
}

ShardedTensorImpl* unsafe_get_sharded_impl(const at::Tensor& tensor, const char* op) {
  auto* impl = tensor.defined() ? dynamic_cast<ShardedTensorImpl*>(tensor.unsafeGetTensorImpl()) : nullptr;
  TORCH_CHECK_TYPE(impl != nullptr, "torch_shard.", op,
                   ": expected a ShardedTensor, but got a tensor whose impl is ",
                   tensor.defined() ? "a dense TensorImpl" : "undefined");
  return impl;
}

at::Tensor make_sharded_tensor(std::shared_ptr<const layout::Layout> layout,
                               std::vector<at::Tensor> local_shards, std::vector<int64_t> local_shard_indices,
                               c10::ScalarType dtype, std::optional<c10::Device> device, bool pin_memory,
                               std::string group_name, int64_t rank) {
  TORCH_INTERNAL_ASSERT(layout);
  const c10::Device where = !local_shards.empty() && local_shards.front().defined()
                                ? local_shards.front().device()
                                : device.value_or(c10::Device(c10::kCPU));
  auto tensor = at::detail::make_tensor<ShardedTensorImpl>(
      caffe2::TypeMeta::fromScalarType(dtype), where, std::move(layout), std::vector<at::Tensor>{},
      std::vector<int64_t>{}, std::move(group_name), rank, pin_memory);
  // Through the setter, so construction checks exactly what a later write would.
  static_cast<ShardedTensorImpl*>(tensor.unsafeGetTensorImpl())
      ->set_local_shards(std::move(local_shards), std::move(local_shard_indices));
  return tensor;
}

} // namespace torch_shard
