// The checks of a lookup's input that need its values: ids in range, offsets well formed.
//
// NOTE [ Input checks on the device ]
// Whether a rank's ids and offsets are valid is a question about their values, which on a GPU live in
// device memory: asking the host costs a sync. So a lookup computes the answer on the input's device,
// as one int64 status (0, or the error code of the first check that failed, in the dense op's order),
// and the status travels with the agreement, in the one host read of the exchange (NOTE [ One host read
// per exchange ]). Only a rank whose status is not 0 reads its input on the host, to raise the dense
// op's exception with its message; the other ranks raise the same class carrying that message (NOTE
// [ Reasons travel ]). On the CPU the same checks are one loop over the ids and offsets (no ATen op);
// elsewhere, and on the CPU with cpu_loops() off, a composition of ATen ops.
//
// The checks, in order (each with the dense op's or upstream's exception and message):
//   every id in [0, num_embeddings)        ValueError  "Index out of range in Input <min> <max> <rows>"
//   include_last_offset: last offset = n   ValueError  (upstream's sharded op's message)
//   offsets[0] = 0                         RuntimeError
//   offsets[-1] <= n                       RuntimeError
//   offsets non-decreasing                 RuntimeError
// where n is the number of ids. What the host knows (types, shapes, devices, an empty offsets tensor
// with include_last_offset) the Python caller checks before the op.
#pragma once

#include <cstdint>
#include <optional>

#include <ATen/core/Tensor.h>

namespace torch_shard {
namespace ops {

struct LookupInput {
  at::Tensor ids;                    // 1-D int64: every id of this rank's input
  std::optional<at::Tensor> offsets; // bags: 1-D int64 as the caller gave them
  bool include_last_offset = false;  // offsets end with the number of ids (the last is no bag)
  int64_t num_embeddings = 0;
};

// 0-dim int64 on the ids' device: 0, or the comm::ErrorCode of the first failed check.
at::Tensor input_status(const LookupInput& input);

// This rank's input failed a check (its status was not 0): raises the first failed check's exception,
// reading the input on the host (only a failed op does).
[[noreturn]] void raise_input_error(const LookupInput& input);

// The offsets that start bags: without the last one under include_last_offset.
at::Tensor bag_offsets(const LookupInput& input);

} // namespace ops
} // namespace torch_shard
