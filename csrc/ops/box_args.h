// Shard boxes arrive in op schemas as two int64 tensors of shape (N, ndim): offsets and sizes.
// Tensors rather than int[] because converting a Python list of N * ndim ints element by element
// dominates validation time for large N; a (N, ndim) tensor built from an array buffer is zero-copy.
#pragma once

#include <vector>

#include <ATen/core/Tensor.h>
#include <c10/util/Exception.h>

#include "layout/box.h"

namespace torch_shard {

inline std::vector<layout::Box> boxes_from_tensors(const at::Tensor& offsets,
                                                   const at::Tensor& sizes,
                                                   const char* op) {
  TORCH_CHECK_VALUE(offsets.dim() == 2 && sizes.dim() == 2, "torch_shard.", op,
                    ": expected (N, ndim) offset and size tensors, but got shapes ", offsets.sizes(),
                    " and ", sizes.sizes());
  TORCH_CHECK_VALUE(offsets.sizes() == sizes.sizes(), "torch_shard.", op,
                    ": shard_offsets and shard_sizes should have the same number of elements, found ",
                    offsets.sizes(), " and ", sizes.sizes(), " respectively");
  TORCH_CHECK_TYPE(offsets.scalar_type() == at::kLong && sizes.scalar_type() == at::kLong,
                   "torch_shard.", op, ": expected int64 offset and size tensors");
  TORCH_CHECK_VALUE(offsets.device().is_cpu() && sizes.device().is_cpu(), "torch_shard.", op,
                    ": expected CPU offset and size tensors");
  const at::Tensor off = offsets.contiguous();
  const at::Tensor len = sizes.contiguous();
  const int64_t n = off.size(0);
  const int64_t ndim = off.size(1);
  const int64_t* off_ptr = off.const_data_ptr<int64_t>();
  const int64_t* len_ptr = len.const_data_ptr<int64_t>();
  std::vector<layout::Box> boxes(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    boxes[i].offsets.assign(off_ptr + i * ndim, off_ptr + (i + 1) * ndim);
    boxes[i].sizes.assign(len_ptr + i * ndim, len_ptr + (i + 1) * ndim);
  }
  return boxes;
}

}  // namespace torch_shard
