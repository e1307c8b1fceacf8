// A column-wise sharded lookup in one call per forward and one per backward: the kernels of the ops
// _colwise_lookup and _colwise_lookup_backward (schemas in csrc/torch_shard.cpp).
#pragma once

#include <cstdint>
#include <optional>
#include <tuple>
#include <vector>

#include <ATen/core/Tensor.h>
#include <c10/util/ArrayRef.h>
#include <c10/util/string_view.h>

namespace torch_shard {
namespace ops {

std::tuple<at::Tensor, std::vector<at::Tensor>>
colwise_lookup(const at::Tensor& local, const at::Tensor& ids, const std::optional<at::Tensor>& offsets,
               const std::optional<at::Tensor>& per_sample_weights, c10::IntArrayRef block_starts,
               c10::IntArrayRef block_sizes, int64_t num_embeddings, int64_t padding_idx,
               c10::string_view mode, bool include_last_offset, bool needs_grad, int64_t fingerprint,
               c10::ArrayRef<double> arguments, c10::string_view group_name);

at::Tensor colwise_lookup_backward(const at::Tensor& grad, at::TensorList saved, int64_t padding_idx,
                                   c10::string_view mode, c10::string_view group_name);

} // namespace ops
} // namespace torch_shard
