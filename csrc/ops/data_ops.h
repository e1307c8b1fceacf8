// The ShardedTensor data ops (their schemas and comments are in csrc/torch_shard.cpp): each runs its
// local checks, the agreement, the plan and the move in one call (ops/data_ops.cpp).
#pragma once

#include <optional>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>
#include <c10/core/ScalarType.h>
#include <c10/util/ArrayRef.h>
#include <c10/util/string_view.h>

namespace torch_shard {
namespace ops {

at::Tensor shard(const std::optional<at::Tensor>& tensor, int64_t src, c10::IntArrayRef global_size,
                 c10::ScalarType dtype, std::optional<int64_t> chunk_dim,
                 const std::optional<at::Tensor>& shard_offsets, const std::optional<at::Tensor>& shard_sizes,
                 const std::optional<at::Tensor>& placement_index, std::vector<std::string> placements,
                 c10::IntArrayRef placement_owners, bool requires_grad, c10::string_view group_name);
void gather(const at::Tensor& self, int64_t dst, const std::optional<at::Tensor>& out);
void reshard(const at::Tensor& self, std::optional<int64_t> chunk_dim,
             const std::optional<at::Tensor>& shard_offsets, const std::optional<at::Tensor>& shard_sizes,
             const std::optional<at::Tensor>& placement_index, std::vector<std::string> placements,
             c10::IntArrayRef placement_owners);
void agree_shard(int64_t src, c10::IntArrayRef global_size, c10::ScalarType dtype, int64_t spec_fingerprint,
                 c10::string_view group_name);
void abort_op(c10::string_view op, c10::string_view error_class, c10::string_view group_name,
              c10::string_view message);
std::vector<std::string> error_classes();

} // namespace ops
} // namespace torch_shard
