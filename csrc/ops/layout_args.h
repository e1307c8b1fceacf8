// Layouts arrive in op schemas as one argument group, the same for every op that takes one:
//
//   int[] global_size, int? chunk_dim, Tensor? shard_offsets, Tensor? shard_sizes,
//   Tensor? placement_index, str[] placements, int[] placement_owners
//
// * chunk_dim given: ChunkShardingSpec's layout, the tensor split along chunk_dim into one chunk per
//   placement (offsets, sizes and index must be None);
// * otherwise shard_offsets / shard_sizes are (N, ndim) int64 CPU tensors, one row per shard, and
//   placement_index (N,) says which placement holds each shard (None: shard i on placements[i]).
// placements are the placement strings users wrote ("rank:1/cpu", "worker2/cuda:0"); placement_owners
// the group rank each one resolves to (-1: none). Boxes travel as tensors rather than int[] because
// converting N * ndim Python ints one by one costs more than validating the layout.
#pragma once

#include <algorithm>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>
#include <c10/core/ScalarType.h>
#include <c10/util/Exception.h>

#include "layout/box.h"
#include "layout/layout.h"
#include "layout/validate.h"
#include "ops/untraceable.h"

namespace torch_shard {

inline std::vector<layout::Box> boxes_from_tensors(const at::Tensor& offsets, const at::Tensor& sizes,
                                                   const char* op) {
  // The boxes are the tensors' values: fake and meta tensors have none (NOTE [ Ops that cannot be
  // traced ]).
  check_has_values(op, offsets);
  check_has_values(op, sizes);
  TORCH_CHECK_VALUE(offsets.dim() == 2 && sizes.dim() == 2, "torch_shard.", op,
                    ": expected (N, ndim) offset and size tensors, but got shapes ", offsets.sizes(), " and ",
                    sizes.sizes());
  TORCH_CHECK_VALUE(offsets.sizes() == sizes.sizes(), "torch_shard.", op,
                    ": shard_offsets and shard_sizes should have the same number of elements, found ",
                    offsets.sizes(), " and ", sizes.sizes(), " respectively");
  TORCH_CHECK_TYPE(offsets.scalar_type() == at::kLong && sizes.scalar_type() == at::kLong, "torch_shard.", op,
                   ": expected int64 offset and size tensors");
  TORCH_CHECK_VALUE(offsets.device().is_cpu() && sizes.device().is_cpu(), "torch_shard.", op,
                    ": expected CPU offset and size tensors");
  const at::Tensor off = offsets.contiguous();
  const at::Tensor len = sizes.contiguous();
  const int64_t n = off.size(0);
  const int64_t ndim = off.size(1);
  const int64_t* off_ptr = off.const_data_ptr<int64_t>();
  const int64_t* len_ptr = len.const_data_ptr<int64_t>();
  std::vector<layout::Box> boxes(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    boxes[i].offsets.assign(off_ptr + i * ndim, off_ptr + (i + 1) * ndim);
    boxes[i].sizes.assign(len_ptr + i * ndim, len_ptr + (i + 1) * ndim);
  }
  return boxes;
}

// What every rank must agree on about a tensor: its layout's fingerprint (boxes, owners and device
// types, NOTE [ What ranks agree on about a placement ]) and its dtype.
inline int64_t layout_and_dtype_fp(const layout::Layout& layout, c10::ScalarType dtype) {
  return layout::Fingerprint()
      .add(static_cast<int64_t>(layout.fingerprint()))
      .add(static_cast<int64_t>(dtype))
      .as_int64();
}

// `world` bounds the owners (pass -1 when the tensor has no group: owners are then global ranks).
inline std::shared_ptr<const layout::Layout>
layout_from_args(c10::IntArrayRef global_size, std::optional<int64_t> chunk_dim,
                 const std::optional<at::Tensor>& shard_offsets, const std::optional<at::Tensor>& shard_sizes,
                 const std::optional<at::Tensor>& placement_index, const std::vector<std::string>& placements,
                 c10::IntArrayRef placement_owners, int64_t world, bool validate, const char* op) {
  TORCH_CHECK_VALUE(placements.size() == placement_owners.size(), "torch_shard.", op, ": ", placements.size(),
                    " placements but ", placement_owners.size(), " owners");
  std::vector<layout::Placement> table;
  table.reserve(placements.size());
  for (size_t i = 0; i < placements.size(); ++i) {
    const int64_t owner = placement_owners[i];
    TORCH_CHECK_INDEX(owner >= -1 && (world < 0 || owner < world), "torch_shard.", op, ": placement '",
                      placements[i], "' resolves to rank ", owner,
                      ", which is not a rank of a group of size ", world);
    table.push_back(layout::Placement{placements[i], owner, layout::placement_device(placements[i])});
  }
  const auto size = global_size.vec();
  if (chunk_dim.has_value()) {
    TORCH_CHECK_VALUE(!shard_offsets.has_value() && !shard_sizes.has_value() && !placement_index.has_value(),
                      "torch_shard.", op, ": a chunk layout (chunk_dim) takes no shard boxes");
    return layout::Layout::chunked(size, *chunk_dim, std::move(table));
  }
  TORCH_CHECK_VALUE(shard_offsets.has_value() && shard_sizes.has_value(), "torch_shard.", op,
                    ": give chunk_dim, or shard_offsets and shard_sizes");
  auto boxes = boxes_from_tensors(*shard_offsets, *shard_sizes, op);
  std::vector<int64_t> placement_of;
  if (placement_index.has_value()) {
    const at::Tensor& idx = *placement_index;
    check_has_values(op, idx);
    TORCH_CHECK_VALUE(idx.dim() == 1 && idx.numel() == static_cast<int64_t>(boxes.size()) &&
                          idx.scalar_type() == at::kLong && idx.device().is_cpu(),
                      "torch_shard.", op,
                      ": placement_index must be a 1-D int64 CPU tensor with one "
                      "entry per shard (",
                      boxes.size(), "), but got ", idx.sizes(), " ", idx.scalar_type());
    const at::Tensor c = idx.contiguous();
    const int64_t* p = c.const_data_ptr<int64_t>();
    placement_of.assign(p, p + c.numel());
  } else {
    TORCH_CHECK_VALUE(boxes.size() == table.size(), "torch_shard.", op, ": ", boxes.size(), " shards but ",
                      table.size(), " placements (give placement_index)");
    placement_of.resize(boxes.size());
    for (size_t i = 0; i < boxes.size(); ++i) {
      placement_of[i] = static_cast<int64_t>(i);
    }
  }
  return layout::Layout::make(size, std::move(boxes), std::move(placement_of), std::move(table), validate);
}

// A layout of `offsets` / `sizes` boxes held by group ranks `owners` in which a box may be held by
// several ranks (replicas: DTensor's Replicate mesh dims; NOTE [ Redistributing replicated layouts ]).
// Checked as a ShardedTensor layout is, but for replicas: every box in bounds, any two boxes identical
// or disjoint, the distinct non-empty boxes tiling the tensor. Placements are "rank:<r>/<device type>".
inline std::shared_ptr<const layout::Layout>
replicated_layout(c10::IntArrayRef global_size, const at::Tensor& offsets, const at::Tensor& sizes,
                  c10::IntArrayRef owners, int64_t world, c10::DeviceType device_type, const char* op,
                  const char* which) {
  auto boxes = boxes_from_tensors(offsets, sizes, op);
  TORCH_CHECK_VALUE(owners.size() == boxes.size(), "torch_shard.", op, ": ", boxes.size(), " ", which,
                    " boxes but ", owners.size(), " owners");
  TORCH_CHECK_VALUE(world > 0, "torch_shard.", op, ": a group of size ", world);
  std::vector<layout::Placement> table;
  table.reserve(static_cast<size_t>(world));
  for (int64_t r = 0; r < world; ++r) {
    table.push_back(
        layout::Placement{"rank:" + std::to_string(r) + "/" + c10::DeviceTypeName(device_type, true), r,
                          c10::Device(device_type)});
  }
  std::vector<int64_t> placement_of(owners.begin(), owners.end());
  for (size_t i = 0; i < placement_of.size(); ++i) {
    TORCH_CHECK_INDEX(placement_of[i] >= 0 && placement_of[i] < world, "torch_shard.", op, ": ", which,
                      " box ", i, " is held by rank ", placement_of[i],
                      ", which is not a rank of a group of size ", world);
  }
  auto out = layout::Layout::make(global_size.vec(), boxes, std::move(placement_of), std::move(table),
                                  /*validate=*/false);
  std::vector<layout::Box> distinct;
  for (const auto& box : boxes) {
    if (!box.empty()) {
      distinct.push_back(box);
    }
  }
  std::sort(distinct.begin(), distinct.end(), [](const layout::Box& a, const layout::Box& b) {
    return a.offsets != b.offsets ? a.offsets < b.offsets : a.sizes < b.sizes;
  });
  distinct.erase(std::unique(distinct.begin(), distinct.end()), distinct.end());
  layout::validate_shards(distinct, global_size.vec());
  return out;
}

} // namespace torch_shard
