// ShardedTensorImpl: the storage-less c10::TensorImpl behind torch_shard.ShardedTensor.
//
// It reports the GLOBAL tensor (sizes, contiguous strides, dtype) to everything that reads TensorImpl
// fields, owns no storage, and holds what C++ kernels need to work without Python: the global shard
// boxes and their owners (as ranks in the tensor's process group; -1 for none), this rank's local
// shard tensors (with the index of the global shard each one is), and the process group by name. Python objects (specs, ProcessGroup handles) are never
// stored here; see TENSORIMPL_NOTES.md B.4 and B.6.
#pragma once

#include <string>
#include <vector>

#include <ATen/Tensor.h>
#include <c10/core/TensorImpl.h>

#include "layout/box.h"

namespace torch_shard {

class ShardedTensorImpl : public c10::TensorImpl {
 public:
  ShardedTensorImpl(caffe2::TypeMeta dtype,
                    c10::Device device,
                    layout::Dims global_size,
                    std::vector<layout::Box> global_shards,
                    std::vector<int64_t> shard_ranks,
                    std::vector<at::Tensor> local_shards,
                    std::vector<int64_t> local_shard_indices,
                    std::string group_name,
                    bool pin_memory);

  const layout::Dims& global_size() const { return global_size_; }
  const std::vector<layout::Box>& global_shards() const { return global_shards_; }
  const std::vector<int64_t>& shard_ranks() const { return shard_ranks_; }
  const std::vector<at::Tensor>& local_shards() const { return local_shards_; }
  const std::vector<int64_t>& local_shard_indices() const { return local_shard_indices_; }
  const std::string& group_name() const { return group_name_; }
  bool pin_memory() const { return pin_memory_; }

  // Replaces the shard layout and local shards (reshard works in place). The global size and dtype
  // stay; the caller guarantees `local_shards` match `global_shards` at `local_shard_indices`.
  void set_layout(std::vector<layout::Box> global_shards,
                  std::vector<int64_t> shard_ranks,
                  std::vector<at::Tensor> local_shards,
                  std::vector<int64_t> local_shard_indices);

  // See NOTE [ ShardedTensorImpl detach ] in sharded_tensor_impl.cpp.
  c10::intrusive_ptr<c10::TensorImpl> shallow_copy_and_detach(
      const c10::VariableVersion& version_counter,
      bool allow_tensor_metadata_change) const override;
  c10::intrusive_ptr<c10::TensorImpl> shallow_copy_and_detach(
      c10::VariableVersion&& version_counter,
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
  c10::intrusive_ptr<c10::TensorImpl> shallow_copy_and_detach_core(
      VariableVersion&& version_counter,
      bool allow_tensor_metadata_change) const;

  void copy_sharded_fields_from(const ShardedTensorImpl& src);

  layout::Dims global_size_;
  std::vector<layout::Box> global_shards_;
  std::vector<int64_t> shard_ranks_;
  std::vector<at::Tensor> local_shards_;
  std::vector<int64_t> local_shard_indices_;
  std::string group_name_;
  bool pin_memory_ = false;
};

bool is_sharded_tensor(const at::Tensor& tensor);

// The impl of `tensor`; TypeError naming `op` when it is not a ShardedTensor.
ShardedTensorImpl* unsafe_get_sharded_impl(const at::Tensor& tensor, const char* op);

// Builds a ShardedTensor (as a plain at::Tensor whose impl is a ShardedTensorImpl) after checking that
// the local shards agree with the global metadata. Python wraps the result with _make_subclass.
at::Tensor make_sharded_tensor(std::vector<at::Tensor> local_shards,
                               std::vector<int64_t> local_shard_indices,
                               layout::Dims global_size,
                               std::vector<layout::Box> global_shards,
                               std::vector<int64_t> shard_ranks,
                               c10::ScalarType dtype,
                               c10::Device device,
                               bool pin_memory,
                               std::string group_name);

}  // namespace torch_shard
