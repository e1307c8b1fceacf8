// Kernels for the pure layout ops: thin adapters from schema types to csrc/layout/.
//
// They are CompositeImplicitAutograd: chunk_layout has no tensor inputs, so the dispatcher needs a
// kernel that serves an empty key set, and none of them has anything for autograd to track.

#include <torch/library.h>

#include <ATen/ops/empty.h>

#include "layout/box.h"
#include "layout/chunk.h"
#include "layout/validate.h"
#include "ops/layout_args.h"

namespace torch_shard {
namespace {

std::tuple<std::vector<int64_t>, std::vector<int64_t>> chunk_layout(int64_t dim_size,
                                                                    int64_t num_chunks) {
  const int64_t split = layout::chunk_split_size(dim_size, num_chunks);
  std::vector<int64_t> offsets(num_chunks), lengths(num_chunks);
  for (int64_t i = 0; i < num_chunks; ++i) {
    offsets[i] = layout::checked_mul(split, i, "torch_shard: a chunk offset");
    lengths[i] = layout::chunked_dim_size(dim_size, split, i);
  }
  return {std::move(offsets), std::move(lengths)};
}

int64_t chunked_dim_size(int64_t dim_size, int64_t split_size, int64_t index) {
  return layout::chunked_dim_size(dim_size, split_size, index);
}

// The (N, ndim) offsets and sizes of ChunkShardingSpec's N-D boxes: `global_size` split along `dim`
// into `num_chunks` chunks.
std::tuple<at::Tensor, at::Tensor> chunk_boxes(c10::IntArrayRef global_size, int64_t dim,
                                               int64_t num_chunks) {
  const auto boxes = layout::chunk_boxes(global_size.vec(), dim, num_chunks);
  const auto ndim = static_cast<int64_t>(global_size.size());
  const auto opts = at::TensorOptions().dtype(at::kLong);
  at::Tensor offsets = at::empty({num_chunks, ndim}, opts);
  at::Tensor sizes = at::empty({num_chunks, ndim}, opts);
  int64_t* off = offsets.mutable_data_ptr<int64_t>();
  int64_t* len = sizes.mutable_data_ptr<int64_t>();
  for (int64_t i = 0; i < num_chunks; ++i) {
    std::copy(boxes[i].offsets.begin(), boxes[i].offsets.end(), off + i * ndim);
    std::copy(boxes[i].sizes.begin(), boxes[i].sizes.end(), len + i * ndim);
  }
  return {std::move(offsets), std::move(sizes)};
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
  m.impl("chunk_boxes", TORCH_FN(chunk_boxes));
  m.impl("chunked_dim_size", TORCH_FN(chunked_dim_size));
  m.impl("validate_shards", TORCH_FN(validate_shards));
  m.impl("_find_overlap", TORCH_FN(find_overlap));
}

}  // namespace torch_shard
