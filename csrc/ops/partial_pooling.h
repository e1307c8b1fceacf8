// What one row-wise weight shard contributes to bags that use rows it does not all hold: the ops
// _embedding_bag_partial and its backward (ops/partial_pooling.cpp, NOTE [ Max ties ]).
#pragma once

#include <optional>
#include <tuple>

#include <ATen/core/Tensor.h>
#include <c10/util/string_view.h>

namespace torch_shard {
namespace ops {

// Per bag, the sum (times per-sample weights) or the max of the rows of `weight` (global rows from
// row_start) among its ids; for max also the position in `ids` of each element's winner (-1: none).
// `owned`: how many ids (from offsets[0] on) fall in the shard's rows, when the caller knows it
// without reading device memory.
std::tuple<at::Tensor, at::Tensor> embedding_bag_partial(const at::Tensor& weight, const at::Tensor& ids,
                                                         const at::Tensor& offsets,
                                                         const std::optional<at::Tensor>& per_sample_weights,
                                                         int64_t row_start, c10::string_view mode,
                                                         int64_t padding_idx, std::optional<int64_t> owned);

// The gradient of the shard's `rows` rows from the gradient of the pooled bags (`argmax`: the
// forward's winners, for max).
at::Tensor embedding_bag_partial_backward(const at::Tensor& grad, const at::Tensor& ids,
                                          const at::Tensor& offsets,
                                          const std::optional<at::Tensor>& per_sample_weights,
                                          const at::Tensor& argmax, int64_t row_start, int64_t rows,
                                          c10::string_view mode, int64_t padding_idx,
                                          std::optional<int64_t> owned);

} // namespace ops
} // namespace torch_shard
