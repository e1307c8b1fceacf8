// The kernels of the impl ops, which build a ShardedTensorImpl, read it back and write its local shards
// (their schemas and comments are in csrc/torch_shard.cpp; ops/impl_ops.cpp).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>
#include <c10/core/ScalarType.h>
#include <c10/util/ArrayRef.h>
#include <c10/util/string_view.h>

namespace torch_shard {
namespace ops {

at::Tensor make_sharded(at::TensorList local_shards, c10::IntArrayRef local_shard_indices,
                        c10::IntArrayRef global_size,
                        // The layout's argument group (ops/layout_args.h).
                        std::optional<int64_t> chunk_dim, const std::optional<at::Tensor>& shard_offsets,
                        const std::optional<at::Tensor>& shard_sizes,
                        const std::optional<at::Tensor>& placement_index, std::vector<std::string> placements,
                        c10::IntArrayRef placement_owners,
                        // The tensor's properties, this process in its group, and whether to validate.
                        c10::ScalarType dtype, std::optional<c10::Device> device, bool pin_memory,
                        c10::string_view group_name, int64_t rank, int64_t world, bool validate);
bool is_sharded(const at::Tensor& self);
std::vector<at::Tensor> local_shards(const at::Tensor& self);
std::vector<int64_t> local_shard_indices(const at::Tensor& self);
int64_t version(const at::Tensor& self);
std::tuple<int64_t, std::vector<at::Tensor>, std::vector<int64_t>, bool, int64_t, int64_t>
state(const at::Tensor& self);
std::tuple<at::Tensor, at::Tensor, at::Tensor, std::vector<std::string>, std::vector<int64_t>,
           std::optional<int64_t>>
layout_of(const at::Tensor& self);
std::string group_name(const at::Tensor& self);
void set_local_shards(const at::Tensor& self, at::TensorList local_shards,
                      c10::IntArrayRef local_shard_indices);
std::vector<int64_t> local_shard_mismatch(at::TensorList tensors, c10::IntArrayRef shard_sizes,
                                          c10::IntArrayRef shard_ndims,
                                          const std::vector<std::string>& devices,
                                          std::optional<c10::ScalarType> dtype,
                                          std::optional<bool> pin_memory, std::optional<bool> requires_grad,
                                          bool strided_contiguous);

} // namespace ops
} // namespace torch_shard
