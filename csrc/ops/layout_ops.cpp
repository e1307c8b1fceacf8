// Kernels for the pure layout ops: thin adapters from schema types to csrc/layout/.
//
// They are CompositeImplicitAutograd: no tensor inputs, so the dispatcher needs a kernel that serves
// an empty key set, and there is nothing for autograd to track.

#include <torch/library.h>

#include "layout/box.h"
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

void validate_shards(c10::IntArrayRef shard_offsets,
                     c10::IntArrayRef shard_sizes,
                     int64_t ndim,
                     c10::OptionalIntArrayRef global_size,
                     int64_t num_shards) {
  const auto boxes =
      layout::boxes_from_flat(shard_offsets.vec(), shard_sizes.vec(), ndim, num_shards);
  std::optional<layout::Dims> global;
  if (global_size.has_value()) {
    global = global_size->vec();
  }
  layout::validate_shards(boxes, global);
}

std::vector<int64_t> find_overlap(c10::IntArrayRef shard_offsets,
                                  c10::IntArrayRef shard_sizes,
                                  int64_t ndim,
                                  int64_t num_shards) {
  const auto boxes =
      layout::boxes_from_flat(shard_offsets.vec(), shard_sizes.vec(), ndim, num_shards);
  for (size_t i = 1; i < boxes.size(); ++i) {
    TORCH_CHECK_VALUE(boxes[i].ndim() == boxes[0].ndim(), "Found inconsistent ranks for shards: ",
                      layout::describe_box(boxes[0], 0), " and ", layout::describe_box(boxes[i], i));
  }
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
