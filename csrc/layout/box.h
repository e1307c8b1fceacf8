// Shard boxes: the pure shape vocabulary every layout function speaks.
//
// A shard is a half-open box [offsets, offsets + sizes) inside the global tensor. Boxes carry no
// device or rank; callers keep that beside them, indexed like the box list.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace torch_shard {
namespace layout {

using Dims = std::vector<int64_t>;

struct Box {
  Dims offsets;
  Dims sizes;

  size_t ndim() const { return sizes.size(); }

  // A box with a zero extent on any dim holds no elements: it never overlaps anything and is never
  // out of bounds, wherever its offsets point (chunk layouts put trailing empty shards past the end).
  bool empty() const {
    for (int64_t s : sizes) {
      if (s == 0) {
        return true;
      }
    }
    return false;
  }

  int64_t volume() const {
    int64_t v = 1;
    for (int64_t s : sizes) {
      v *= s;
    }
    return v;
  }

  int64_t end(size_t d) const { return offsets[d] + sizes[d]; }
};

// "[1, 2, 3]"
std::string dims_str(const Dims& dims);

// "#3 (offsets [0, 5], sizes [5, 5])": how error messages name box number 3.
std::string describe_box(const Box& box, size_t index);

}  // namespace layout
}  // namespace torch_shard
