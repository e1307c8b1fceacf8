// max_norm on a sharded weight: the op _embedding_renorm_, which renormalises in place, on every rank,
// the rows any rank's lookup will read (NOTE [ max_norm on a sharded weight ] in ops/renorm.cpp).
#pragma once

#include <cstdint>

#include <ATen/core/Tensor.h>
#include <c10/util/ArrayRef.h>
#include <c10/util/string_view.h>

namespace torch_shard {
namespace ops {

// `local`: this rank's shard of a table of `num_embeddings` rows sharded along `dim` (0: rows, 1:
// columns; block_starts / block_sizes: each group rank's block along it); `ids`: this rank's ids.
void embedding_renorm(const at::Tensor& local, const at::Tensor& ids, int64_t dim,
                      c10::IntArrayRef block_starts, c10::IntArrayRef block_sizes, int64_t num_embeddings,
                      double max_norm, double norm_type, int64_t fingerprint, c10::ArrayRef<double> arguments,
                      c10::string_view group_name);

} // namespace ops
} // namespace torch_shard
