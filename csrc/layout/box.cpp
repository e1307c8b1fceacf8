#include "layout/box.h"

#include <sstream>

#include <c10/util/Exception.h>

namespace torch_shard {
namespace layout {

std::vector<Box> boxes_from_flat(const std::vector<int64_t>& offsets_flat,
                                 const std::vector<int64_t>& sizes_flat,
                                 int64_t ndim,
                                 int64_t num_shards) {
  TORCH_CHECK_VALUE(ndim >= 0, "torch_shard: expected ndim >= 0, but got ", ndim);
  TORCH_CHECK_VALUE(offsets_flat.size() == sizes_flat.size(),
                    "torch_shard: shard_offsets and shard_sizes should have the same number of "
                    "elements, found ", offsets_flat.size(), " and ", sizes_flat.size(),
                    " respectively");
  size_t n = 0;
  if (ndim == 0) {
    TORCH_CHECK_VALUE(offsets_flat.empty(), "torch_shard: 0-dim shards take no offsets, but got ",
                      offsets_flat.size());
    n = num_shards < 0 ? 0 : static_cast<size_t>(num_shards);
  } else {
    n = offsets_flat.size() / static_cast<size_t>(ndim);
    TORCH_CHECK_VALUE(n * ndim == offsets_flat.size(), "torch_shard: flat shard arrays of length ",
                      offsets_flat.size(), " are not a whole number of ", ndim, "-dim boxes");
    TORCH_CHECK_VALUE(num_shards < 0 || static_cast<size_t>(num_shards) == n,
                      "torch_shard: expected ", num_shards, " shards, but the flat arrays hold ", n);
  }
  std::vector<Box> boxes(n);
  for (size_t i = 0; i < n; ++i) {
    boxes[i].offsets.assign(offsets_flat.begin() + i * ndim, offsets_flat.begin() + (i + 1) * ndim);
    boxes[i].sizes.assign(sizes_flat.begin() + i * ndim, sizes_flat.begin() + (i + 1) * ndim);
  }
  return boxes;
}

std::string dims_str(const Dims& dims) {
  std::ostringstream out;
  out << '[';
  for (size_t i = 0; i < dims.size(); ++i) {
    out << (i ? ", " : "") << dims[i];
  }
  out << ']';
  return out.str();
}

std::string describe_box(const Box& box, size_t index) {
  return "#" + std::to_string(index) + " (offsets " + dims_str(box.offsets) + ", sizes " +
         dims_str(box.sizes) + ")";
}

}  // namespace layout
}  // namespace torch_shard
