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

#include "ops/lookup_checks.h"

namespace torch_shard {
namespace ops {

LookupResult colwise_lookup(const LookupCall& call);

at::Tensor colwise_lookup_backward(const at::Tensor& grad, at::TensorList saved, int64_t padding_idx,
                                   c10::string_view mode, c10::string_view group_name);

} // namespace ops
} // namespace torch_shard
