// What the sharded lookups share: see ops/lookup_common.h.

#include "ops/lookup_common.h"

#include <algorithm>
#include <atomic>
#include <limits>

#include <ATen/Dispatch.h>
#include <ATen/ops/empty.h>
#include <c10/util/Exception.h>

#include "layout/layout.h"

namespace torch_shard {
namespace ops {

namespace {

constexpr std::pair<LookupMode, const char*> kModes[] = {
    {LookupMode::kEmbedding, "embedding"},
    {LookupMode::kSum, "sum"},
    {LookupMode::kMean, "mean"},
    {LookupMode::kMax, "max"},
};

std::atomic<bool> use_cpu_loops{true};

} // namespace

LookupMode parse_mode(const char* op, c10::string_view name) {
  for (const auto& [mode, known] : kModes) {
    if (name == known) {
      return mode;
    }
  }
  TORCH_CHECK_VALUE(false, op, ": mode must be 'embedding', 'sum', 'mean' or 'max', got '", name, "'");
}

const char* mode_name(LookupMode mode) {
  for (const auto& [known, name] : kModes) {
    if (known == mode) {
      return name;
    }
  }
  return "unknown";
}

Blocks checked_blocks(const char* op, c10::IntArrayRef starts, c10::IntArrayRef sizes, int64_t world,
                      int64_t dim_size) {
  TORCH_CHECK_VALUE(static_cast<int64_t>(starts.size()) == world && sizes.size() == starts.size(), op,
                    ": one block start and size per rank of the group (", world, "), got ", starts.size(),
                    " and ", sizes.size());
  for (int64_t r = 0; r < world; ++r) {
    // An empty block may start anywhere (ChunkShardingSpec's empty chunks start past the end).
    TORCH_CHECK_VALUE(
        sizes[r] >= 0 &&
            (sizes[r] == 0 || (starts[r] >= 0 && starts[r] <= dim_size && sizes[r] <= dim_size - starts[r])),
        op, ": rank ", r, "'s block [", starts[r], ", +", sizes[r], ") is not within [0, ", dim_size, ")");
  }
  // The non-empty blocks tile the dim: every index has exactly one owner (an id routed by these
  // blocks is always within its owner's rows).
  std::vector<std::pair<int64_t, int64_t>> held; // (start, size) of the non-empty blocks
  for (int64_t r = 0; r < world; ++r) {
    if (sizes[r] > 0) {
      held.emplace_back(starts[r], sizes[r]);
    }
  }
  std::sort(held.begin(), held.end());
  int64_t covered = 0;
  for (const auto& [start, size] : held) {
    TORCH_CHECK_VALUE(start == covered, op, ": the ranks' blocks do not tile [0, ", dim_size, "): index ",
                      std::min(start, covered), start > covered ? " has no owner" : " has two owners");
    covered = start + size;
  }
  TORCH_CHECK_VALUE(covered == dim_size, op, ": the ranks' blocks do not tile [0, ", dim_size, "): index ",
                    covered, " has no owner");
  return Blocks{starts.vec(), sizes.vec()};
}

int64_t table_fingerprint(int64_t layout, int64_t num_embeddings, int64_t dim, const at::Tensor& local,
                          const Blocks& blocks) {
  return layout::Fingerprint()
      .add(layout)
      .add(num_embeddings)
      .add(dim)
      .add(static_cast<int64_t>(local.scalar_type()))
      .add(dim == 0 ? local.size(1) : int64_t{-1})
      .add(blocks.starts)
      .add(blocks.sizes)
      .as_int64();
}

std::vector<double> agreed_arguments(LookupOp op, c10::ArrayRef<double> arguments,
                                     std::initializer_list<double> own) {
  std::vector<double> agreed(arguments.begin(), arguments.end());
  agreed.push_back(static_cast<double>(op));
  agreed.insert(agreed.end(), own.begin(), own.end());
  return agreed;
}

bool cpu_loops() {
  return use_cpu_loops.load(std::memory_order_relaxed);
}

void set_cpu_loops(bool on) {
  use_cpu_loops.store(on);
}

c10::ScalarType index_dtype(int64_t num_embeddings) {
  return num_embeddings <= std::numeric_limits<int32_t>::max() ? at::kInt : at::kLong;
}

at::Tensor to_device(const std::vector<int64_t>& values, c10::Device device, c10::ScalarType dtype) {
  TORCH_INTERNAL_ASSERT(dtype == at::kLong || dtype == at::kInt);
  at::Tensor host = at::empty({static_cast<int64_t>(values.size())}, at::TensorOptions().dtype(dtype));
  AT_DISPATCH_INDEX_TYPES(dtype, "to_device", [&] {
    std::transform(values.begin(), values.end(), host.mutable_data_ptr<index_t>(),
                   [](int64_t v) { return static_cast<index_t>(v); });
  });
  if (device.is_cpu()) {
    return host;
  }
  if (device.is_cuda()) {
    host = host.pin_memory();
  }
  return host.to(device, /*non_blocking=*/true);
}

void copy_aliases(std::vector<at::Tensor>& outputs, std::initializer_list<at::Tensor> inputs) {
  for (at::Tensor& out : outputs) {
    for (const at::Tensor& in : inputs) {
      if (out.defined() && in.defined() && out.is_alias_of(in)) {
        out = out.clone();
        break;
      }
    }
  }
}

int64_t checked_total(c10::IntArrayRef values) {
  int64_t sum = 0;
  for (int64_t v : values) {
    TORCH_CHECK_VALUE(v >= 0, "torch_shard: a negative count (", v, ")");
    sum = layout::checked_add(sum, v, "torch_shard: a sum of counts");
  }
  return sum;
}

} // namespace ops
} // namespace torch_shard
