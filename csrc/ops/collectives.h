// The collectives the sharded lookups move their data with, after their agreement: an all-to-all with
// per-peer counts and an all-reduce. Unchecked C++ helpers, not ops: every size they take must come
// from data every rank agreed on (the agreement's words and shapes), so a rank can never call them with
// sizes its peers do not expect. Also the ops that are one agreement round and nothing else
// (_all_ranks_true, _gather_values) and the counters (_comm_stats).
//
// NOTE [ Why not torch's functional collectives ]
// torch.distributed._functional_collectives has an all-to-all with autograd
// (all_to_all_single_autograd) and an all-reduce, and they can be traced. They do not serve here:
//   * they run the collective on whatever device the input is on. A group with a backend per device
//     type ("cpu:gloo,cuda:nccl") then sends CPU inputs to gloo and CUDA inputs to NCCL, and ranks whose
//     shards sit on different devices (allowed: placements are per shard) would call different
//     backends and hang; an NCCL-only group cannot take CPU inputs at all. These stage through the
//     group's communication device (NOTE [ Communication device ]), the same on every rank, as every
//     other torch_shard data op does;
//   * they would not count in comm_stats (bytes to and from peers, rounds), from which
//     bench/bench_embedding.py reports the bytes each rank sends, as for the other data ops;
//   * tracing and autograd are what they would add, and the sharded lookups that use these cannot be
//     traced anyway (a ShardedTensor is no tensor dynamo can trace: docs/howto/compile.md), and carry
//     their own backward ops.
#pragma once

#include <cstdint>
#include <vector>

#include <ATen/core/Tensor.h>
#include <c10/util/ArrayRef.h>
#include <c10/util/string_view.h>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>

namespace torch_shard {
namespace ops {

// All-to-all of a flat tensor: rank p receives send_counts[p] elements from this rank, and
// recv_counts[p] must be what p sends here. Returns the received elements on `input`'s device.
at::Tensor all_to_all_counts(c10d::ProcessGroup& pg, const at::Tensor& input, c10::IntArrayRef send_counts,
                             c10::IntArrayRef recv_counts);

// An all-to-all of whole rows of a 2-D (or 1-D) tensor: send_rows[r] rows to rank r, in rank order;
// returns the rows received, by rank. One rank: the tensor itself (nothing to move, nothing copied).
at::Tensor move_rows(c10d::ProcessGroup& pg, const at::Tensor& values, c10::IntArrayRef send_rows,
                     c10::IntArrayRef recv_rows);

// The elementwise reduction (SUM, MAX or MIN) of `input` over the group's ranks, on `input`'s device.
// Every rank passes the same shape and dtype.
at::Tensor all_reduce(c10d::ProcessGroup& pg, const at::Tensor& input, c10d::ReduceOp::RedOpType op);

// The kernels of the ops _gather_values, _all_ranks_true and _comm_stats (schemas and comments in
// csrc/torch_shard.cpp).
std::vector<int64_t> gather_values(int64_t value, c10::string_view group_name);
bool all_ranks_true(bool value, c10::string_view group_name);
std::vector<int64_t> get_comm_stats(bool reset);

} // namespace ops
} // namespace torch_shard
