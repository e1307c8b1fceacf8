// Layout: one complete description of how a tensor is sharded, built and checked once.
//
// A layout is the global size, one box per shard, and where each shard is placed. Placements are
// kept as the strings users wrote ("rank:1/cuda:1", "worker1/cpu"), deduplicated, each with the
// GROUP rank that owns it (-1: no member of the group) and the device its shards live on. A layout is
// immutable once built: ShardedTensorImpl, the plan cache and the data ops share it through
// shared_ptr<const Layout>, and its fingerprint is computed exactly once, at construction.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <c10/core/Device.h>

#include "layout/box.h"

namespace torch_shard {
namespace layout {

struct Placement {
  std::string name;   // as written by the user; "" for a shard without placement
  int64_t owner = -1; // group rank that holds the shards placed here; -1 for none
  c10::Device device = c10::Device(c10::kCPU);
};

class Layout {
public:
  // A validated layout: the boxes tile `global_size` exactly (no overlap, nothing outside, no gap).
  // `placement_of[i]` indexes `placements` for shard i. Throws ValueError / IndexError on bad input.
  static std::shared_ptr<const Layout> make(Dims global_size, std::vector<Box> boxes,
                                            std::vector<int64_t> placement_of,
                                            std::vector<Placement> placements, bool validate = true);

  // ChunkShardingSpec's layout: `global_size` split along `dim` (may be negative) into one chunk per
  // placement, chunk i on placements[i]. Valid by construction.
  static std::shared_ptr<const Layout> chunked(Dims global_size, int64_t dim,
                                               std::vector<Placement> placements);

  // The whole tensor as one shard owned by group rank `owner` (the source of a scatter and the
  // target of a gather).
  static std::shared_ptr<const Layout> whole(Dims global_size, int64_t owner, c10::Device device);

  // The same layout with its shards reordered stably by owner (upstream keeps resharded metadata in
  // rank order; shards without an owner go last).
  std::shared_ptr<const Layout> sorted_by_owner() const;

  const Dims& global_size() const { return global_size_; }
  int64_t numel() const { return numel_; }
  size_t num_shards() const { return boxes_.size(); }
  const std::vector<Box>& boxes() const { return boxes_; }
  const Box& box(size_t shard) const { return boxes_[shard]; }
  const std::vector<int64_t>& placement_of() const { return placement_of_; }
  const std::vector<Placement>& placements() const { return placements_; }
  const Placement& placement(size_t shard) const { return placements_[placement_of_[shard]]; }
  int64_t owner(size_t shard) const { return placement(shard).owner; }
  // Owner of every shard, indexed like boxes().
  std::vector<int64_t> owners() const;
  // The shards owned by group rank `rank`, in layout order.
  std::vector<int64_t> shards_of(int64_t rank) const;
  // Set when the layout was built by chunked(): the (normalised) chunk dim.
  std::optional<int64_t> chunk_dim() const { return chunk_dim_; }
  // What every rank must agree on: see NOTE [ What ranks agree on about a placement ].
  uint64_t fingerprint() const { return fingerprint_; }
  // Unique per Layout object in this process (shared by the impls that share the object): Python
  // knows from it whether the spec it keeps still describes the tensor's layout.
  int64_t serial() const { return serial_; }

  // Same global size, boxes, owners and device types (what fingerprint() digests; pointer equality
  // first). Placement names and device indices may differ.
  bool same_as(const Layout& other) const;

private:
  Layout() = default;
  void finish(bool validate);

  Dims global_size_;
  int64_t numel_ = 0;
  std::vector<Box> boxes_;
  std::vector<int64_t> placement_of_;
  std::vector<Placement> placements_;
  std::optional<int64_t> chunk_dim_;
  uint64_t fingerprint_ = 0;
  int64_t serial_ = 0;
};

// NOTE [ What ranks agree on about a placement ]
// A placement names an owner and a device. The owner is everyone's business: it decides who sends
// what to whom. The device is its owner's business: a rank knows where its own shards live, and of
// another rank's shards only which KIND of device they are on (a CUDA shard and a CPU shard are
// staged differently). The index of another rank's device is not even knowable in general: each rank
// numbers the GPUs of its own host, `.cuda()` upstream writes this rank's current device into every
// placement, and "cpu", "cpu:0" and "rank:0/cuda" vs "rank:0/cuda:0" are different spellings of the
// same thing. So layouts are compared, across ranks (the fingerprint) and in this process (same_as,
// the plan cache), by boxes, owners and device TYPES; names and indices never make two ranks disagree.
// A rank's own shards must be on their placement's device (on_placement_device), checked locally.

// True when a tensor on `device` satisfies a placement on `placement` (same type; the same index
// unless the placement gives none; CPU indices are ignored).
bool on_placement_device(c10::Device device, c10::Device placement);

// The device part of a placement string: "rank:1/cuda:1" -> cuda:1, "worker0/cpu" -> cpu, "" -> cpu.
c10::Device placement_device(const std::string& name);

// A 64-bit digest for agreement between ranks: equal inputs give equal digests on every process
// (unlike std::hash); mixing per value makes accidental equality of different inputs negligible.
class Fingerprint {
public:
  Fingerprint& add(int64_t value);
  Fingerprint& add(const Dims& values);
  Fingerprint& add(const std::string& value);
  uint64_t value() const { return state_; }
  int64_t as_int64() const { return static_cast<int64_t>(state_); }

private:
  uint64_t state_ = 0x6a09e667f3bcc909ull;
};

} // namespace layout
} // namespace torch_shard
