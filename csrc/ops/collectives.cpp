// The lookups' collectives and the one-round ops: see ops/collectives.h.

#include "ops/collectives.h"

#include <string>
#include <vector>

#include <ATen/ops/empty.h>
#include <c10/util/Exception.h>

#include "comm/exchange.h"
#include "comm/process_group.h"
#include "layout/box.h"
#include "ops/agreement.h"
#include "ops/untraceable.h"

namespace torch_shard {
namespace ops {

at::Tensor all_to_all_counts(c10d::ProcessGroup& pg, const at::Tensor& input, c10::IntArrayRef send_counts,
                             c10::IntArrayRef recv_counts) {
  const int64_t world = pg.getSize();
  const int64_t me = pg.getRank();
  TORCH_INTERNAL_ASSERT(static_cast<int64_t>(send_counts.size()) == world &&
                        static_cast<int64_t>(recv_counts.size()) == world);
  int64_t send_total = 0, recv_total = 0;
  for (int64_t p = 0; p < world; ++p) {
    TORCH_INTERNAL_ASSERT(send_counts[p] >= 0 && recv_counts[p] >= 0);
    send_total = layout::checked_add(send_total, send_counts[p], "torch_shard: elements to send");
    recv_total = layout::checked_add(recv_total, recv_counts[p], "torch_shard: elements to receive");
  }
  TORCH_INTERNAL_ASSERT(input.dim() == 1 && input.numel() == send_total);
  // Staged through the communication device (NOTE [ Communication device ]): CPU tensors on an NCCL
  // group go to the GPU and back.
  const c10::Device device = comm::comm_device(pg, input.device());
  at::Tensor send = input.contiguous().to(device);
  at::Tensor recv = at::empty({recv_total}, send.options());
  const auto itemsize = static_cast<int64_t>(send.element_size());
  std::vector<int64_t> send_bytes(world), recv_bytes(world);
  for (int64_t p = 0; p < world; ++p) {
    send_bytes[p] = layout::checked_mul(send_counts[p], itemsize, "torch_shard: bytes to send");
    recv_bytes[p] = layout::checked_mul(recv_counts[p], itemsize, "torch_shard: bytes to receive");
  }
  at::Tensor send_view = send.view(at::kByte);
  at::Tensor recv_view = recv.view(at::kByte);
  comm::all_to_all_bytes(pg, recv_view, send_view, recv_bytes, send_bytes);
  auto& stats = comm::comm_stats();
  stats.bytes_sent_to_peers += (send_total - send_counts[me]) * itemsize;
  stats.bytes_received_from_peers += (recv_total - recv_counts[me]) * itemsize;
  return recv.to(input.device());
}

at::Tensor move_rows(c10d::ProcessGroup& pg, const at::Tensor& values, c10::IntArrayRef send_rows,
                     c10::IntArrayRef recv_rows) {
  if (send_rows.size() == 1) {
    TORCH_INTERNAL_ASSERT(send_rows[0] == recv_rows[0] &&
                          send_rows[0] == (values.dim() ? values.size(0) : 1));
    return values;
  }
  const int64_t width = values.dim() > 1 ? values.size(1) : 1;
  std::vector<int64_t> send(send_rows.size()), recv(recv_rows.size());
  for (size_t r = 0; r < send.size(); ++r) {
    send[r] = layout::checked_mul(send_rows[r], width, "torch_shard: elements to send");
    recv[r] = layout::checked_mul(recv_rows[r], width, "torch_shard: elements to receive");
  }
  const at::Tensor moved = all_to_all_counts(pg, values.reshape({-1}), send, recv);
  return values.dim() > 1 ? moved.view({-1, width}) : moved;
}

at::Tensor all_reduce(c10d::ProcessGroup& pg, const at::Tensor& input, c10d::ReduceOp::RedOpType op) {
  if (pg.getSize() == 1) {
    return input;
  }
  const c10::Device device = comm::comm_device(pg, input.device());
  at::Tensor buffer = input.contiguous().to(device, /*non_blocking=*/false, /*copy=*/true);
  std::vector<at::Tensor> tensors{buffer};
  c10d::AllreduceOptions options;
  options.reduceOp = c10d::ReduceOp(op);
  pg.allreduce(tensors, options)->wait();
  comm::comm_stats().collectives += 1;
  return buffer.to(input.device());
}

// Every rank's `value`, in rank order (one agreement round, op kind "compare"; a rank that failed
// locally takes part through _abort("compare", ...)).
std::vector<int64_t> gather_values(int64_t value, c10::string_view group_name) {
  check_not_tracing("_gather_values", kCommunicates);
  auto pg = comm::resolve_group(std::string(group_name), "_gather_values");
  comm::Moves moves;
  moves.send.resize(pg->getSize());
  moves.recv.resize(pg->getSize());
  std::vector<int64_t> out;
  comm::exchange(*pg, comm::comm_device(*pg),
                 agreement(comm::OpKind::kCompare, comm::Values{value, 0, 0, 0}, nullptr,
                           [&out](const std::vector<comm::Values>& values, int64_t) {
                             out.clear();
                             for (const auto& v : values) {
                               out.push_back(v[0]);
                             }
                           }),
                 &moves);
  return out;
}

// True on every rank iff `value` is true on every rank (one agreement round).
bool all_ranks_true(bool value, c10::string_view group_name) {
  check_not_tracing("_all_ranks_true", kCommunicates);
  auto pg = comm::resolve_group(std::string(group_name), "_all_ranks_true");
  comm::Moves moves;
  moves.send.resize(pg->getSize());
  moves.recv.resize(pg->getSize());
  bool all = true;
  comm::exchange(*pg, comm::comm_device(*pg),
                 agreement(comm::OpKind::kCompare, comm::Values{value ? 1 : 0, 0, 0, 0}, nullptr,
                           [&all](const std::vector<comm::Values>& values, int64_t) {
                             all = true;
                             for (const auto& v : values) {
                               all = all && v[0] != 0;
                             }
                           }),
                 &moves);
  return all;
}

std::vector<int64_t> get_comm_stats(bool reset) {
  auto& s = comm::comm_stats();
  std::vector<int64_t> out{s.bytes_sent_to_peers.load(), s.bytes_received_from_peers.load(),
                           s.collectives.load(),         s.plan_cache_hits.load(),
                           s.plan_cache_misses.load(),   s.single_round_ops.load(),
                           s.header_reads.load()};
  if (reset) {
    s.bytes_sent_to_peers = 0;
    s.bytes_received_from_peers = 0;
    s.collectives = 0;
    s.plan_cache_hits = 0;
    s.plan_cache_misses = 0;
    s.single_round_ops = 0;
    s.header_reads = 0;
  }
  return out;
}

} // namespace ops
} // namespace torch_shard
