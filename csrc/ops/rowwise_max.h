// Row-wise embedding_bag(mode="max"): the owners send back the rows of the requester's ids and the
// requester pools them with ATen's max kernel (NOTE [ Max pools on the requester ] in
// ops/rowwise_max.cpp); step 5 of the row-wise lookup in max mode, and the first step of its backward.
#pragma once

#include <cstdint>
#include <vector>

#include <ATen/core/Tensor.h>

namespace torch_shard {
namespace ops {

// `back`: the rows of this rank's `ids` in owner order (`perm` lists the ids in that order); `offsets`:
// its bags. Returns this rank's [bags, dim] result; fills the saved positions, offsets and the kernel's
// bookkeeping (RowwiseSaved in ops/rowwise_lookup.h) when `needs_grad`.
at::Tensor max_of_rows(const at::Tensor& back, const at::Tensor& ids, const at::Tensor& offsets,
                       const at::Tensor& perm, int64_t padding_idx, bool needs_grad,
                       std::vector<at::Tensor>& saved);

// The gradient of the `num_ids` rows max_of_rows pooled (in owner order) from the gradient of its result.
at::Tensor max_rows_backward(const at::Tensor& grad, at::TensorList saved, int64_t num_ids,
                             int64_t padding_idx);

} // namespace ops
} // namespace torch_shard
