#include "comm/redistribute.h"

#include <unordered_map>

#include <ATen/ops/empty.h>
#include <c10/util/Exception.h>

#include "comm/process_group.h"
#include "layout/plan.h"

namespace torch_shard {
namespace comm {

namespace {

using layout::Box;
using layout::PeerTransfer;
using layout::Region;

at::Tensor region_view(const at::Tensor& tensor, const Box& shard, const Box& region) {
  at::Tensor view = tensor;
  for (size_t d = 0; d < shard.ndim(); ++d) {
    view = view.narrow(static_cast<int64_t>(d), region.offsets[d] - shard.offsets[d], region.sizes[d]);
  }
  return view;
}

std::unordered_map<int64_t, at::Tensor> by_index(const LocalTensors& local) {
  TORCH_INTERNAL_ASSERT(local.tensors.size() == local.indices.size());
  std::unordered_map<int64_t, at::Tensor> map;
  for (size_t k = 0; k < local.tensors.size(); ++k) {
    map.emplace(local.indices[k], local.tensors[k]);
  }
  return map;
}

// NOTE [ Redistribute buffers ]
// The all-to-all takes one flat send buffer and one flat receive buffer, each the concatenation of
// the per-peer chunks in rank order, each chunk the peer's regions in canonical order. Building them
// costs a pack copy on the sender and an unpack copy on the receiver, except when a rank's regions,
// in that order, are exactly the row-major memory of one of its shards, front to back: then that
// shard IS the buffer and no copy is made. This is the common case on one side of most moves: the
// sender of a row-chunked tensor (scatter of row chunks, column->row reshard) and the receiver of
// row chunks (gather to a row-major output, row->column reshard). A rank's own chunk must then travel
// through the collective too (the backends copy it locally; it never touches the network); otherwise
// it is copied shard to shard directly and its slot in the all-to-all is empty.
std::optional<at::Tensor> direct_buffer(const std::vector<PeerTransfer>& peers,
                                        const std::vector<Box>& boxes,
                                        const std::unordered_map<int64_t, at::Tensor>& tensors,
                                        bool use_src,
                                        c10::Device device,
                                        c10::ScalarType dtype) {
  std::optional<int64_t> shard;
  int64_t next = 0;
  for (const auto& peer : peers) {
    for (const Region& region : peer.regions) {
      const auto idx = static_cast<int64_t>(use_src ? region.src : region.dst);
      if (shard.has_value() && *shard != idx) {
        return std::nullopt;
      }
      shard = idx;
      const auto run = layout::contiguous_run(region.box, boxes[idx]);
      if (!run.has_value() || run->first != next) {
        return std::nullopt;
      }
      next += run->second;
    }
  }
  if (!shard.has_value()) {
    return std::nullopt;
  }
  const at::Tensor& tensor = tensors.at(*shard);
  if (next != tensor.numel() || !tensor.is_contiguous() || tensor.device() != device ||
      tensor.scalar_type() != dtype) {
    return std::nullopt;
  }
  return tensor.view({-1});
}

std::vector<int64_t> split_sizes(const std::vector<PeerTransfer>& peers, int64_t me, bool include_self,
                                 int64_t itemsize) {
  std::vector<int64_t> splits(peers.size(), 0);
  for (size_t p = 0; p < peers.size(); ++p) {
    if (static_cast<int64_t>(p) != me || include_self) {
      splits[p] = peers[p].elements * itemsize;
    }
  }
  return splits;
}

// NOTE [ Pack workspace ]
// The send buffer lives only for the duration of one call. On CPU, a fresh multi-megabyte buffer
// costs one page fault per 4 KiB page on first touch (on the VMs these tests run on, ~10 us each:
// more than the copy itself), and glibc hands big blocks back to the OS on free. So CPU send buffers
// come from a per-thread, grow-only workspace, kept up to kMaxCachedWorkspaceBytes. CUDA buffers go
// through the caching allocator, which already reuses memory.
constexpr int64_t kMaxCachedWorkspaceBytes = int64_t{256} << 20;

at::Tensor send_workspace(int64_t elements, c10::ScalarType dtype, c10::Device device) {
  const auto opts = at::TensorOptions().dtype(dtype).device(device);
  const int64_t bytes = elements * static_cast<int64_t>(c10::elementSize(dtype));
  if (!device.is_cpu() || bytes > kMaxCachedWorkspaceBytes) {
    return at::empty({elements}, opts);
  }
  thread_local at::Tensor workspace;
  if (!workspace.defined() || workspace.numel() < bytes) {
    workspace = at::empty({bytes}, at::TensorOptions().dtype(at::kByte));
  }
  return workspace.narrow(0, 0, bytes).view(dtype);
}

int64_t sum(const std::vector<int64_t>& values) {
  int64_t total = 0;
  for (int64_t v : values) {
    total += v;
  }
  return total;
}

}  // namespace

int64_t redistribute(const ShardSet& src,
                     const LocalTensors& src_local,
                     const ShardSet& dst,
                     const LocalTensors& dst_local,
                     c10d::ProcessGroup& pg,
                     c10::Device device,
                     c10::ScalarType dtype,
                     const char* op) {
  const int64_t me = pg.getRank();
  const int64_t world = pg.getSize();
  const auto plan = layout::plan_transfer(src.boxes, src.owners, dst.boxes, dst.owners, me, world);
  const auto src_tensors = by_index(src_local);
  const auto dst_tensors = by_index(dst_local);
  for (const auto& peer : plan.send) {
    for (const Region& region : peer.regions) {
      TORCH_CHECK(src_tensors.count(static_cast<int64_t>(region.src)), "torch_shard.", op,
                  ": rank ", me, " owns source shard ", region.src, " but holds no tensor for it");
    }
  }
  for (const auto& peer : plan.recv) {
    for (const Region& region : peer.regions) {
      TORCH_CHECK(dst_tensors.count(static_cast<int64_t>(region.dst)), "torch_shard.", op,
                  ": rank ", me, " owns target shard ", region.dst, " but holds no tensor for it");
    }
  }

  const auto direct_send = direct_buffer(plan.send, src.boxes, src_tensors, true, device, dtype);
  const auto direct_recv = direct_buffer(plan.recv, dst.boxes, dst_tensors, false, device, dtype);
  const bool include_self = direct_send.has_value() || direct_recv.has_value();

  if (!include_self) {
    // What stays on this rank moves shard to shard, never through a buffer.
    for (const Region& region : plan.send[me].regions) {
      region_view(dst_tensors.at(region.dst), dst.boxes[region.dst], region.box)
          .copy_(region_view(src_tensors.at(region.src), src.boxes[region.src], region.box));
    }
  }
  if (world == 1) {
    if (include_self) {
      // A single rank: the "collective" is the local copy of its own chunk.
      for (const Region& region : plan.send[me].regions) {
        region_view(dst_tensors.at(region.dst), dst.boxes[region.dst], region.box)
            .copy_(region_view(src_tensors.at(region.src), src.boxes[region.src], region.box));
      }
    }
    return 0;
  }

  const auto opts = at::TensorOptions().dtype(dtype).device(device);
  const int64_t itemsize = static_cast<int64_t>(c10::elementSize(dtype));
  auto send_splits = split_sizes(plan.send, me, include_self, itemsize);
  auto recv_splits = split_sizes(plan.recv, me, include_self, itemsize);

  at::Tensor send_buffer;
  if (direct_send.has_value()) {
    send_buffer = *direct_send;
  } else {
    send_buffer = send_workspace(sum(send_splits) / itemsize, dtype, device);
    int64_t pos = 0;
    for (int64_t p = 0; p < world; ++p) {
      if (p == me && !include_self) {
        continue;
      }
      for (const Region& region : plan.send[p].regions) {
        const int64_t n = region.box.volume();
        send_buffer.narrow(0, pos, n)
            .view(region.box.sizes)
            .copy_(region_view(src_tensors.at(region.src), src.boxes[region.src], region.box));
        pos += n;
      }
    }
  }
  at::Tensor recv_buffer =
      direct_recv.has_value() ? *direct_recv : at::empty({sum(recv_splits) / itemsize}, opts);

  // Bytes, not elements: every dtype (bool, complex, bfloat16) travels as uint8 on every backend.
  at::Tensor send_bytes = send_buffer.view(at::kByte);
  at::Tensor recv_bytes = recv_buffer.view(at::kByte);
  // alltoall_base is the spelling every supported torch (2.11-2.14) has; 2.13 deprecates it in favour
  // of all_to_all_single, which 2.11 lacks.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
  pg.alltoall_base(recv_bytes, send_bytes, recv_splits, send_splits)->wait();
#pragma GCC diagnostic pop

  auto& stats = comm_stats();
  stats.collectives += 1;
  const int64_t self_send = include_self ? send_splits[me] : 0;
  const int64_t self_recv = include_self ? recv_splits[me] : 0;
  stats.bytes_sent_to_peers += sum(send_splits) - self_send;
  stats.bytes_received_from_peers += sum(recv_splits) - self_recv;

  if (!direct_recv.has_value()) {
    int64_t pos = 0;
    for (int64_t p = 0; p < world; ++p) {
      if (p == me && !include_self) {
        continue;
      }
      for (const Region& region : plan.recv[p].regions) {
        const int64_t n = region.box.volume();
        region_view(dst_tensors.at(region.dst), dst.boxes[region.dst], region.box)
            .copy_(recv_buffer.narrow(0, pos, n).view(region.box.sizes));
        pos += n;
      }
    }
  }
  return layout::elements_sent_to_peers(plan, me);
}

}  // namespace comm
}  // namespace torch_shard
