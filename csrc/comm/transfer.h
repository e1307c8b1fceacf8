// Moving a tensor's data from one layout to another: cached plans, and the per-peer messages a plan
// turns into for the exchange engine (comm/exchange.h).
//
// One engine serves scatter (source: the whole tensor on one rank), gather (target: the whole tensor
// on one rank) and reshard (any layout to any layout). Elements that change owner cross the network
// exactly once; elements that stay on a rank are copied shard to shard.
#pragma once

#include <memory>
#include <vector>

#include <ATen/core/Tensor.h>

#include "comm/exchange.h"
#include "layout/layout.h"
#include "layout/plan.h"

namespace torch_shard {
namespace comm {

// The shards of a layout that this rank holds: tensors[k] is shard indices[k] of the layout.
struct LocalTensors {
  std::vector<at::Tensor> tensors;
  std::vector<int64_t> indices;
};

// The plan of group rank `me` for moving data from `src` to `dst`, from a per-process cache keyed by
// the two layouts (fingerprint, then full comparison), `me` and `world`. See NOTE [ Plan cache ].
std::shared_ptr<const layout::TransferPlan> cached_plan(const std::shared_ptr<const layout::Layout>& src,
                                                        const std::shared_ptr<const layout::Layout>& dst,
                                                        int64_t me, int64_t world);

// Empties the plan cache (tests).
void clear_plan_cache();

// The messages that realise `plan`: send from `src_local`, receive into `dst_local` (allocated by the
// caller). Contiguous runs on the communication device are sent and received in place; everything
// else is packed/unpacked. `dtype` is the tensor's dtype (dst tensors may have another one: values are
// converted on unpack). All referenced objects must outlive the exchange.
Moves transfer_moves(const layout::TransferPlan& plan, const layout::Layout& src,
                     const LocalTensors& src_local, const layout::Layout& dst, const LocalTensors& dst_local,
                     int64_t me, c10::Device device, c10::ScalarType dtype);

// Uninitialised tensors for the shards of `layout` owned by group rank `me`, each on its placement's
// device (CPU shards in pinned memory when `pin_memory`), and their indices.
LocalTensors allocate_local(const layout::Layout& layout, int64_t me, c10::ScalarType dtype,
                            bool pin_memory = false);

} // namespace comm
} // namespace torch_shard
