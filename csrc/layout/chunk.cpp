#include "layout/chunk.h"

#include <algorithm>

#include <c10/util/Exception.h>

namespace torch_shard {
namespace layout {

int64_t chunk_split_size(int64_t dim_size, int64_t num_chunks) {
  TORCH_CHECK_VALUE(num_chunks > 0, "torch_shard: expected at least one chunk, but got ", num_chunks);
  TORCH_CHECK_VALUE(dim_size >= 0, "torch_shard: expected a non-negative dim size, but got ", dim_size);
  // ceil without forming dim_size + num_chunks - 1, which can overflow.
  return dim_size / num_chunks + (dim_size % num_chunks != 0 ? 1 : 0);
}

int64_t chunked_dim_size(int64_t dim_size, int64_t split_size, int64_t index) {
  if (split_size <= 0 || index < 0) {
    return 0;
  }
  // start = split * index; chunks that start at or past the end are empty. Compare by division so
  // split * index is only formed when it cannot overflow (it is then <= dim_size).
  if (index >= dim_size / split_size + (dim_size % split_size != 0 ? 1 : 0)) {
    return 0;
  }
  const int64_t start = split_size * index;
  return std::min(split_size, dim_size - start);
}

int64_t normalize_chunk_dim(int64_t dim, size_t ndim) {
  const auto n = static_cast<int64_t>(ndim);
  TORCH_CHECK_VALUE(dim < n && dim >= -n, "Invalid sharding dim: ", dim);
  return dim < 0 ? dim + n : dim;
}

std::vector<Box> chunk_boxes(const Dims& global_size, int64_t dim, int64_t num_chunks) {
  const int64_t d = normalize_chunk_dim(dim, global_size.size());
  const int64_t dim_size = global_size[d];
  const int64_t split = chunk_split_size(dim_size, num_chunks);
  std::vector<Box> boxes;
  boxes.reserve(static_cast<size_t>(num_chunks));
  for (int64_t i = 0; i < num_chunks; ++i) {
    Box box{Dims(global_size.size(), 0), global_size};
    box.offsets[d] = checked_mul(split, i, "torch_shard: a chunk offset");
    box.sizes[d] = chunked_dim_size(dim_size, split, i);
    boxes.push_back(std::move(box));
  }
  return boxes;
}

} // namespace layout
} // namespace torch_shard
