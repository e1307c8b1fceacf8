// Reaching c10d process groups from C++: by name (as _c10d_functional does), the device collectives
// run on, counters, and the raw byte-moving primitives the exchange engine is built from.
#pragma once

#include <atomic>
#include <optional>
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

// Whether `pg` has a backend registered for `type` (ProcessGroup::hasBackendForDeviceType, which torch
// 2.11 lacks; getDeviceTypes lists the same registrations on every supported release).
bool has_backend_for(const c10d::ProcessGroup& pg, c10::DeviceType type);

// The device every buffer of a collective on `pg` lives on; `tensors` is where the tensors the op
// moves live on this rank, if anywhere. See NOTE [ Communication device ].
c10::Device comm_device(c10d::ProcessGroup& pg, std::optional<c10::Device> tensors = std::nullopt);

// comm_device of the group registered under `group_name`, for the product's seams (csrc/seams.h):
// `tensors` is a device string, "" for none.
std::string comm_device_name(const std::string& group_name, const std::string& tensors);

// Counters of what torch_shard's collectives did, for tests and benchmarks. "Peers" excludes a rank's
// own part (copied locally). Bytes count payload only (not the fixed agreement header and slots).
struct CommStats {
  std::atomic<int64_t> bytes_sent_to_peers{0};
  std::atomic<int64_t> bytes_received_from_peers{0};
  std::atomic<int64_t> collectives{0}; // communication rounds issued (agreement, data)
  std::atomic<int64_t> plan_cache_hits{0};
  std::atomic<int64_t> plan_cache_misses{0};
  std::atomic<int64_t> single_round_ops{0}; // data ops whose payload rode in the agreement round
  // Round-1 header tables the host read from the communication device's memory (on a GPU, each is a
  // host sync): NOTE [ One host read per exchange ], NOTE [ Headers on the host ].
  std::atomic<int64_t> header_reads{0};
};

CommStats& comm_stats();

// One all-to-all of byte tensors with per-peer byte counts (the backends' alltoall_base).
void all_to_all_bytes(c10d::ProcessGroup& pg, at::Tensor& recv, at::Tensor& send,
                      std::vector<int64_t>& recv_splits, std::vector<int64_t>& send_splits);

// Point-to-point messages (1-D uint8 tensors, contiguous) with torch_shard's tag.
c10::intrusive_ptr<c10d::Work> send_bytes(c10d::ProcessGroup& pg, const at::Tensor& bytes, int64_t peer);
c10::intrusive_ptr<c10d::Work> recv_bytes(c10d::ProcessGroup& pg, const at::Tensor& bytes, int64_t peer);

// A reusable uint8 buffer of at least `bytes` on `device` (`slot` picks one of a few independent
// buffers per thread). See NOTE [ Pack workspace ].
at::Tensor workspace(int64_t bytes, c10::Device device, int slot);

} // namespace comm
} // namespace torch_shard
