// Kernels for the pure layout ops: thin adapters from schema types to csrc/layout/.
//
// None has anything for autograd to track. chunk_boxes returns tensors whose shapes follow from its
// integer arguments: it is CompositeExplicitAutograd (no tensor inputs, so the kernel must serve an
// empty key set) with a fake kernel (torch_shard/_support/_op_registrations.py), so it can be traced. The
// others return integers or nothing: chunk_layout and chunked_dim_size take no tensors; validate_shards,
// _find_overlap, _transfer_counts and _layout_fingerprint read the VALUES of their box tensors, so
// they cannot be traced and raise for fake or meta tensors (NOTE [ Ops that cannot be traced ]).
// Those stay CompositeImplicitAutograd (ops/registration.cpp).

#include "ops/layout_ops.h"

#include <ATen/ops/empty.h>

#include "layout/box.h"
#include "layout/chunk.h"
#include "layout/layout.h"
#include "layout/plan.h"
#include "layout/validate.h"
#include "ops/layout_args.h"

namespace torch_shard {
namespace ops {

std::tuple<std::vector<int64_t>, std::vector<int64_t>> chunk_layout(int64_t dim_size, int64_t num_chunks) {
  const int64_t split = layout::chunk_split_size(dim_size, num_chunks);
  std::vector<int64_t> offsets(num_chunks), lengths(num_chunks);
  for (int64_t i = 0; i < num_chunks; ++i) {
    offsets[i] = layout::checked_mul(split, i, "torch_shard: a chunk offset");
    lengths[i] = layout::chunked_dim_size(dim_size, split, i);
  }
  return {std::move(offsets), std::move(lengths)};
}

int64_t chunked_dim_size(int64_t dim_size, int64_t split_size, int64_t index) {
  return layout::chunked_dim_size(dim_size, split_size, index);
}

// The (N, ndim) offsets and sizes of ChunkShardingSpec's N-D boxes: `global_size` split along `dim`
// into `num_chunks` chunks.
std::tuple<at::Tensor, at::Tensor> chunk_boxes(c10::IntArrayRef global_size, int64_t dim,
                                               int64_t num_chunks) {
  const auto boxes = layout::chunk_boxes(global_size.vec(), dim, num_chunks);
  const auto ndim = static_cast<int64_t>(global_size.size());
  const auto opts = at::TensorOptions().dtype(at::kLong);
  at::Tensor offsets = at::empty({num_chunks, ndim}, opts);
  at::Tensor sizes = at::empty({num_chunks, ndim}, opts);
  int64_t* off = offsets.mutable_data_ptr<int64_t>();
  int64_t* len = sizes.mutable_data_ptr<int64_t>();
  for (int64_t i = 0; i < num_chunks; ++i) {
    std::copy(boxes[i].offsets.begin(), boxes[i].offsets.end(), off + i * ndim);
    std::copy(boxes[i].sizes.begin(), boxes[i].sizes.end(), len + i * ndim);
  }
  return {std::move(offsets), std::move(sizes)};
}

void validate_shards(const at::Tensor& shard_offsets, const at::Tensor& shard_sizes,
                     c10::OptionalIntArrayRef global_size) {
  const auto boxes = boxes_from_tensors(shard_offsets, shard_sizes, "validate_shards");
  std::optional<layout::Dims> global;
  if (global_size.has_value()) {
    global = global_size->vec();
  }
  layout::validate_shards(boxes, global);
}

std::vector<int64_t> find_overlap(const at::Tensor& shard_offsets, const at::Tensor& shard_sizes) {
  const auto boxes = boxes_from_tensors(shard_offsets, shard_sizes, "_find_overlap");
  if (auto pair = layout::find_overlap(boxes)) {
    return {static_cast<int64_t>(pair->first), static_cast<int64_t>(pair->second)};
  }
  return {};
}

// Elements group rank `me` sends to / receives from each rank (itself included) when data moves from
// the source layout to the target layout: the plan the data ops use, without a process group.
std::tuple<std::vector<int64_t>, std::vector<int64_t>>
transfer_counts(c10::IntArrayRef global_size, const at::Tensor& src_offsets, const at::Tensor& src_sizes,
                c10::IntArrayRef src_owners, const at::Tensor& dst_offsets, const at::Tensor& dst_sizes,
                c10::IntArrayRef dst_owners, int64_t me, int64_t world) {
  TORCH_CHECK_VALUE(world > 0 && me >= 0 && me < world, "torch_shard._transfer_counts: rank ", me,
                    " is not a rank of a group of size ", world);
  const auto src = replicated_layout(global_size, src_offsets, src_sizes, src_owners, world,
                                     c10::DeviceType::CPU, "_transfer_counts", "source");
  const auto dst = replicated_layout(global_size, dst_offsets, dst_sizes, dst_owners, world,
                                     c10::DeviceType::CPU, "_transfer_counts", "target");
  const auto plan = layout::plan_transfer(*src, *dst, me, world);
  std::vector<int64_t> send(world), recv(world);
  for (int64_t p = 0; p < world; ++p) {
    send[p] = plan.send[p].elements;
    recv[p] = plan.recv[p].elements;
  }
  return {std::move(send), std::move(recv)};
}

// The layout fingerprint the data ops agree on, for the agreements Python runs itself (a spec that
// shards itself, from_dtensor's check): the one fingerprint there is.
int64_t layout_fingerprint(c10::IntArrayRef global_size, std::optional<int64_t> chunk_dim,
                           const std::optional<at::Tensor>& shard_offsets,
                           const std::optional<at::Tensor>& shard_sizes,
                           const std::optional<at::Tensor>& placement_index,
                           std::vector<std::string> placements, c10::IntArrayRef placement_owners,
                           c10::ScalarType dtype) {
  const auto layout =
      layout_from_args(global_size, chunk_dim, shard_offsets, shard_sizes, placement_index, placements,
                       placement_owners, /*world=*/-1, /*validate=*/false, "_layout_fingerprint");
  return layout_and_dtype_fp(*layout, dtype);
}

} // namespace ops
} // namespace torch_shard
