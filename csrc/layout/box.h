// Shard boxes: the pure shape vocabulary every layout function speaks.
//
// A shard is a half-open box [offsets, offsets + sizes) inside the global tensor. Boxes carry no
// device or rank; callers keep that beside them, indexed like the box list.
//
// NOTE [ Checked box arithmetic ]
// Offsets and sizes come from users (ShardMetadata, op arguments), so `offset + size` and the product
// of the sizes can overflow int64, which is undefined behaviour in C++. Every box that enters the
// layout code passes check_box() first: it rejects negative values and any end or volume that does not
// fit in int64, with a ValueError naming the shard. After that, end() and volume() of the box, and of
// every box inside it (intersections), are exact. Sums of volumes and byte counts are checked where
// they are formed (checked_add / checked_mul).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <c10/util/Exception.h>
#include <c10/util/safe_numerics.h>

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

  // Exact for boxes that passed check_box (see NOTE [ Checked box arithmetic ]).
  int64_t volume() const {
    int64_t v = 1;
    for (int64_t s : sizes) {
      v *= s;
    }
    return v;
  }

  // Exact for boxes that passed check_box.
  int64_t end(size_t d) const { return offsets[d] + sizes[d]; }

  bool operator==(const Box& other) const { return offsets == other.offsets && sizes == other.sizes; }
};

// "[1, 2, 3]"
std::string dims_str(const Dims& dims);

// "#3 (offsets [0, 5], sizes [5, 5])": how error messages name box number 3.
std::string describe_box(const Box& box, size_t index);

// ValueError unless `box` (shard number `index`) has as many offsets as sizes, no negative value, and
// every end offset and its volume fit in int64. Messages keep upstream's wording where it had one.
void check_box(const Box& box, size_t index);

// a + b and a * b, or a ValueError saying what overflowed (`what` names the quantity).
int64_t checked_add(int64_t a, int64_t b, const char* what);
int64_t checked_mul(int64_t a, int64_t b, const char* what);

// Product of `dims` (the number of elements of a tensor of that size); ValueError on overflow or on a
// negative size.
int64_t checked_numel(const Dims& dims, const char* what);

} // namespace layout
} // namespace torch_shard
