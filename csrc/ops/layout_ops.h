// The kernels of the pure layout ops, thin adapters from schema types to csrc/layout/ (their schemas
// and comments are in csrc/torch_shard.cpp; ops/layout_ops.cpp).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include <ATen/core/Tensor.h>
#include <c10/core/ScalarType.h>
#include <c10/util/ArrayRef.h>
#include <c10/util/OptionalArrayRef.h>

namespace torch_shard {
namespace ops {

std::tuple<std::vector<int64_t>, std::vector<int64_t>> chunk_layout(int64_t dim_size, int64_t num_chunks);
int64_t chunked_dim_size(int64_t dim_size, int64_t split_size, int64_t index);
std::tuple<at::Tensor, at::Tensor> chunk_boxes(c10::IntArrayRef global_size, int64_t dim, int64_t num_chunks);
void validate_shards(const at::Tensor& shard_offsets, const at::Tensor& shard_sizes,
                     c10::OptionalIntArrayRef global_size);
std::vector<int64_t> find_overlap(const at::Tensor& shard_offsets, const at::Tensor& shard_sizes);
std::tuple<std::vector<int64_t>, std::vector<int64_t>>
transfer_counts(c10::IntArrayRef global_size, const at::Tensor& src_offsets, const at::Tensor& src_sizes,
                c10::IntArrayRef src_owners, const at::Tensor& dst_offsets, const at::Tensor& dst_sizes,
                c10::IntArrayRef dst_owners, int64_t me, int64_t world);
int64_t layout_fingerprint(c10::IntArrayRef global_size, std::optional<int64_t> chunk_dim,
                           const std::optional<at::Tensor>& shard_offsets,
                           const std::optional<at::Tensor>& shard_sizes,
                           const std::optional<at::Tensor>& placement_index,
                           std::vector<std::string> placements, c10::IntArrayRef placement_owners,
                           c10::ScalarType dtype);

} // namespace ops
} // namespace torch_shard
