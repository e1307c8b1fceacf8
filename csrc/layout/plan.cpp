#include "layout/plan.h"

#include <algorithm>

#include "layout/layout.h"

#include <c10/util/Exception.h>

namespace torch_shard {
namespace layout {

std::optional<Box> intersect(const Box& a, const Box& b) {
  TORCH_INTERNAL_ASSERT(a.ndim() == b.ndim());
  Box out{Dims(a.ndim()), Dims(a.ndim())};
  for (size_t d = 0; d < a.ndim(); ++d) {
    const int64_t lo = std::max(a.offsets[d], b.offsets[d]);
    const int64_t hi = std::min(a.end(d), b.end(d));
    if (hi <= lo) {
      return std::nullopt;
    }
    out.offsets[d] = lo;
    out.sizes[d] = hi - lo;
  }
  return out;
}

namespace {

// Non-empty boxes sorted by their dim-0 offset, with the longest dim-0 extent, so the boxes that can
// meet a query box are found by binary search instead of a scan of all N.
struct SortedBoxes {
  std::vector<size_t> order;
  int64_t max_len0 = 0;

  SortedBoxes(const std::vector<Box>& boxes, const std::vector<int64_t>& owners, int64_t world) {
    for (size_t i = 0; i < boxes.size(); ++i) {
      if (!boxes[i].empty() && owners[i] >= 0 && owners[i] < world) {
        order.push_back(i);
      }
    }
    if (!boxes.empty() && boxes[0].ndim() > 0) {
      std::stable_sort(order.begin(), order.end(),
                       [&](size_t a, size_t b) { return boxes[a].offsets[0] < boxes[b].offsets[0]; });
      for (size_t i : order) {
        max_len0 = std::max(max_len0, boxes[i].sizes[0]);
      }
    }
  }

  // Indices of boxes that may intersect `q` (a superset; intersect() decides).
  template <typename F>
  void for_each_candidate(const std::vector<Box>& boxes, const Box& q, F&& f) const {
    if (q.ndim() == 0) {
      for (size_t i : order) {
        f(i);
      }
      return;
    }
    // Candidates start in (q.offset0 - max_len0, q.end0).
    const int64_t lo = q.offsets[0] - max_len0;
    auto first = std::upper_bound(order.begin(), order.end(), lo,
                                  [&](int64_t v, size_t i) { return v < boxes[i].offsets[0]; });
    for (auto it = first; it != order.end() && boxes[*it].offsets[0] < q.end(0); ++it) {
      f(*it);
    }
  }
};

} // namespace

namespace {

// The regions of one peer, in canonical order, as one contiguous run of a single shard of `layout`.
std::optional<Run> single_run(const std::vector<Region>& regions, const Layout& layout, bool use_src) {
  if (regions.empty()) {
    return std::nullopt;
  }
  const size_t shard = use_src ? regions.front().src : regions.front().dst;
  std::optional<Run> out;
  for (const Region& region : regions) {
    if ((use_src ? region.src : region.dst) != shard) {
      return std::nullopt;
    }
    const auto run = contiguous_run(region.box, layout.box(shard));
    if (!run.has_value()) {
      return std::nullopt;
    }
    if (!out.has_value()) {
      out = Run{shard, run->first, run->second};
    } else if (run->first != out->start + out->count) {
      return std::nullopt;
    } else {
      out->count += run->second;
    }
  }
  return out;
}

} // namespace

// NOTE [ Replicated source shards ]
// A source layout may hold the same box on several ranks (a DTensor's Replicate() mesh dims: every rank
// along such a dim holds the same box; ShardedTensor layouts never do). Each element must still cross
// the network once per target shard that needs it, so for every target shard exactly one replica
// supplies each replicated box: the one on the target's own rank when there is one (no message at all),
// else replica number (target index mod replicas), which spreads the targets of a replicated box over
// its holders. Sender and receiver compute the same choice from the layouts alone.
class Suppliers {
public:
  Suppliers(const std::vector<Box>& boxes, const std::vector<int64_t>& owners, int64_t world)
      : owners_(owners), group_(boxes.size(), -1) {
    std::vector<size_t> order;
    for (size_t i = 0; i < boxes.size(); ++i) {
      if (!boxes[i].empty() && owners[i] >= 0 && owners[i] < world) {
        order.push_back(i);
      }
    }
    auto less = [&](size_t a, size_t b) {
      if (boxes[a].offsets != boxes[b].offsets) {
        return boxes[a].offsets < boxes[b].offsets;
      }
      if (boxes[a].sizes != boxes[b].sizes) {
        return boxes[a].sizes < boxes[b].sizes;
      }
      return owners[a] != owners[b] ? owners[a] < owners[b] : a < b;
    };
    std::sort(order.begin(), order.end(), less);
    for (size_t k = 0; k < order.size(); ++k) {
      if (k == 0 || !(boxes[order[k]] == boxes[order[k - 1]])) {
        members_.emplace_back();
      }
      members_.back().push_back(order[k]);
      group_[order[k]] = static_cast<int64_t>(members_.size()) - 1;
    }
  }

  // Whether source shard `s` supplies its box's part of target shard `d` (owned by `dst_owner`).
  bool supplies(size_t s, size_t d, int64_t dst_owner) const {
    const auto& replicas = members_[static_cast<size_t>(group_[s])];
    if (replicas.size() == 1) {
      return true;
    }
    for (size_t r : replicas) {
      if (owners_[r] == dst_owner) {
        return r == s;
      }
    }
    return replicas[d % replicas.size()] == s;
  }

private:
  const std::vector<int64_t>& owners_;
  std::vector<int64_t> group_;               // source shard -> its replica group (-1: not planned)
  std::vector<std::vector<size_t>> members_; // replica group -> its shards, by owner
};

TransferPlan plan_transfer(const Layout& src, const Layout& dst, int64_t me, int64_t world) {
  TORCH_INTERNAL_ASSERT(src.global_size() == dst.global_size());
  const auto& src_boxes = src.boxes();
  const auto& dst_boxes = dst.boxes();
  const auto src_owners = src.owners();
  const auto dst_owners = dst.owners();
  TransferPlan plan;
  plan.send.resize(world);
  plan.recv.resize(world);
  const SortedBoxes sorted_dst(dst_boxes, dst_owners, world);
  const SortedBoxes sorted_src(src_boxes, src_owners, world);
  const Suppliers suppliers(src_boxes, src_owners, world);

  // Adds the overlap of source shard s and target shard d to this rank's transfer with a peer, when s
  // is the replica that supplies d. Each side finds its pairs from its own shards' candidates; both
  // sides of a pair apply the same rule, so what one rank plans to send another plans to receive.
  const auto add_overlap = [&](PeerTransfer& peer, size_t s, size_t d) {
    if (!suppliers.supplies(s, d, dst_owners[d])) {
      return;
    }
    if (auto box = intersect(src_boxes[s], dst_boxes[d])) {
      peer.elements += box->volume();
      peer.regions.push_back(Region{s, d, std::move(*box)});
    }
  };
  for (size_t s = 0; s < src_boxes.size(); ++s) {
    if (src_owners[s] == me && !src_boxes[s].empty()) {
      sorted_dst.for_each_candidate(dst_boxes, src_boxes[s],
                                    [&](size_t d) { add_overlap(plan.send[dst_owners[d]], s, d); });
    }
  }
  for (size_t d = 0; d < dst_boxes.size(); ++d) {
    if (dst_owners[d] == me && !dst_boxes[d].empty()) {
      sorted_src.for_each_candidate(src_boxes, dst_boxes[d],
                                    [&](size_t s) { add_overlap(plan.recv[src_owners[s]], s, d); });
    }
  }
  auto canonical = [](const Region& a, const Region& b) {
    return a.dst != b.dst ? a.dst < b.dst : a.src < b.src;
  };
  for (int64_t p = 0; p < world; ++p) {
    auto& send = plan.send[p];
    auto& recv = plan.recv[p];
    std::sort(send.regions.begin(), send.regions.end(), canonical);
    std::sort(recv.regions.begin(), recv.regions.end(), canonical);
    send.run = single_run(send.regions, src, /*use_src=*/true);
    recv.run = single_run(recv.regions, dst, /*use_src=*/false);
    if (p != me) {
      plan.elements_sent_to_peers += send.elements;
      plan.elements_received_from_peers += recv.elements;
    }
  }
  return plan;
}

std::optional<std::pair<int64_t, int64_t>> contiguous_run(const Box& region, const Box& shard) {
  const size_t d = shard.ndim();
  TORCH_INTERNAL_ASSERT(region.ndim() == d);
  // Row-major memory: the region is one run iff every dim after the last partially covered dim is
  // whole (true by definition of "last") and every dim before it has extent 1 in the region.
  size_t last_partial = d;
  for (size_t k = 0; k < d; ++k) {
    if (region.offsets[k] != shard.offsets[k] || region.sizes[k] != shard.sizes[k]) {
      last_partial = k;
    }
  }
  if (last_partial != d) {
    for (size_t k = 0; k < last_partial; ++k) {
      if (region.sizes[k] != 1) {
        return std::nullopt;
      }
    }
  }
  int64_t start = 0;
  int64_t stride = 1;
  for (size_t k = d; k-- > 0;) {
    start += (region.offsets[k] - shard.offsets[k]) * stride;
    stride *= shard.sizes[k];
  }
  return std::make_pair(start, region.volume());
}

} // namespace layout
} // namespace torch_shard
