// Row-wise embedding_bag(mode="max"): every owner's partial maximum, and each element taken from ONE
// owner (NOTE [ Max over owners ] in ops/rowwise_max.cpp); steps 4 and 5 of the row-wise lookup in max
// mode, and the matching part of its backward.
#pragma once

#include <cstdint>
#include <vector>

#include <ATen/core/Tensor.h>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>

#include "ops/routing.h"

namespace torch_shard {
namespace ops {

// `local_ids` / `local_offsets`: every requester's ids here (less this rank's first row) and their bags;
// `perm`: this rank's ids in owner order. Returns this rank's [bags, dim] result; fills the saved ids,
// offsets, winners' positions and chosen owners (RowwiseSaved in ops/rowwise_lookup.h).
at::Tensor max_over_owners(c10d::ProcessGroup& pg, const at::Tensor& local, const at::Tensor& local_ids,
                           const at::Tensor& local_offsets, const at::Tensor& perm, const Routes& routes,
                           int64_t local_pad, std::vector<at::Tensor>& saved);

// The shard's gradient (`rows` rows) from the gradient of max_over_owners' result: each owner gets the
// gradient of exactly the elements it won.
at::Tensor max_backward(c10d::ProcessGroup& pg, const at::Tensor& grad, at::TensorList saved,
                        const Routes& routes, int64_t rows, int64_t local_pad);

} // namespace ops
} // namespace torch_shard
