#include "comm/process_group.h"

#include <algorithm>

#include <ATen/ops/empty.h>
#include <c10/core/impl/VirtualGuardImpl.h>
#include <c10/util/Exception.h>
#include <torch/csrc/distributed/c10d/GroupRegistry.hpp>
#include <torch/version.h>

namespace torch_shard {
namespace comm {

namespace {

// Tag of torch_shard's point-to-point messages, so they never match a user's own tagged send/recv on
// the same group ("ts" in ASCII).
constexpr int kTag = 0x7473;

} // namespace

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

// NOTE [ Communication device ]
// Every rank must put the buffers of one collective on the same KIND of device, or the group would
// route the call to different backends on different ranks (a "cpu:gloo,cuda:nccl" group sends CPU
// tensors to gloo and CUDA tensors to NCCL) and hang. So the device TYPE is a property of the GROUP,
// the same on every rank, never of the shards (which may sit on different devices on different ranks):
//   * the group has a CUDA backend other than gloo (NCCL, alone or beside gloo): CUDA. Shards that
//     live elsewhere (CPU placements) are staged through it: packed into CUDA buffers on the way out,
//     unpacked from them on the way in. NCCL moves only CUDA memory.
//   * otherwise (gloo, or a group whose backend is written in Python and registers none): the CPU.
//     CUDA shards on a gloo group are staged through host memory, which is what gloo's own CUDA paths
//     do; it also lets torch_shard use point-to-point messages, which gloo supports for CPU tensors
//     only.
// WHICH CUDA device is this rank's own business (each rank numbers the GPUs of its host), chosen as
// DTensor users expect, first match wins:
//   1. the device the group is bound to (init_process_group(device_id=...)): ProcessGroupNCCL refuses
//      tensors on any other device ("Tensor found on device cuda:1 but backend constrained to cuda:0"),
//      so a rank whose shards sit elsewhere stages them through the bound device. Preferring the
//      shards' device here made that rank raise inside round 1 while its peers waited in it until the
//      NCCL timeout.
//   2. the device of the tensors the op moves, when they are on CUDA (the shards, a scatter's source,
//      the inputs of a sharded lookup): NCCL then reads and writes them in place;
//   3. the current CUDA device (torch.cuda.set_device).
// A program that neither binds its group nor sets a device, and keeps its shards on the CPU, stages
// every rank through cuda:0; with several ranks per host NCCL then fails (duplicate GPU) as it does for
// any collective such a program runs: bind the group, or call torch.cuda.set_device(local_rank).
// The choice is made here only; Python never picks a device for communication.

bool has_backend_for(const c10d::ProcessGroup& pg, c10::DeviceType type) {
  const auto types = pg.getDeviceTypes();
  return std::any_of(types.begin(), types.end(), [type](const c10::Device& d) { return d.type() == type; });
}

c10::Device comm_device(c10d::ProcessGroup& pg, std::optional<c10::Device> tensors) {
  // A gloo group registers gloo for CUDA tensors too; only a CUDA backend of its own (NCCL) counts.
  if (has_backend_for(pg, c10::DeviceType::CUDA) &&
      pg.getBackend(c10::DeviceType::CUDA)->getBackendName() != "gloo") {
    if (const auto bound = pg.getBoundDeviceId();
        bound.has_value() && bound->is_cuda() && bound->has_index()) {
      return *bound;
    }
    if (tensors.has_value() && tensors->is_cuda() && tensors->has_index()) {
      return *tensors;
    }
    c10::impl::VirtualGuardImpl cuda(c10::DeviceType::CUDA);
    return cuda.getDevice();
  }
  TORCH_CHECK(has_backend_for(pg, c10::DeviceType::CPU) || !pg.hasBackends(), "torch_shard: process group '",
              pg.getGroupName(), "' has neither a CPU nor a CUDA backend; torch_shard needs gloo or NCCL");
  return c10::Device(c10::kCPU);
}

std::string comm_device_name(const std::string& group_name, const std::string& tensors) {
  const auto pg = resolve_group(group_name, "comm_device");
  return comm_device(*pg, tensors.empty() ? std::nullopt : std::optional<c10::Device>(c10::Device(tensors)))
      .str();
}

CommStats& comm_stats() {
  static CommStats stats;
  return stats;
}

void all_to_all_bytes(c10d::ProcessGroup& pg, at::Tensor& recv, at::Tensor& send,
                      std::vector<int64_t>& recv_splits, std::vector<int64_t>& send_splits) {
  // torch 2.13 renamed alltoall_base to all_to_all_single; a process group written in Python (torch's
  // threaded test group) overrides the new name, which the old one does not reach.
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 13)
  pg.all_to_all_single(recv, send, recv_splits, send_splits)->wait();
#else
  pg.alltoall_base(recv, send, recv_splits, send_splits)->wait();
#endif
  comm_stats().collectives += 1;
}

c10::intrusive_ptr<c10d::Work> send_bytes(c10d::ProcessGroup& pg, const at::Tensor& bytes, int64_t peer) {
  std::vector<at::Tensor> tensors{bytes};
  return pg.send(tensors, static_cast<int>(peer), kTag);
}

c10::intrusive_ptr<c10d::Work> recv_bytes(c10d::ProcessGroup& pg, const at::Tensor& bytes, int64_t peer) {
  std::vector<at::Tensor> tensors{bytes};
  return pg.recv(tensors, static_cast<int>(peer), kTag);
}

// NOTE [ Pack workspace ]
// Send and receive staging buffers live only for the duration of one call. On CPU, a fresh
// multi-megabyte buffer costs one page fault per 4 KiB page on first touch (each dearer than copying
// the page), and glibc hands big blocks back to the OS on free.
// So CPU staging buffers come from per-thread, grow-only workspaces, kept up to kMaxCachedBytes.
// CUDA buffers go through the caching allocator, which already reuses memory. Data ops run to
// completion before returning, so a workspace is never in use twice at once.
constexpr int64_t kMaxCachedBytes = int64_t{256} << 20;
constexpr int kWorkspaceSlots = 5; // 0-2: the exchange's rounds; 3-4: the hub of round 1

at::Tensor workspace(int64_t bytes, c10::Device device, int slot) {
  TORCH_INTERNAL_ASSERT(slot >= 0 && slot < kWorkspaceSlots);
  const auto opts = at::TensorOptions().dtype(at::kByte).device(device);
  if (!device.is_cpu() || bytes > kMaxCachedBytes) {
    return at::empty({bytes}, opts);
  }
  thread_local at::Tensor cached[kWorkspaceSlots];
  at::Tensor& buffer = cached[slot];
  if (!buffer.defined() || buffer.numel() < bytes) {
    buffer = at::empty({bytes}, opts);
  }
  return buffer.narrow(0, 0, bytes);
}

} // namespace comm
} // namespace torch_shard
