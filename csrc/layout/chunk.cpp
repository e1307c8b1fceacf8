#include "layout/chunk.h"

#include <algorithm>

#include <c10/util/Exception.h>

namespace torch_shard {
namespace layout {

int64_t chunk_split_size(int64_t dim_size, int64_t num_chunks) {
  TORCH_CHECK_VALUE(num_chunks > 0, "torch_shard: expected at least one chunk, but got ", num_chunks);
  TORCH_CHECK_VALUE(dim_size >= 0, "torch_shard: expected a non-negative dim size, but got ", dim_size);
  return (dim_size + num_chunks - 1) / num_chunks;
}

int64_t chunked_dim_size(int64_t dim_size, int64_t split_size, int64_t index) {
  return std::max<int64_t>(std::min(dim_size, split_size * (index + 1)) - split_size * index, 0);
}

std::vector<Box> chunk_boxes(const Dims& global_size, int64_t dim, int64_t num_chunks) {
  const auto ndim = static_cast<int64_t>(global_size.size());
  TORCH_CHECK_INDEX(dim >= 0 && dim < ndim, "torch_shard: chunk dim ", dim,
                    " is out of range for a tensor of ", ndim, " dims");
  const int64_t dim_size = global_size[dim];
  const int64_t split = chunk_split_size(dim_size, num_chunks);
  std::vector<Box> boxes;
  boxes.reserve(num_chunks);
  for (int64_t i = 0; i < num_chunks; ++i) {
    Box box{Dims(ndim, 0), global_size};
    box.offsets[dim] = split * i;
    box.sizes[dim] = chunked_dim_size(dim_size, split, i);
    boxes.push_back(std::move(box));
  }
  return boxes;
}

}  // namespace layout
}  // namespace torch_shard
