// Moving a tensor's data from one shard layout to another over a c10d process group.
//
// One engine serves scatter (source layout: the whole tensor on one rank), gather (target layout: the
// whole tensor on one rank) and reshard (any layout to any layout): plan the box intersections, then
// one all-to-all of exactly the elements that change owner. See NOTE [ Redistribute buffers ].
#pragma once

#include <vector>

#include <ATen/core/Tensor.h>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>

#include "layout/box.h"

namespace torch_shard {
namespace comm {

// A layout: every shard's box and the GROUP rank that owns it.
struct ShardSet {
  std::vector<layout::Box> boxes;
  std::vector<int64_t> owners;
};

// The shards of a layout that this rank holds: tensors[k] is shard indices[k] of the layout.
struct LocalTensors {
  std::vector<at::Tensor> tensors;
  std::vector<int64_t> indices;
};

// Fills `dst_local` (allocated by the caller, one tensor per target shard this rank owns) with the
// data `src_local` holds under layout `src`. Collective over `pg`: every rank must call it with the
// same layouts. `device` carries the communication buffers (the shards' device; the current GPU for
// NCCL). Returns the number of elements this rank sent to other ranks.
int64_t redistribute(const ShardSet& src,
                     const LocalTensors& src_local,
                     const ShardSet& dst,
                     const LocalTensors& dst_local,
                     c10d::ProcessGroup& pg,
                     c10::Device device,
                     c10::ScalarType dtype,
                     const char* op);

}  // namespace comm
}  // namespace torch_shard
