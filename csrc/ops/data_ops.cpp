// Kernels that move data over the tensor's process group: shard (scatter), gather, reshard, and the
// small header exchange the Python layer uses to agree on arguments before any data moves.
//
// All of them resolve the group by name and call the c10d::ProcessGroup API, so the same code runs
// gloo on CPU and NCCL on GPU. See csrc/comm/redistribute.h for the data path.

#include <ATen/ops/empty.h>
#include <torch/library.h>

#include "comm/process_group.h"
#include "comm/redistribute.h"
#include "layout/box.h"
#include "ops/box_args.h"
#include "sharded_tensor_impl.h"

namespace torch_shard {
namespace {

using comm::LocalTensors;
using comm::ShardSet;

ShardSet whole_tensor_on(const layout::Dims& global_size, int64_t owner) {
  return ShardSet{{layout::Box{layout::Dims(global_size.size(), 0), global_size}}, {owner}};
}

ShardSet shard_set(const at::Tensor& offsets, const at::Tensor& sizes, c10::IntArrayRef owners,
                   const char* op) {
  ShardSet set{boxes_from_tensors(offsets, sizes, op), owners.vec()};
  TORCH_CHECK_VALUE(set.boxes.size() == set.owners.size(), "torch_shard.", op, ": ",
                    set.boxes.size(), " shards but ", set.owners.size(), " owners");
  return set;
}

LocalTensors local_outputs(at::TensorList shards, c10::IntArrayRef indices, const ShardSet& layout,
                           c10::ScalarType dtype, const char* op) {
  TORCH_CHECK_VALUE(shards.size() == indices.size(), "torch_shard.", op, ": ", shards.size(),
                    " output shards but ", indices.size(), " indices");
  LocalTensors local{shards.vec(), indices.vec()};
  for (size_t k = 0; k < local.tensors.size(); ++k) {
    const int64_t idx = local.indices[k];
    TORCH_CHECK_INDEX(idx >= 0 && idx < static_cast<int64_t>(layout.boxes.size()), "torch_shard.",
                      op, ": output shard ", k, " claims shard ", idx, " of ", layout.boxes.size());
    TORCH_CHECK_VALUE(local.tensors[k].sizes().vec() == layout.boxes[idx].sizes, "torch_shard.", op,
                      ": output shard ", k, " has size ", local.tensors[k].sizes(),
                      ", but shard ", idx, " is ", layout::dims_str(layout.boxes[idx].sizes));
    TORCH_CHECK_TYPE(local.tensors[k].scalar_type() == dtype, "torch_shard.", op, ": output shard ",
                     k, " has dtype ", local.tensors[k].scalar_type(), ", expected ", dtype);
  }
  return local;
}

std::vector<int64_t> exchange_header(c10::IntArrayRef values, c10::string_view group_name,
                                     c10::Device device) {
  auto pg = comm::resolve_group(std::string(group_name), "_exchange_header");
  return comm::exchange_header(*pg, values.vec(), device);
}

std::vector<int64_t> get_comm_stats(bool reset) {
  auto& stats = comm::comm_stats();
  std::vector<int64_t> out{stats.bytes_sent_to_peers, stats.bytes_received_from_peers,
                           stats.collectives};
  if (reset) {
    stats = comm::CommStats{};
  }
  return out;
}

void shard(const std::optional<at::Tensor>& tensor,
           int64_t src,
           c10::IntArrayRef global_size,
           at::TensorList out_shards,
           c10::IntArrayRef out_indices,
           const at::Tensor& shard_offsets,
           const at::Tensor& shard_sizes,
           c10::IntArrayRef shard_owners,
           c10::ScalarType dtype,
           c10::Device device,
           c10::string_view group_name) {
  auto pg = comm::resolve_group(std::string(group_name), "shard");
  const int64_t me = pg->getRank();
  TORCH_CHECK_INDEX(src >= 0 && src < pg->getSize(), "torch_shard.shard: src_rank ", src,
                    " is not a rank of a group of size ", pg->getSize());
  const ShardSet dst = shard_set(shard_offsets, shard_sizes, shard_owners, "shard");
  const LocalTensors dst_local = local_outputs(out_shards, out_indices, dst, dtype, "shard");
  const ShardSet source = whole_tensor_on(global_size.vec(), src);
  LocalTensors src_local;
  if (me == src) {
    TORCH_CHECK_VALUE(tensor.has_value() && tensor->defined(),
                      "torch_shard.shard: the source rank must pass the tensor to shard");
    TORCH_CHECK_VALUE(tensor->sizes() == global_size, "torch_shard.shard: tensor of size ",
                      tensor->sizes(), " on the source rank, but the layout is for ",
                      layout::dims_str(global_size.vec()));
    TORCH_CHECK_TYPE(tensor->scalar_type() == dtype, "torch_shard.shard: tensor has dtype ",
                     tensor->scalar_type(), ", expected ", dtype);
    src_local = LocalTensors{{*tensor}, {0}};
  }
  comm::redistribute(source, src_local, dst, dst_local, *pg, device, dtype, "shard");
}

void gather(const at::Tensor& self, int64_t dst, const std::optional<at::Tensor>& out,
            c10::string_view group_name) {
  const auto* impl = unsafe_get_sharded_impl(self, "gather");
  auto pg = comm::resolve_group(std::string(group_name), "gather");
  const int64_t me = pg->getRank();
  TORCH_CHECK_INDEX(dst >= 0 && dst < pg->getSize(), "torch_shard.gather: dst ", dst,
                    " is not a rank of a group of size ", pg->getSize());
  const ShardSet source{impl->global_shards(), impl->shard_ranks()};
  const LocalTensors src_local{impl->local_shards(), impl->local_shard_indices()};
  const ShardSet target = whole_tensor_on(impl->global_size(), dst);
  LocalTensors dst_local;
  if (me == dst) {
    TORCH_CHECK_VALUE(out.has_value() && out->defined(),
                      "torch_shard.gather: the destination rank must pass `out`");
    TORCH_CHECK_VALUE(out->sizes().vec() == impl->global_size(), "torch_shard.gather: out has size ",
                      out->sizes(), ", but the ShardedTensor has size ",
                      layout::dims_str(impl->global_size()));
    dst_local = LocalTensors{{*out}, {0}};
  }
  comm::redistribute(source, src_local, target, dst_local, *pg, impl->device(),
                     impl->dtype().toScalarType(), "gather");
}

void reshard(const at::Tensor& self,
             at::TensorList out_shards,
             c10::IntArrayRef out_indices,
             const at::Tensor& shard_offsets,
             const at::Tensor& shard_sizes,
             c10::IntArrayRef shard_owners,
             c10::string_view group_name) {
  auto* impl = unsafe_get_sharded_impl(self, "reshard");
  auto pg = comm::resolve_group(std::string(group_name), "reshard");
  ShardSet target = shard_set(shard_offsets, shard_sizes, shard_owners, "reshard");
  for (const auto& box : target.boxes) {
    TORCH_CHECK_VALUE(box.ndim() == impl->global_size().size(), "torch_shard.reshard: target shards have ",
                      box.ndim(), " dims, the tensor has ", impl->global_size().size());
  }
  LocalTensors dst_local = local_outputs(out_shards, out_indices, target, impl->dtype().toScalarType(), "reshard");
  const ShardSet source{impl->global_shards(), impl->shard_ranks()};
  const LocalTensors src_local{impl->local_shards(), impl->local_shard_indices()};
  comm::redistribute(source, src_local, target, dst_local, *pg, impl->device(),
                     impl->dtype().toScalarType(), "reshard");
  impl->set_layout(std::move(target.boxes), std::move(target.owners), std::move(dst_local.tensors),
                   std::move(dst_local.indices));
}

at::Tensor all_to_all(const at::Tensor& input, c10::IntArrayRef send_counts,
                      c10::IntArrayRef recv_counts, c10::string_view group_name) {
  auto pg = comm::resolve_group(std::string(group_name), "_all_to_all");
  return comm::all_to_all_flat(*pg, input, send_counts.vec(), recv_counts.vec());
}

std::vector<at::Tensor> all_gather_varlen(const at::Tensor& input, c10::string_view group_name) {
  auto pg = comm::resolve_group(std::string(group_name), "_all_gather_varlen");
  const int64_t world = pg->getSize();
  TORCH_CHECK_VALUE(input.dim() >= 1, "torch_shard._all_gather_varlen: expected at least 1 dim");
  // Lengths first (with the trailing shape, so mismatches fail on every rank), then one all-to-all in
  // which every rank sends its input to every rank.
  std::vector<int64_t> header{input.size(0), input.numel() / std::max<int64_t>(input.size(0), 1),
                              static_cast<int64_t>(input.scalar_type())};
  const auto table = comm::exchange_header(*pg, header, input.device());
  std::vector<int64_t> recv_counts(world), send_counts(world, input.numel());
  for (int64_t p = 0; p < world; ++p) {
    const int64_t rows = table[p * 3], row_numel = table[p * 3 + 1];
    TORCH_CHECK_VALUE(table[p * 3 + 2] == header[2], "torch_shard._all_gather_varlen: rank ", p,
                      " has dtype ", static_cast<c10::ScalarType>(table[p * 3 + 2]), ", this rank ",
                      input.scalar_type());
    TORCH_CHECK_VALUE(rows == 0 || header[0] == 0 || row_numel == header[1],
                      "torch_shard._all_gather_varlen: rank ", p,
                      " has rows of a different size than this rank");
    recv_counts[p] = rows * row_numel;
  }
  const at::Tensor flat = input.contiguous().view({-1});
  const at::Tensor send = world == 1 ? flat : flat.repeat({world});
  const at::Tensor recv = comm::all_to_all_flat(*pg, send, send_counts, recv_counts);
  std::vector<at::Tensor> out;
  int64_t pos = 0;
  auto trailing = input.sizes().vec();
  for (int64_t p = 0; p < world; ++p) {
    trailing[0] = table[p * 3];
    out.push_back(recv.narrow(0, pos, recv_counts[p]).view(trailing));
    pos += recv_counts[p];
  }
  return out;
}

}  // namespace

TORCH_LIBRARY_IMPL(torch_shard, CompositeImplicitAutograd, m) {
  m.impl("_all_to_all", TORCH_FN(all_to_all));
  m.impl("_all_gather_varlen", TORCH_FN(all_gather_varlen));
  m.impl("_exchange_header", TORCH_FN(exchange_header));
  m.impl("_comm_stats", TORCH_FN(get_comm_stats));
  m.impl("shard", TORCH_FN(shard));
  m.impl("gather", TORCH_FN(gather));
  m.impl("reshard", TORCH_FN(reshard));
}

}  // namespace torch_shard
