// Transfer plans: which part of which source shard goes to which target shard, grouped by peer.
//
// Moving data between two layouts of the same global tensor is the set of non-empty intersections
// between source boxes and target boxes. A rank sends the intersections of its own source shards
// with every target shard, and receives the intersections of its own target shards with every source
// shard. Both sides list the regions exchanged with a peer in the same canonical order (target index,
// then source index), so a flat message per peer needs no headers.
#pragma once

#include <optional>
#include <utility>
#include <vector>

#include "layout/box.h"

namespace torch_shard {
namespace layout {

class Layout;

// The intersection of two boxes, or nullopt when it holds no element.
std::optional<Box> intersect(const Box& a, const Box& b);

struct Region {
  size_t src; // index of the source shard in the source layout
  size_t dst; // index of the target shard in the target layout
  Box box;    // in global coordinates
};

// Where a message lies in one local shard's row-major memory, when it is one contiguous run of it.
struct Run {
  size_t shard;  // shard index (source shard for sends, target shard for receives)
  int64_t start; // first element
  int64_t count; // number of elements
};

struct PeerTransfer {
  std::vector<Region> regions; // canonical order: (dst, src)
  int64_t elements = 0;
  // Set when the regions, in order, are one contiguous run of a single local shard: the message can
  // then be sent from (or received into) that shard's memory without a copy.
  std::optional<Run> run;
};

struct TransferPlan {
  std::vector<PeerTransfer> send; // indexed by peer rank
  std::vector<PeerTransfer> recv; // indexed by peer rank
  int64_t elements_sent_to_peers = 0;
  int64_t elements_received_from_peers = 0;
};

// The plan of group rank `me` in a group of `world` ranks. A box held by several source shards (replicas)
// is supplied to each target shard by one of them (NOTE [ Replicated source shards ]). Owners are
// group ranks; shards whose owner
// is outside [0, world) belong to nobody in the group and are skipped.
TransferPlan plan_transfer(const Layout& src, const Layout& dst, int64_t me, int64_t world);

// Where `region` lies in the row-major memory of a tensor shaped like `shard`: (first element,
// element count) when the region is one contiguous run of that memory, else nullopt.
std::optional<std::pair<int64_t, int64_t>> contiguous_run(const Box& region, const Box& shard);

} // namespace layout
} // namespace torch_shard
