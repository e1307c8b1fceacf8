#include "layout/box.h"

#include <sstream>

namespace torch_shard {
namespace layout {

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

void check_box(const Box& box, size_t index) {
  TORCH_CHECK_VALUE(box.offsets.size() == box.sizes.size(),
                    "shard_offsets and shard_sizes should have the same number of elements, found ",
                    box.offsets.size(), " and ", box.sizes.size(), " respectively");
  bool empty = false;
  for (size_t d = 0; d < box.ndim(); ++d) {
    TORCH_CHECK_VALUE(box.offsets[d] >= 0, "shard_offsets should be >=0, but ", describe_box(box, index),
                      " has a negative offset");
    TORCH_CHECK_VALUE(box.sizes[d] >= 0, "shard_sizes should be >= 0, but ", describe_box(box, index),
                      " has a negative size");
    int64_t end = 0;
    TORCH_CHECK_VALUE(!c10::add_overflows(box.offsets[d], box.sizes[d], &end), "shard ",
                      describe_box(box, index), ": offset + size overflows int64 on dim ", d);
    empty = empty || box.sizes[d] == 0;
  }
  if (empty) {
    return; // volume 0, whatever the other sizes are
  }
  int64_t volume = 1;
  for (int64_t s : box.sizes) {
    TORCH_CHECK_VALUE(!c10::mul_overflows(volume, s, &volume), "shard ", describe_box(box, index),
                      ": its number of elements overflows int64");
  }
}

int64_t checked_add(int64_t a, int64_t b, const char* what) {
  int64_t out = 0;
  TORCH_CHECK_VALUE(!c10::add_overflows(a, b, &out), what, " overflows int64 (", a, " + ", b, ")");
  return out;
}

int64_t checked_mul(int64_t a, int64_t b, const char* what) {
  int64_t out = 0;
  TORCH_CHECK_VALUE(!c10::mul_overflows(a, b, &out), what, " overflows int64 (", a, " * ", b, ")");
  return out;
}

int64_t checked_numel(const Dims& dims, const char* what) {
  int64_t numel = 1;
  bool empty = false;
  for (int64_t s : dims) {
    TORCH_CHECK_VALUE(s >= 0, what, " has a negative size: ", dims_str(dims));
    empty = empty || s == 0;
  }
  if (empty) {
    return 0;
  }
  for (int64_t s : dims) {
    TORCH_CHECK_VALUE(!c10::mul_overflows(numel, s, &numel), what, " ", dims_str(dims),
                      " has more elements than int64 can count");
  }
  return numel;
}

} // namespace layout
} // namespace torch_shard
