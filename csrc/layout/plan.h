// Transfer plans: which part of which source shard goes to which target shard, grouped by peer.
//
// Moving data between two layouts of the same global tensor is the set of non-empty intersections
// between source boxes and target boxes. A rank sends the intersections of its own source shards
// with every target shard, and receives the intersections of its own target shards with every source
// shard. Both sides list the regions exchanged with a peer in the same canonical order (target index,
// then source index), so a flat buffer per peer needs no headers.
#pragma once

#include <optional>
#include <utility>
#include <vector>

#include "layout/box.h"

namespace torch_shard {
namespace layout {

// The intersection of two boxes, or nullopt when it holds no element.
std::optional<Box> intersect(const Box& a, const Box& b);

struct Region {
  size_t src;  // index of the source shard in the source layout
  size_t dst;  // index of the target shard in the target layout
  Box box;     // in global coordinates
};

struct PeerTransfer {
  std::vector<Region> regions;  // canonical order: (dst, src)
  int64_t elements = 0;
};

struct TransferPlan {
  std::vector<PeerTransfer> send;  // indexed by peer rank
  std::vector<PeerTransfer> recv;  // indexed by peer rank
};

// The plan of rank `me` in a group of `world` ranks. Owners are group ranks; shards whose owner is
// outside [0, world) belong to nobody in the group and are skipped.
TransferPlan plan_transfer(const std::vector<Box>& src_boxes,
                           const std::vector<int64_t>& src_owners,
                           const std::vector<Box>& dst_boxes,
                           const std::vector<int64_t>& dst_owners,
                           int64_t me,
                           int64_t world);

// Where `region` lies in the row-major memory of a tensor shaped like `shard`: (first element,
// element count) when the region is one contiguous run of that memory, else nullopt.
std::optional<std::pair<int64_t, int64_t>> contiguous_run(const Box& region, const Box& shard);

// Bytes that change owner under a plan: what rank `me` sends to other ranks.
int64_t elements_sent_to_peers(const TransferPlan& plan, int64_t me);

}  // namespace layout
}  // namespace torch_shard
