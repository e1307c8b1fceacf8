// The kernel of the op _redistribute, local tensors moved between layouts that may hold a box on
// several ranks (its schema and comment are in csrc/torch_shard.cpp; NOTE [ Redistributing replicated
// layouts ] in ops/redistribute.cpp).
#pragma once

#include <vector>

#include <ATen/core/Tensor.h>
#include <c10/util/ArrayRef.h>
#include <c10/util/string_view.h>

namespace torch_shard {
namespace ops {

std::vector<at::Tensor> redistribute(at::TensorList sources, const at::Tensor& like,
                                     c10::IntArrayRef global_size, const at::Tensor& src_offsets,
                                     const at::Tensor& src_sizes, c10::IntArrayRef src_owners,
                                     const at::Tensor& dst_offsets, const at::Tensor& dst_sizes,
                                     c10::IntArrayRef dst_owners, c10::string_view group_name);

} // namespace ops
} // namespace torch_shard
