// Reaching c10d process groups from C++: by name, as _c10d_functional does.
#pragma once

#include <string>
#include <vector>

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>
#include <c10/util/intrusive_ptr.h>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>

namespace torch_shard {
namespace comm {

// The group Python registered under `group_name` (torch.distributed registers every group it creates;
// pass `pg.group_name`). ValueError naming `op` when there is none.
c10::intrusive_ptr<c10d::ProcessGroup> resolve_group(const std::string& group_name, const char* op);

// Every rank contributes `mine` (same length on all ranks); returns all ranks' values, rank-major.
// One all-gather of a few int64s on `device` (a CUDA device for NCCL-only groups).
std::vector<int64_t> exchange_header(c10d::ProcessGroup& pg,
                                     const std::vector<int64_t>& mine,
                                     c10::Device device);

// One all-to-all of flat 1-D buffers: send_counts[p] elements of `input` go to rank p (in rank order),
// recv_counts[p] elements arrive from rank p. Any dtype (moved as bytes); returns the received buffer.
at::Tensor all_to_all_flat(c10d::ProcessGroup& pg,
                           const at::Tensor& input,
                           const std::vector<int64_t>& send_counts,
                           const std::vector<int64_t>& recv_counts);

// Counters of what torch_shard's data ops put on the wire, for tests and benchmarks. "Peers" excludes
// a rank's own slot in a collective (that part is a local copy).
struct CommStats {
  int64_t bytes_sent_to_peers = 0;
  int64_t bytes_received_from_peers = 0;
  int64_t collectives = 0;
};

CommStats& comm_stats();

}  // namespace comm
}  // namespace torch_shard
