// Validation of a shard list: consistent ranks, no overlap, inside bounds, full coverage.
//
// See NOTE [ Tiling proof by corner cancellation ] in validate.cpp for why a valid layout costs
// O(N * 2^d) and an invalid one O(N log N) for tensors of up to 2 dims.
#pragma once

#include <optional>
#include <utility>

#include "layout/box.h"

namespace torch_shard {
namespace layout {

// True iff the non-empty boxes cover `whole` exactly once: no overlap, no gap, nothing outside.
// Returns std::nullopt when the test is not attempted (more than kMaxCornerDims dims).
std::optional<bool> tiles_exactly(const std::vector<Box>& boxes, const Box& whole);

// Indices (i < j) of two non-empty boxes that share at least one element, or nullopt. Empty boxes
// never overlap anything. All boxes must have the same number of dims.
std::optional<std::pair<size_t, size_t>> find_overlap(const std::vector<Box>& boxes);

// Throws ValueError with upstream's messages, checking in upstream's order: shards with different
// numbers of dims, shard dims vs tensor dims, overlapping shards, then (when `global_size` is given)
// shards outside the tensor and uncovered elements. Without `global_size` only the first and third
// checks apply (EnumerableShardingSpec's own validation).
void validate_shards(const std::vector<Box>& boxes, const std::optional<Dims>& global_size);

} // namespace layout
} // namespace torch_shard
