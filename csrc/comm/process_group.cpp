#include "comm/process_group.h"

#include <ATen/ops/empty.h>
#include <ATen/ops/tensor.h>
#include <c10/util/Exception.h>
#include <torch/csrc/distributed/c10d/GroupRegistry.hpp>

namespace torch_shard {
namespace comm {

c10::intrusive_ptr<c10d::ProcessGroup> resolve_group(const std::string& group_name, const char* op) {
  TORCH_CHECK_VALUE(!group_name.empty(), "torch_shard.", op,
                    ": this ShardedTensor has no process group (it was built without one), so it "
                    "cannot communicate");
  try {
    return c10d::resolve_process_group(group_name);
  } catch (const c10::Error& e) {
    TORCH_CHECK_VALUE(false, "torch_shard.", op, ": no process group is registered under the name '",
                      group_name, "' (was it destroyed?): ", e.what_without_backtrace());
  }
}

std::vector<int64_t> exchange_header(c10d::ProcessGroup& pg,
                                     const std::vector<int64_t>& mine,
                                     c10::Device device) {
  const auto n = static_cast<int64_t>(mine.size());
  const auto opts = at::TensorOptions().dtype(at::kLong);
  at::Tensor input = at::tensor(mine, opts).to(device);
  at::Tensor output = at::empty({n * pg.getSize()}, opts.device(device));
  // _allgather_base exists in every supported torch (2.11-2.14); 2.13 deprecates it.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
  pg._allgather_base(output, input)->wait();
#pragma GCC diagnostic pop
  comm_stats().collectives += 1;
  at::Tensor host = output.cpu();
  const int64_t* data = host.const_data_ptr<int64_t>();
  return std::vector<int64_t>(data, data + host.numel());
}

at::Tensor all_to_all_flat(c10d::ProcessGroup& pg,
                           const at::Tensor& input,
                           const std::vector<int64_t>& send_counts,
                           const std::vector<int64_t>& recv_counts) {
  const int64_t world = pg.getSize();
  const int64_t me = pg.getRank();
  TORCH_CHECK_VALUE(static_cast<int64_t>(send_counts.size()) == world &&
                        static_cast<int64_t>(recv_counts.size()) == world,
                    "torch_shard._all_to_all: expected ", world, " send and receive counts, got ",
                    send_counts.size(), " and ", recv_counts.size());
  int64_t send_total = 0, recv_total = 0;
  for (int64_t p = 0; p < world; ++p) {
    TORCH_CHECK_VALUE(send_counts[p] >= 0 && recv_counts[p] >= 0,
                      "torch_shard._all_to_all: negative count");
    send_total += send_counts[p];
    recv_total += recv_counts[p];
  }
  TORCH_CHECK_VALUE(input.dim() == 1 && input.numel() == send_total, "torch_shard._all_to_all: input has ",
                    input.numel(), " elements in ", input.dim(), " dims; expected a 1-D tensor of ",
                    send_total);
  at::Tensor send = input.contiguous();
  at::Tensor recv = at::empty({recv_total}, send.options());
  const int64_t itemsize = static_cast<int64_t>(send.element_size());
  std::vector<int64_t> send_bytes(world), recv_bytes(world);
  for (int64_t p = 0; p < world; ++p) {
    send_bytes[p] = send_counts[p] * itemsize;
    recv_bytes[p] = recv_counts[p] * itemsize;
  }
  at::Tensor send_view = send.view(at::kByte);
  at::Tensor recv_view = recv.view(at::kByte);
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
  pg.alltoall_base(recv_view, send_view, recv_bytes, send_bytes)->wait();
#pragma GCC diagnostic pop
  auto& stats = comm_stats();
  stats.collectives += 1;
  stats.bytes_sent_to_peers += (send_total - send_counts[me]) * itemsize;
  stats.bytes_received_from_peers += (recv_total - recv_counts[me]) * itemsize;
  return recv;
}

CommStats& comm_stats() {
  static CommStats stats;
  return stats;
}

}  // namespace comm
}  // namespace torch_shard
