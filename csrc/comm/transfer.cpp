#include "comm/transfer.h"

#include <cstring>
#include <functional>
#include <list>
#include <mutex>
#include <unordered_map>

#include <ATen/ops/empty.h>
#include <c10/util/Exception.h>

#include "comm/process_group.h"

namespace torch_shard {
namespace comm {

namespace {

using layout::Box;
using layout::Layout;
using layout::PeerTransfer;
using layout::Region;
using layout::TransferPlan;

// NOTE [ Plan cache ]
// Planning intersects every local box with the other layout's boxes (O(N log N)); a training loop
// that gathers or reshards the same tensor every step would redo it every time. Plans are cached per
// (source layout, target layout, rank, world size), as DTensor caches its redistribute transforms.
// The key is the two layouts' fingerprints (computed once per layout, never per call); a hit is
// confirmed by comparing the layouts themselves (pointer equality, else content), so a fingerprint
// collision can never hand out a wrong plan. Least recently used entries go first; the cache is shared
// by all threads behind one mutex (plans are immutable once built).
constexpr size_t kPlanCacheCapacity = 64;

struct PlanKey {
  uint64_t src;
  uint64_t dst;
  int64_t me;
  int64_t world;
  bool operator==(const PlanKey& o) const {
    return src == o.src && dst == o.dst && me == o.me && world == o.world;
  }
};

struct PlanKeyHash {
  size_t operator()(const PlanKey& k) const noexcept {
    return static_cast<size_t>(layout::Fingerprint()
                                   .add(static_cast<int64_t>(k.src))
                                   .add(static_cast<int64_t>(k.dst))
                                   .add(k.me)
                                   .add(k.world)
                                   .value());
  }
};

struct PlanEntry {
  std::shared_ptr<const Layout> src;
  std::shared_ptr<const Layout> dst;
  std::shared_ptr<const TransferPlan> plan;
  std::list<PlanKey>::iterator lru;
};

struct PlanCache {
  std::mutex mutex;
  std::list<PlanKey> lru; // front: most recently used
  std::unordered_map<PlanKey, PlanEntry, PlanKeyHash> entries;
};

PlanCache& plan_cache() {
  static PlanCache cache;
  return cache;
}

at::Tensor region_view(const at::Tensor& tensor, const Box& shard, const Box& region) {
  at::Tensor view = tensor;
  for (size_t d = 0; d < shard.ndim(); ++d) {
    view = view.narrow(static_cast<int64_t>(d), region.offsets[d] - shard.offsets[d], region.sizes[d]);
  }
  return view;
}

// NOTE [ Raw region copies ]
// Moving a region between two row-major arrays (a shard, another shard, or a message buffer shaped
// like the region) is a loop of memcpy over its contiguous runs. Doing it with ATen views costs
// ndim `narrow` calls per side and a `copy_`, each a trip through the dispatcher; for the small and
// medium tensors the data ops move, that overhead outweighs the copying itself. So CPU
// copies between contiguous tensors of the same dtype take this path; anything else (other devices,
// strided tensors, a dtype conversion into `out`) keeps the ATen path. Every box here comes from a
// validated layout and every region lies inside both boxes, so the offsets below stay inside the
// arrays and fit in int64 (NOTE [ Checked box arithmetic ]).
void copy_box_bytes(char* dst, const Box& dst_box, const char* src, const Box& src_box, const Box& region,
                    int64_t itemsize) {
  const auto d = static_cast<int64_t>(region.ndim());
  if (region.empty()) {
    return;
  }
  if (d == 0) {
    std::memcpy(dst, src, static_cast<size_t>(itemsize));
    return;
  }
  auto full = [&](int64_t j) {
    return region.offsets[j] == src_box.offsets[j] && region.sizes[j] == src_box.sizes[j] &&
           region.offsets[j] == dst_box.offsets[j] && region.sizes[j] == dst_box.sizes[j];
  };
  // Dims after k are whole in both arrays, so each run spans dims k.. contiguously in both.
  int64_t k = d - 1;
  while (k > 0 && full(k)) {
    --k;
  }
  std::vector<int64_t> src_stride(d), dst_stride(d);
  int64_t ss = 1, ds = 1;
  for (int64_t j = d - 1; j >= 0; --j) {
    src_stride[j] = ss;
    dst_stride[j] = ds;
    ss *= src_box.sizes[j];
    ds *= dst_box.sizes[j];
  }
  const int64_t run_bytes = region.sizes[k] * src_stride[k] * itemsize; // == dst_stride[k] * ...
  int64_t src_base = 0, dst_base = 0;
  for (int64_t j = 0; j < d; ++j) {
    src_base += (region.offsets[j] - src_box.offsets[j]) * src_stride[j];
    dst_base += (region.offsets[j] - dst_box.offsets[j]) * dst_stride[j];
  }
  std::vector<int64_t> idx(k, 0);
  while (true) {
    int64_t so = src_base, dof = dst_base;
    for (int64_t j = 0; j < k; ++j) {
      so += idx[j] * src_stride[j];
      dof += idx[j] * dst_stride[j];
    }
    std::memcpy(dst + dof * itemsize, src + so * itemsize, static_cast<size_t>(run_bytes));
    int64_t j = k - 1;
    while (j >= 0 && ++idx[j] == region.sizes[j]) {
      idx[j] = 0;
      --j;
    }
    if (j < 0) {
      break;
    }
  }
}

bool raw_copyable(const at::Tensor& t, c10::ScalarType dtype) {
  return t.device().is_cpu() && t.is_contiguous() && t.scalar_type() == dtype;
}

// Copies `region` of `src` (shaped like src_box) into `dst` (shaped like dst_box).
void copy_region(const at::Tensor& dst, const Box& dst_box, const at::Tensor& src, const Box& src_box,
                 const Box& region) {
  if (raw_copyable(dst, src.scalar_type()) && raw_copyable(src, src.scalar_type())) {
    copy_box_bytes(static_cast<char*>(dst.data_ptr()), dst_box,
                   static_cast<const char*>(src.const_data_ptr()), src_box, region,
                   static_cast<int64_t>(src.element_size()));
    return;
  }
  region_view(dst, dst_box, region).copy_(region_view(src, src_box, region));
}

// Position of each held shard in a LocalTensors, or -1.
std::unordered_map<int64_t, size_t> positions(const LocalTensors& local) {
  TORCH_INTERNAL_ASSERT(local.tensors.size() == local.indices.size());
  std::unordered_map<int64_t, size_t> map;
  for (size_t k = 0; k < local.tensors.size(); ++k) {
    map.emplace(local.indices[k], k);
  }
  return map;
}

// The bytes of `run` inside `tensor` (one of this rank's shards) when they can travel in place.
at::Tensor direct_bytes(const at::Tensor& tensor, const layout::Run& run, c10::Device device,
                        c10::ScalarType dtype) {
  if (!tensor.is_contiguous() || tensor.device() != device || tensor.scalar_type() != dtype) {
    return at::Tensor();
  }
  return tensor.view({-1}).narrow(0, run.start, run.count).view(at::kByte);
}

using TensorOf = std::function<const at::Tensor&(size_t)>;

// Fills a message buffer with `regions` of the source shards, in order.
std::function<void(const at::Tensor&)> packer(const std::vector<Region>& regions, const Layout& src,
                                              TensorOf src_tensor, c10::ScalarType dtype) {
  return [&regions, &src, src_tensor = std::move(src_tensor), dtype](const at::Tensor& into) {
    const auto itemsize = static_cast<int64_t>(c10::elementSize(dtype));
    const bool raw = into.device().is_cpu();
    at::Tensor typed = raw ? at::Tensor() : into.view(dtype);
    int64_t pos = 0;
    for (const Region& region : regions) {
      const int64_t n = region.box.volume();
      const at::Tensor& source = src_tensor(region.src);
      if (raw && raw_copyable(source, dtype)) {
        copy_box_bytes(static_cast<char*>(into.data_ptr()) + pos * itemsize, region.box,
                       static_cast<const char*>(source.const_data_ptr()), src.box(region.src), region.box,
                       itemsize);
      } else {
        (raw ? into.view(dtype) : typed)
            .narrow(0, pos, n)
            .view(region.box.sizes)
            .copy_(region_view(source, src.box(region.src), region.box));
      }
      pos += n;
    }
  };
}

// Copies a message buffer into `regions` of the target shards, in order (converting the dtype).
std::function<void(const at::Tensor&)> unpacker(const std::vector<Region>& regions, const Layout& dst,
                                                TensorOf dst_tensor, c10::ScalarType dtype) {
  return [&regions, &dst, dst_tensor = std::move(dst_tensor), dtype](const at::Tensor& from) {
    const auto itemsize = static_cast<int64_t>(c10::elementSize(dtype));
    const bool raw = from.device().is_cpu();
    int64_t pos = 0;
    for (const Region& region : regions) {
      const int64_t n = region.box.volume();
      const at::Tensor& target = dst_tensor(region.dst);
      if (raw && raw_copyable(target, dtype)) {
        copy_box_bytes(static_cast<char*>(target.data_ptr()), dst.box(region.dst),
                       static_cast<const char*>(from.const_data_ptr()) + pos * itemsize, region.box,
                       region.box, itemsize);
      } else {
        region_view(target, dst.box(region.dst), region.box)
            .copy_(from.view(dtype).narrow(0, pos, n).view(region.box.sizes));
      }
      pos += n;
    }
  };
}

} // namespace

std::shared_ptr<const TransferPlan> cached_plan(const std::shared_ptr<const Layout>& src,
                                                const std::shared_ptr<const Layout>& dst, int64_t me,
                                                int64_t world) {
  auto& cache = plan_cache();
  auto& stats = comm_stats();
  const PlanKey key{src->fingerprint(), dst->fingerprint(), me, world};
  {
    std::lock_guard<std::mutex> guard(cache.mutex);
    auto it = cache.entries.find(key);
    if (it != cache.entries.end() && it->second.src->same_as(*src) && it->second.dst->same_as(*dst)) {
      cache.lru.splice(cache.lru.begin(), cache.lru, it->second.lru);
      stats.plan_cache_hits += 1;
      return it->second.plan;
    }
  }
  stats.plan_cache_misses += 1;
  auto plan = std::make_shared<const TransferPlan>(layout::plan_transfer(*src, *dst, me, world));
  std::lock_guard<std::mutex> guard(cache.mutex);
  auto it = cache.entries.find(key);
  if (it != cache.entries.end()) {
    cache.lru.erase(it->second.lru);
    cache.entries.erase(it);
  }
  cache.lru.push_front(key);
  cache.entries.emplace(key, PlanEntry{src, dst, plan, cache.lru.begin()});
  while (cache.entries.size() > kPlanCacheCapacity) {
    cache.entries.erase(cache.lru.back());
    cache.lru.pop_back();
  }
  return plan;
}

void clear_plan_cache() {
  auto& cache = plan_cache();
  std::lock_guard<std::mutex> guard(cache.mutex);
  cache.entries.clear();
  cache.lru.clear();
}

LocalTensors allocate_local(const Layout& layout, int64_t me, c10::ScalarType dtype, bool pin_memory) {
  LocalTensors out;
  for (int64_t idx : layout.shards_of(me)) {
    const auto& box = layout.box(static_cast<size_t>(idx));
    const c10::Device device = layout.placement(static_cast<size_t>(idx)).device;
    out.tensors.push_back(at::empty(box.sizes, at::TensorOptions().dtype(dtype).device(device).pinned_memory(
                                                   pin_memory && device.is_cpu())));
    out.indices.push_back(idx);
  }
  return out;
}

Moves transfer_moves(const TransferPlan& plan, const Layout& src, const LocalTensors& src_local,
                     const Layout& dst, const LocalTensors& dst_local, int64_t me, c10::Device device,
                     c10::ScalarType dtype) {
  const auto world = static_cast<int64_t>(plan.send.size());
  // Shared by the pack/unpack closures (one map per side, not one copy per peer).
  auto src_pos = std::make_shared<const std::unordered_map<int64_t, size_t>>(positions(src_local));
  auto dst_pos = std::make_shared<const std::unordered_map<int64_t, size_t>>(positions(dst_local));
  auto src_tensor = [&src_local, src_pos](size_t shard) -> const at::Tensor& {
    auto it = src_pos->find(static_cast<int64_t>(shard));
    TORCH_INTERNAL_ASSERT(it != src_pos->end(), "no local tensor for source shard ", shard);
    return src_local.tensors[it->second];
  };
  auto dst_tensor = [&dst_local, dst_pos](size_t shard) -> const at::Tensor& {
    auto it = dst_pos->find(static_cast<int64_t>(shard));
    TORCH_INTERNAL_ASSERT(it != dst_pos->end(), "no local tensor for target shard ", shard);
    return dst_local.tensors[it->second];
  };
  // Every region this rank sends or receives needs its tensor; a missing one is a caller bug (data ops
  // check the local shards against the layout before planning).
  for (int64_t p = 0; p < world; ++p) {
    for (const Region& r : plan.send[p].regions) {
      (void)src_tensor(r.src);
    }
    for (const Region& r : plan.recv[p].regions) {
      (void)dst_tensor(r.dst);
    }
  }
  const int64_t itemsize = static_cast<int64_t>(c10::elementSize(dtype));
  const auto bytes_of = [itemsize](int64_t elements) {
    return layout::checked_mul(elements, itemsize, "torch_shard: a message size in bytes");
  };

  // Sets a message's size and, where the plan found one contiguous run for it, the shard memory it moves
  // straight from or into; true when it moves anything (it then also gets a packer or an unpacker, for
  // the exchange's staged paths).
  const auto sized = [&](auto& message, const PeerTransfer& transfer, const auto& tensor_of) {
    message.bytes = bytes_of(transfer.elements);
    if (message.bytes > 0 && transfer.run.has_value()) {
      message.direct = direct_bytes(tensor_of(transfer.run->shard), *transfer.run, device, dtype);
    }
    return message.bytes > 0;
  };
  const auto outgoing = [&](const PeerTransfer& out) {
    Outgoing send;
    if (sized(send, out, src_tensor)) {
      send.pack = packer(out.regions, src, src_tensor, dtype);
    }
    return send;
  };
  const auto incoming = [&](const PeerTransfer& in) {
    Incoming recv;
    if (sized(recv, in, dst_tensor)) {
      recv.unpack = unpacker(in.regions, dst, dst_tensor, dtype);
    }
    return recv;
  };

  Moves moves;
  moves.send.resize(world);
  moves.recv.resize(world);
  for (int64_t p = 0; p < world; ++p) {
    if (p != me) {
      moves.send[p] = outgoing(plan.send[p]);
      moves.recv[p] = incoming(plan.recv[p]);
    }
  }
  // What stays on this rank, as a message to itself: both sides hold the same regions, seen from the
  // source and from the target, so they count the same bytes.
  const PeerTransfer& own = plan.send[me];
  TORCH_INTERNAL_ASSERT(own.elements == plan.recv[me].elements, "the part staying on rank ", me,
                        " counts differently as sent and as received");
  moves.self_send = outgoing(own);
  moves.self_recv = incoming(plan.recv[me]);
  if (!own.regions.empty()) {
    moves.local = [&own, &src, &dst, src_tensor, dst_tensor]() {
      for (const Region& region : own.regions) {
        copy_region(dst_tensor(region.dst), dst.box(region.dst), src_tensor(region.src), src.box(region.src),
                    region.box);
      }
    };
  }
  return moves;
}

} // namespace comm
} // namespace torch_shard
