// Kernels for the pure layout ops: thin adapters from schema types to csrc/layout/.
//
// They are CompositeImplicitAutograd: chunk_layout has no tensor inputs, so the dispatcher needs a
// kernel that serves an empty key set, and none of them has anything for autograd to track.

#include <torch/library.h>

#include "layout/box.h"
#include "ops/box_args.h"
#include "layout/chunk.h"
#include "layout/validate.h"

namespace torch_shard {
namespace {

std::tuple<std::vector<int64_t>, std::vector<int64_t>> chunk_layout(int64_t dim_size,
                                                                    int64_t num_chunks) {
  const int64_t split = layout::chunk_split_size(dim_size, num_chunks);
  std::vector<int64_t> offsets(num_chunks), lengths(num_chunks);
  for (int64_t i = 0; i < num_chunks; ++i) {
    offsets[i] = split * i;
    lengths[i] = layout::chunked_dim_size(dim_size, split, i);
  }
  return {std::move(offsets), std::move(lengths)};
}

void validate_shards(const at::Tensor& shard_offsets,
                     const at::Tensor& shard_sizes,
                     c10::OptionalIntArrayRef global_size) {
  const auto boxes = boxes_from_tensors(shard_offsets, shard_sizes, "validate_shards");
  std::optional<layout::Dims> global;
  if (global_size.has_value()) {
    global = global_size->vec();
  }
  layout::validate_shards(boxes, global);
}

std::vector<int64_t> find_overlap(const at::Tensor& shard_offsets, const at::Tensor& shard_sizes) {
  const auto boxes = boxes_from_tensors(shard_offsets, shard_sizes, "_find_overlap");
  if (auto pair = layout::find_overlap(boxes)) {
    return {static_cast<int64_t>(pair->first), static_cast<int64_t>(pair->second)};
  }
  return {};
}

}  // namespace

TORCH_LIBRARY_IMPL(torch_shard, CompositeImplicitAutograd, m) {
  m.impl("chunk_layout", TORCH_FN(chunk_layout));
  m.impl("validate_shards", TORCH_FN(validate_shards));
  m.impl("_find_overlap", TORCH_FN(find_overlap));
}

}  // namespace torch_shard
