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

CommStats& comm_stats() {
  static CommStats stats;
  return stats;
}

}  // namespace comm
}  // namespace torch_shard
