// ShardedTensorImpl: the storage-less c10::TensorImpl behind torch_shard.ShardedTensor.
//
// It reports the GLOBAL tensor (sizes, contiguous strides, dtype) to everything that reads TensorImpl
// fields, owns no storage, and is the only store of what a ShardedTensor is: its layout (every
// shard's box and placement, shared and immutable, see layout/layout.h), this rank's local shard
// tensors with the index of the layout shard each one is, the process group by name and this rank's
// rank in it. Python objects (specs, ProcessGroup handles) are never stored here: Python reads the
// metadata and local shards it shows users from this impl, and writes local shards through one
// setter (set_local_shards). See NOTE [ ShardedTensor state ] in sharded_tensor_impl.cpp.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <ATen/Tensor.h>
#include <c10/core/TensorImpl.h>

#include "layout/layout.h"

namespace torch_shard {

class ShardedTensorImpl : public c10::TensorImpl {
public:
  ShardedTensorImpl(caffe2::TypeMeta dtype, c10::Device device, std::shared_ptr<const layout::Layout> layout,
                    std::vector<at::Tensor> local_shards, std::vector<int64_t> local_shard_indices,
                    std::string group_name, int64_t rank, bool pin_memory);

  const std::shared_ptr<const layout::Layout>& layout() const { return layout_; }
  const layout::Dims& global_size() const { return layout_->global_size(); }
  const std::vector<at::Tensor>& local_shards() const { return local_shards_; }
  const std::vector<int64_t>& local_shard_indices() const { return local_shard_indices_; }
  const std::string& group_name() const { return group_name_; }
  // This process's rank in the group (-1 when the tensor has no group).
  int64_t rank() const { return rank_; }
  bool pin_memory() const { return pin_memory_; }
  // Changes whenever the layout or a local shard does; unique across impls, so Python can cache
  // what it derives from the impl under this stamp.
  int64_t version() const { return version_; }

  // Replaces the layout and the local shards together (reshard). `local_shards` are checked against
  // the layout; the global size and dtype never change.
  void set_layout(std::shared_ptr<const layout::Layout> layout, std::vector<at::Tensor> local_shards,
                  std::vector<int64_t> local_shard_indices);

  // The one setter of local shards: replaces them under the current layout. Each tensor must have its
  // shard's size, the tensor's dtype and its placement's device. The list may differ from the shards
  // the layout assigns to this rank (Python code may hold any list); data ops check that before they
  // move anything (check_local_shards).
  void set_local_shards(std::vector<at::Tensor> local_shards, std::vector<int64_t> local_shard_indices);

  // ValueError (naming `op`) unless the local shards are exactly this rank's shards of the layout,
  // each once.
  void check_local_shards(const char* op) const;

  // See NOTE [ ShardedTensorImpl detach ] in sharded_tensor_impl.cpp.
  c10::intrusive_ptr<c10::TensorImpl>
  shallow_copy_and_detach(const c10::VariableVersion& version_counter,
                          bool allow_tensor_metadata_change) const override;
  c10::intrusive_ptr<c10::TensorImpl>
  shallow_copy_and_detach(c10::VariableVersion&& version_counter,
                          bool allow_tensor_metadata_change) const override;
  void shallow_copy_from(const c10::intrusive_ptr<c10::TensorImpl>& impl) override;

  // The global shape is fixed by the shard layout; in-place metadata edits would desynchronise them.
  void set_size(int64_t dim, int64_t new_size) override;
  void set_stride(int64_t dim, int64_t new_stride) override;
  void set_storage_offset(int64_t storage_offset) override;

protected:
  const char* tensorimpl_type_name() const override { return "ShardedTensorImpl"; }

private:
  template <typename VariableVersion>
  c10::intrusive_ptr<c10::TensorImpl> shallow_copy_and_detach_core(VariableVersion&& version_counter,
                                                                   bool allow_tensor_metadata_change) const;

  void copy_sharded_fields_from(const ShardedTensorImpl& src);
  void check_shards_against(const layout::Layout& layout, const std::vector<at::Tensor>& tensors,
                            const std::vector<int64_t>& indices, const char* op) const;
  // Moves the impl's device (and its backend dispatch key) to where its local shards live.
  void follow_shard_device();

  std::shared_ptr<const layout::Layout> layout_;
  std::vector<at::Tensor> local_shards_;
  std::vector<int64_t> local_shard_indices_;
  std::string group_name_;
  int64_t rank_ = -1;
  bool pin_memory_ = false;
  int64_t version_ = 0;
};

// NOTE [ A local shard against its shard ]
// What makes a tensor fit to be a local shard is decided here, once, for every path that takes one:
// the impl's constructor and setters, and, before anything is built, Python's constructors
// (init_from_local_shards, _init_from_local_shards_and_global_metadata), Shard and the local-shard
// setter, which call torch.ops.torch_shard._local_shard_mismatch and phrase what it finds in the
// message their API documents (upstream's). The checks run in this order, and the first that fails
// names the mismatch: strided layout, contiguity, the shard's size, its placement's device
// (layout::on_placement_device: the same type; the same index unless the placement gives none; CPU
// indices ignored), dtype, pinned memory, requires_grad. Each expectation left out is not checked.
// The codes number the checks in that order from 1; kNone (0): the tensor fits.
enum class ShardMismatch { kNone, kLayout, kContiguity, kSize, kDevice, kDtype, kPinMemory, kRequiresGrad };

struct ShardExpectation {
  bool strided_contiguous = false;   // strided layout and contiguous memory
  c10::IntArrayRef sizes;            // the shard's size
  std::optional<c10::Device> device; // the placement's device
  std::optional<c10::ScalarType> dtype;
  std::optional<bool> pin_memory; // exactly this is_pinned()
  std::optional<bool> requires_grad;
};

ShardMismatch shard_mismatch(const at::Tensor& tensor, const ShardExpectation& expected);

bool is_sharded_tensor(const at::Tensor& tensor);

// The impl of `tensor`; TypeError naming `op` when it is not a ShardedTensor.
ShardedTensorImpl* unsafe_get_sharded_impl(const at::Tensor& tensor, const char* op);

// Builds a ShardedTensor (a plain at::Tensor whose impl is a ShardedTensorImpl) after checking the
// local shards against the layout. Python wraps the result with _make_subclass.
at::Tensor make_sharded_tensor(std::shared_ptr<const layout::Layout> layout,
                               std::vector<at::Tensor> local_shards, std::vector<int64_t> local_shard_indices,
                               c10::ScalarType dtype, std::optional<c10::Device> device, bool pin_memory,
                               std::string group_name, int64_t rank);

} // namespace torch_shard
