#include "layout/validate.h"

#include <algorithm>
#include <functional>
#include <map>
#include <queue>
#include <unordered_map>

#include <c10/util/Exception.h>

namespace torch_shard {
namespace layout {

namespace {

// Beyond this many dims the 2^d corners per box stop paying for themselves; such tensors are rare and
// fall through to the sweep.
constexpr size_t kMaxCornerDims = 12;

struct DimsHash {
  size_t operator()(const Dims& dims) const noexcept {
    uint64_t h = 0x9e3779b97f4a7c15ull;
    for (int64_t v : dims) {
      h ^= static_cast<uint64_t>(v) + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2);
    }
    return static_cast<size_t>(h);
  }
};

// Adds sign * (the 2^d signed corners of `box`) to `corners`.
void add_corners(const Box& box, int64_t sign, Dims& key,
                 std::unordered_map<Dims, int64_t, DimsHash>& corners) {
  const size_t d = box.ndim();
  key.resize(d);
  for (uint64_t mask = 0; mask < (uint64_t{1} << d); ++mask) {
    int parity = 0;
    for (size_t i = 0; i < d; ++i) {
      const bool upper = (mask >> i) & 1u;
      key[i] = upper ? box.end(i) : box.offsets[i];
      parity ^= static_cast<int>(upper);
    }
    corners[key] += parity ? -sign : sign;
  }
}

bool overlap_from_dim(const Box& a, const Box& b, size_t first_dim) {
  for (size_t d = first_dim; d < a.ndim(); ++d) {
    if (!(a.offsets[d] < b.end(d) && b.offsets[d] < a.end(d))) {
      return false;
    }
  }
  return true;
}

std::pair<size_t, size_t> ordered(size_t i, size_t j) {
  return i < j ? std::make_pair(i, j) : std::make_pair(j, i);
}

} // namespace

// NOTE [ Tiling proof by corner cancellation ]
// The indicator of a half-open box [a, b) in Z^d expands into 2^d signed "orthant" indicators,
//   1_[a,b)(x) = prod_i (1[x_i >= a_i] - 1[x_i >= b_i]) = sum_S (-1)^|S| 1[x >= c_S],
// where corner c_S takes b_i for i in S and a_i elsewhere. Orthant indicators at distinct corners are
// linearly independent, so sum_k 1_box_k == 1_whole pointwise iff the signed corner multisets are
// equal after cancellation. Every indicator is >= 0, so that pointwise identity says exactly "every
// element of `whole` is covered once and nothing outside it is covered": the boxes tile `whole`.
// Checking it is one hash-map pass, O(N * 2^d), with no sorting and no pairwise tests. It answers
// only yes/no; when it says no, the sweep below finds the offending pair for the error message.
std::optional<bool> tiles_exactly(const std::vector<Box>& boxes, const Box& whole) {
  const size_t d = whole.ndim();
  if (d > kMaxCornerDims) {
    return std::nullopt;
  }
  std::unordered_map<Dims, int64_t, DimsHash> corners;
  corners.reserve(boxes.size() * 4 + 16);
  Dims key;
  for (const Box& box : boxes) {
    TORCH_INTERNAL_ASSERT(box.ndim() == d);
    if (!box.empty()) {
      add_corners(box, 1, key, corners);
    }
  }
  if (!whole.empty()) {
    add_corners(whole, -1, key, corners);
  }
  for (const auto& kv : corners) {
    if (kv.second != 0) {
      return false;
    }
  }
  return true;
}

// Sweep along dim 0. Every box in the active set contains the sweep coordinate in dim 0, so in a
// valid layout active boxes are pairwise disjoint in dims 1..d-1. For 2-D tensors that makes the
// active set a set of disjoint intervals in an ordered map, and each insertion needs only its two
// neighbours: O(N log N). For 3 or more dims the candidates are those whose dim-1 interval overlaps
// the new box; they are scanned (valid layouts never get here: they pass the tiling proof first).
std::optional<std::pair<size_t, size_t>> find_overlap(const std::vector<Box>& boxes) {
  std::vector<size_t> order;
  order.reserve(boxes.size());
  for (size_t i = 0; i < boxes.size(); ++i) {
    if (!boxes[i].empty()) {
      order.push_back(i);
    }
  }
  if (order.size() < 2) {
    return std::nullopt;
  }
  const size_t d = boxes[order[0]].ndim();
  if (d == 0) {
    // Every non-empty 0-dim shard is the whole scalar.
    return ordered(order[0], order[1]);
  }
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    if (boxes[a].offsets[0] != boxes[b].offsets[0]) {
      return boxes[a].offsets[0] < boxes[b].offsets[0];
    }
    return a < b;
  });

  if (d == 1) {
    size_t reach = order[0]; // the box that extends furthest so far
    for (size_t k = 1; k < order.size(); ++k) {
      const size_t cur = order[k];
      if (boxes[cur].offsets[0] < boxes[reach].end(0)) {
        return ordered(reach, cur);
      }
      if (boxes[cur].end(0) > boxes[reach].end(0)) {
        reach = cur;
      }
    }
    return std::nullopt;
  }

  // Active boxes keyed by their dim-1 offset; expiry ordered by dim-0 end.
  std::multimap<int64_t, size_t> active;
  using Expiry = std::pair<int64_t, size_t>;
  std::priority_queue<Expiry, std::vector<Expiry>, std::greater<Expiry>> expiry;
  std::vector<std::multimap<int64_t, size_t>::iterator> where(boxes.size());

  for (size_t cur : order) {
    const Box& q = boxes[cur];
    while (!expiry.empty() && expiry.top().first <= q.offsets[0]) {
      active.erase(where[expiry.top().second]);
      expiry.pop();
    }
    if (d == 2) {
      // Active intervals are disjoint: only the neighbours around q's start can touch q.
      auto next = active.lower_bound(q.offsets[1]);
      if (next != active.end() && boxes[next->second].offsets[1] < q.end(1)) {
        return ordered(next->second, cur);
      }
      if (next != active.begin()) {
        auto prev = std::prev(next);
        if (boxes[prev->second].end(1) > q.offsets[1]) {
          return ordered(prev->second, cur);
        }
      }
    } else {
      const auto stop = active.lower_bound(q.end(1));
      for (auto it = active.begin(); it != stop; ++it) {
        if (overlap_from_dim(boxes[it->second], q, 1)) {
          return ordered(it->second, cur);
        }
      }
    }
    where[cur] = active.emplace(q.offsets[1], cur);
    expiry.emplace(q.end(0), cur);
  }
  return std::nullopt;
}

namespace {

// Layouts whose non-empty shards differ along one dim only: every chunk layout, every 1-D tensor. They
// are intervals on that dim, so one pass over the shards in offset order (already sorted for chunk
// layouts, so usually no sort at all) settles overlap, bounds and coverage. Returns false when the
// layout is not of this kind and the general checks must run. Throws upstream's errors otherwise.
bool validate_one_varying_dim(const std::vector<Box>& boxes, const std::optional<Dims>& global_size) {
  std::vector<size_t> live;
  live.reserve(boxes.size());
  for (size_t i = 0; i < boxes.size(); ++i) {
    if (!boxes[i].empty()) {
      live.push_back(i);
    }
  }
  if (live.empty()) {
    return false;
  }
  const size_t d = boxes[0].ndim();
  const Box& first = boxes[live[0]];
  std::optional<size_t> varying;
  for (size_t k = 0; k < d; ++k) {
    for (size_t i : live) {
      if (boxes[i].offsets[k] != first.offsets[k] || boxes[i].sizes[k] != first.sizes[k]) {
        if (varying.has_value()) {
          return false; // a second varying dim: not an interval layout
        }
        varying = k;
        break;
      }
    }
  }
  if (!varying.has_value()) {
    // Identical non-empty shards (or just one): two of them overlap.
    TORCH_CHECK_VALUE(live.size() < 2, "Shards ", describe_box(boxes[live[0]], live[0]), " and ",
                      describe_box(boxes[live[1]], live[1]), " overlap");
    if (d == 0) {
      return true; // one scalar shard covering the scalar
    }
    varying = 0;
  }
  const size_t k = *varying;
  auto by_offset = [&](size_t a, size_t b) {
    return boxes[a].offsets[k] != boxes[b].offsets[k] ? boxes[a].offsets[k] < boxes[b].offsets[k] : a < b;
  };
  if (!std::is_sorted(live.begin(), live.end(), by_offset)) {
    std::sort(live.begin(), live.end(), by_offset);
  }
  size_t reach = live[0];
  for (size_t pos = 1; pos < live.size(); ++pos) {
    const size_t cur = live[pos];
    TORCH_CHECK_VALUE(boxes[cur].offsets[k] >= boxes[reach].end(k), "Shards ",
                      describe_box(boxes[std::min(reach, cur)], std::min(reach, cur)), " and ",
                      describe_box(boxes[std::max(reach, cur)], std::max(reach, cur)), " overlap");
    if (boxes[cur].end(k) > boxes[reach].end(k)) {
      reach = cur;
    }
  }
  if (!global_size.has_value()) {
    return true;
  }
  // Bounds: the shared extents once, the varying dim at its furthest shard.
  for (size_t dim = 0; dim < d; ++dim) {
    const size_t i = dim == k ? reach : live[0];
    TORCH_CHECK_VALUE(boxes[i].end(dim) <= (*global_size)[dim], "Shard offset ", boxes[i].offsets[dim],
                      " and length ", boxes[i].sizes[dim], " exceeds tensor dim: ", (*global_size)[dim],
                      " for ", describe_box(boxes[i], i));
  }
  int64_t shards_volume = 0;
  for (size_t i : live) {
    shards_volume = checked_add(shards_volume, boxes[i].volume(), "the total volume of the shards");
  }
  const int64_t tensor_volume = checked_numel(*global_size, "the tensor size");
  TORCH_CHECK_VALUE(shards_volume == tensor_volume, "Total volume of shards: ", shards_volume,
                    " does not match tensor volume: ", tensor_volume,
                    ", in other words all the individual shards do not cover the entire tensor");
  return true;
}

} // namespace

void validate_shards(const std::vector<Box>& boxes, const std::optional<Dims>& global_size) {
  for (size_t i = 0; i < boxes.size(); ++i) {
    const Box& box = boxes[i];
    TORCH_CHECK_VALUE(box.offsets.size() == box.sizes.size(),
                      "shard_offsets and shard_sizes should have the same number of elements, "
                      "found ",
                      box.offsets.size(), " and ", box.sizes.size(), " respectively");
    TORCH_CHECK_VALUE(box.ndim() == boxes[0].ndim(),
                      "Found inconsistent ranks for shards: ", describe_box(boxes[0], 0), " and ",
                      describe_box(box, i));
    check_box(box, i); // negative values, and ends or volumes that overflow int64
  }
  if (global_size.has_value()) {
    for (const Box& box : boxes) {
      TORCH_CHECK_VALUE(box.ndim() == global_size->size(), "Rank of tensor is ", global_size->size(),
                        ", but shards rank is ", box.ndim());
    }
  }
  // The tensor's own volume must be countable before any volume is compared with it.
  const int64_t tensor_volume = global_size.has_value() ? checked_numel(*global_size, "the tensor size") : 0;
  if (boxes.empty()) {
    if (global_size.has_value()) {
      TORCH_CHECK_VALUE(tensor_volume == 0,
                        "Total volume of shards: 0 does not match tensor volume: ", tensor_volume,
                        ", in other words all the individual shards do not cover the entire tensor");
    }
    return;
  }

  const size_t d = boxes[0].ndim();
  if (validate_one_varying_dim(boxes, global_size)) {
    return;
  }

  // Fast path: a proof that the shards tile the tensor (or, without a global size, their bounding
  // box) settles every remaining check at once.
  Box whole{Dims(d, 0), Dims(d, 0)};
  if (global_size.has_value()) {
    whole.sizes = *global_size;
  } else {
    bool any = false;
    Dims hi(d, 0);
    for (const Box& box : boxes) {
      if (box.empty()) {
        continue;
      }
      for (size_t k = 0; k < d; ++k) {
        whole.offsets[k] = any ? std::min(whole.offsets[k], box.offsets[k]) : box.offsets[k];
        hi[k] = any ? std::max(hi[k], box.end(k)) : box.end(k);
      }
      any = true;
    }
    for (size_t k = 0; k < d; ++k) {
      whole.sizes[k] = hi[k] - whole.offsets[k];
    }
    if (!any) {
      return; // only empty shards: nothing can overlap
    }
  }
  if (tiles_exactly(boxes, whole).value_or(false)) {
    return;
  }

  if (auto pair = find_overlap(boxes)) {
    TORCH_CHECK_VALUE(false, "Shards ", describe_box(boxes[pair->first], pair->first), " and ",
                      describe_box(boxes[pair->second], pair->second), " overlap");
  }
  if (!global_size.has_value()) {
    return;
  }
  // Every shard is inside the tensor and no two overlap (checked above), so the running sum never
  // exceeds the tensor's volume; it is checked anyway, as a sum of user-given values.
  int64_t shards_volume = 0;
  for (size_t i = 0; i < boxes.size(); ++i) {
    const Box& box = boxes[i];
    if (box.empty()) {
      continue;
    }
    for (size_t k = 0; k < d; ++k) {
      TORCH_CHECK_VALUE(box.end(k) <= (*global_size)[k], "Shard offset ", box.offsets[k], " and length ",
                        box.sizes[k], " exceeds tensor dim: ", (*global_size)[k], " for ",
                        describe_box(box, i));
    }
    shards_volume = checked_add(shards_volume, box.volume(), "the total volume of the shards");
  }
  TORCH_CHECK_VALUE(shards_volume == tensor_volume, "Total volume of shards: ", shards_volume,
                    " does not match tensor volume: ", tensor_volume,
                    ", in other words all the individual shards do not cover the entire tensor");
  // Disjoint in-bounds shards whose volumes add up to the tensor's tile it; the proof above would
  // have passed. Reaching here means that proof was skipped (too many dims), which is fine.
}

} // namespace layout
} // namespace torch_shard
