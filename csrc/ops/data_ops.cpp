// The ShardedTensor data ops: shard (scatter), gather, reshard, and the agreement-only ones (_abort,
// _agree_shard). Each is ONE call that runs, in order:
//   local checks -> agreement (error codes and fingerprints, computed here) -> plan (cached) -> move,
// so a direct torch.ops.torch_shard.* call is as safe as the Python methods: bad or mismatched
// arguments raise on every rank, and nothing is written unless every rank agreed. See
// NOTE [ Agreed exchange ] (comm/exchange.cpp) for the rounds and NOTE [ Plan cache ]
// (comm/transfer.cpp) for planning.
// Every op here that communicates raises first under FakeTensorMode / make_fx: see NOTE [ Ops that
// cannot be traced ] (ops/untraceable.h).

#include <ATen/core/grad_mode.h>
#include <torch/library.h>

#include "comm/exchange.h"
#include "comm/process_group.h"
#include "comm/transfer.h"
#include "layout/layout.h"
#include "ops/agreement.h"
#include "ops/data_ops.h"
#include "ops/layout_args.h"
#include "ops/untraceable.h"
#include "sharded_tensor_impl.h"

namespace torch_shard {
namespace {

using comm::LocalTensors;
using comm::Values;
using layout::Fingerprint;
using layout::Layout;
using ops::agreement;
using ops::first_mismatch;
using ops::kCommunicates;

// What every rank must agree on about a tensor besides its layout.
int64_t size_and_dtype_fp(const layout::Dims& size, c10::ScalarType dtype) {
  return Fingerprint().add(size).add(static_cast<int64_t>(dtype)).as_int64();
}

// Where this rank's shards live, if it holds any (the communication device follows them on CUDA).
std::optional<c10::Device> shards_device(const ShardedTensorImpl& impl) {
  if (impl.local_shards().empty() || !impl.local_shards().front().defined()) {
    return std::nullopt;
  }
  return impl.local_shards().front().device();
}

// Every non-empty shard must be held by a member of the group, or its data is nowhere.
void check_owned(const Layout& layout, int64_t world, const char* op) {
  for (size_t i = 0; i < layout.num_shards(); ++i) {
    const int64_t owner = layout.owner(i);
    TORCH_CHECK_VALUE(layout.box(i).empty() || (owner >= 0 && owner < world), "torch_shard.", op, ": shard ",
                      layout::describe_box(layout.box(i), i), " (placement '", layout.placement(i).name,
                      "') has no owner in the process group");
  }
}

// The agreement of a scatter: the same source rank, tensor size and dtype, and layout everywhere
// (upstream's messages for the first and last).
void check_shard(const std::vector<Values>& all, int64_t me) {
  if (const int64_t r = first_mismatch(all, me, 0); r >= 0) {
    TORCH_CHECK_VALUE(false, "src_rank=", all[me][0], " on rank: ", me,
                      " does not match with src_rank=", all[r][0], " on rank: ", r);
  }
  if (const int64_t r = first_mismatch(all, me, 1); r >= 0) {
    TORCH_CHECK_VALUE(false, "torch_shard.shard: the tensor on rank ", me,
                      " has a different size or dtype than on rank ", r,
                      "; every rank must pass a tensor of the same size and dtype");
  }
  if (const int64_t r = first_mismatch(all, me, 2); r >= 0) {
    TORCH_CHECK_VALUE(false, "sharding_spec on rank: ", me, " does not match with sharding_spec on rank: ", r,
                      " (their layouts differ: boxes or placements)");
  }
}

} // namespace

namespace ops {

at::Tensor shard(const std::optional<at::Tensor>& tensor, int64_t src, c10::IntArrayRef global_size,
                 c10::ScalarType dtype, std::optional<int64_t> chunk_dim,
                 const std::optional<at::Tensor>& shard_offsets, const std::optional<at::Tensor>& shard_sizes,
                 const std::optional<at::Tensor>& placement_index, std::vector<std::string> placements,
                 c10::IntArrayRef placement_owners, bool requires_grad, c10::string_view group_name) {
  check_not_tracing("shard", kCommunicates);
  // The kernel writes shards and `out` in place; a direct call with tensors that require grad must not
  // record it.
  at::NoGradGuard no_grad;
  const std::string group(group_name);
  auto pg = comm::resolve_group(group, "shard");
  const int64_t me = pg->getRank();
  const int64_t world = pg->getSize();
  // Follows the tensors this rank moves (the source, on the source rank; its new shards).
  c10::Device device = comm::comm_device(*pg, me == src && tensor.has_value() && tensor->defined()
                                                  ? std::optional<c10::Device>(tensor->device())
                                                  : std::nullopt);
  std::shared_ptr<const Layout> target;
  std::shared_ptr<const Layout> source;
  std::shared_ptr<const layout::TransferPlan> plan;
  LocalTensors src_local, out;
  comm::Moves moves;
  Values mine{};
  std::exception_ptr error;
  try {
    TORCH_CHECK_INDEX(src >= 0 && src < world, "torch_shard.shard: src_rank ", src,
                      " is not a rank of a group of size ", world);
    target = layout_from_args(global_size, chunk_dim, shard_offsets, shard_sizes, placement_index, placements,
                              placement_owners, world, /*validate=*/true, "shard");
    check_owned(*target, world, "shard");
    if (const auto mine = target->shards_of(me); !device.is_cuda() || (me != src && !mine.empty())) {
      const auto placed =
          mine.empty() ? std::nullopt : std::optional<c10::Device>(target->placement(mine.front()).device);
      if (placed.has_value() && placed->is_cuda()) {
        device = comm::comm_device(*pg, placed);
      }
    }
    if (me == src) {
      TORCH_CHECK_VALUE(tensor.has_value() && tensor->defined(),
                        "torch_shard.shard: the source rank must pass the tensor to shard");
      TORCH_CHECK_TYPE(!is_sharded_tensor(*tensor),
                       "torch_shard.shard: the tensor to shard is already a ShardedTensor");
      TORCH_CHECK_VALUE(tensor->sizes() == global_size, "torch_shard.shard: tensor of size ", tensor->sizes(),
                        " on the source rank, but the layout is for ", layout::dims_str(global_size.vec()));
      TORCH_CHECK_TYPE(tensor->scalar_type() == dtype, "torch_shard.shard: tensor has dtype ",
                       tensor->scalar_type(), ", expected ", dtype);
      src_local = LocalTensors{{*tensor}, {0}};
    }
    source = Layout::whole(global_size.vec(), src, device);
    plan = comm::cached_plan(source, target, me, world);
    out = comm::allocate_local(*target, me, dtype);
    moves = comm::transfer_moves(*plan, *source, src_local, *target, out, me, device, dtype);
    mine = {src, size_and_dtype_fp(global_size.vec(), dtype), static_cast<int64_t>(target->fingerprint()), 0};
  } catch (...) {
    error = std::current_exception();
  }
  comm::exchange(*pg, device, agreement(comm::OpKind::kShard, mine, error, check_shard), &moves);
  for (auto& t : out.tensors) {
    t.requires_grad_(requires_grad);
  }
  return make_sharded_tensor(target, std::move(out.tensors), std::move(out.indices), dtype, device,
                             /*pin_memory=*/false, group, me);
}

void gather(const at::Tensor& self, int64_t dst, const std::optional<at::Tensor>& out) {
  check_not_tracing("gather", kCommunicates);
  at::NoGradGuard no_grad;
  auto* impl = unsafe_get_sharded_impl(self, "gather");
  auto pg = comm::resolve_group(impl->group_name(), "gather");
  const int64_t me = pg->getRank();
  const int64_t world = pg->getSize();
  const c10::Device device = comm::comm_device(*pg, shards_device(*impl));
  const auto dtype = impl->dtype().toScalarType();
  const auto& source = impl->layout();
  std::shared_ptr<const Layout> target;
  std::shared_ptr<const layout::TransferPlan> plan;
  LocalTensors src_local, dst_local;
  comm::Moves moves;
  Values mine{};
  std::exception_ptr error;
  try {
    TORCH_CHECK_INDEX(dst >= 0 && dst < world, "torch_shard.gather: dst ", dst,
                      " is not a rank of a group of size ", world);
    const bool has_out = out.has_value() && out->defined();
    if (me == dst) {
      TORCH_CHECK_VALUE(has_out, "Argument ``dst_tensor`` must be specified on destination rank ", dst);
      TORCH_CHECK_TYPE(!is_sharded_tensor(*out), "torch_shard.gather: `out` must be a dense tensor");
      TORCH_CHECK_VALUE(out->sizes().vec() == impl->global_size(), "Argument ``dst_tensor`` have size ",
                        out->sizes(), ",but should be ", layout::dims_str(impl->global_size()));
      dst_local = LocalTensors{{*out}, {0}};
    } else {
      TORCH_CHECK_VALUE(!has_out, "Argument ``dst_tensor`` must NOT be specified on non-destination ranks.");
    }
    impl->check_local_shards("gather");
    check_owned(*source, world, "gather");
    src_local = LocalTensors{impl->local_shards(), impl->local_shard_indices()};
    target = Layout::whole(impl->global_size(), dst, has_out ? out->device() : device);
    plan = comm::cached_plan(source, target, me, world);
    moves = comm::transfer_moves(*plan, *source, src_local, *target, dst_local, me, device, dtype);
    mine = {dst, layout_and_dtype_fp(*source, dtype), 0, 0};
  } catch (...) {
    error = std::current_exception();
  }
  comm::exchange(*pg, device,
                 agreement(comm::OpKind::kGather, mine, error,
                           [](const std::vector<Values>& all, int64_t me) {
                             if (const int64_t r = first_mismatch(all, me, 0); r >= 0) {
                               TORCH_CHECK_VALUE(false, "dst=", all[me][0], " on rank: ", me,
                                                 " does not match with dst=", all[r][0], " on rank: ", r);
                             }
                             if (const int64_t r = first_mismatch(all, me, 1); r >= 0) {
                               TORCH_CHECK_VALUE(false, "torch_shard.gather: the layout on rank: ", me,
                                                 " does not match with the layout on rank: ", r,
                                                 " (size, dtype, boxes or placements differ)");
                             }
                           }),
                 &moves);
}

void reshard(const at::Tensor& self, std::optional<int64_t> chunk_dim,
             const std::optional<at::Tensor>& shard_offsets, const std::optional<at::Tensor>& shard_sizes,
             const std::optional<at::Tensor>& placement_index, std::vector<std::string> placements,
             c10::IntArrayRef placement_owners) {
  check_not_tracing("reshard", kCommunicates);
  at::NoGradGuard no_grad;
  auto* impl = unsafe_get_sharded_impl(self, "reshard");
  auto pg = comm::resolve_group(impl->group_name(), "reshard");
  const int64_t me = pg->getRank();
  const int64_t world = pg->getSize();
  const c10::Device device = comm::comm_device(*pg, shards_device(*impl));
  const auto dtype = impl->dtype().toScalarType();
  const auto source = impl->layout();
  std::shared_ptr<const Layout> target;
  std::shared_ptr<const layout::TransferPlan> plan;
  LocalTensors src_local, out;
  comm::Moves moves;
  Values mine{};
  bool unchanged = false;
  std::exception_ptr error;
  try {
    // Upstream keeps resharded metadata in rank order (stable for several shards per rank).
    target = layout_from_args(impl->global_size(), chunk_dim, shard_offsets, shard_sizes, placement_index,
                              placements, placement_owners, world,
                              /*validate=*/true, "reshard")
                 ->sorted_by_owner();
    check_owned(*target, world, "reshard");
    impl->check_local_shards("reshard");
    check_owned(*source, world, "reshard");
    // Same boxes, owners and device types, and this rank's shards already where the target puts them:
    // no data moves (the placements may still be written differently, e.g. "cpu" and "cpu:0").
    unchanged = target->same_as(*source);
    for (size_t k = 0; unchanged && k < impl->local_shards().size(); ++k) {
      const auto idx = static_cast<size_t>(impl->local_shard_indices()[k]);
      unchanged =
          layout::on_placement_device(impl->local_shards()[k].device(), target->placement(idx).device);
    }
    if (unchanged) {
      moves.send.resize(world);
      moves.recv.resize(world);
    } else {
      src_local = LocalTensors{impl->local_shards(), impl->local_shard_indices()};
      plan = comm::cached_plan(source, target, me, world);
      // A pinned tensor stays pinned (is_pinned() and the metadata keep telling the truth).
      out = comm::allocate_local(*target, me, dtype, impl->pin_memory());
      moves = comm::transfer_moves(*plan, *source, src_local, *target, out, me, device, dtype);
    }
    mine = {layout_and_dtype_fp(*source, dtype), static_cast<int64_t>(target->fingerprint()), 0, 0};
  } catch (...) {
    error = std::current_exception();
  }
  comm::exchange(*pg, device,
                 agreement(comm::OpKind::kReshard, mine, error,
                           [](const std::vector<Values>& all, int64_t me) {
                             if (const int64_t r = first_mismatch(all, me, 0); r >= 0) {
                               TORCH_CHECK_VALUE(false, "torch_shard.reshard: the layout on rank: ", me,
                                                 " does not match with the layout on rank: ", r,
                                                 " (size, dtype, boxes or placements differ)");
                             }
                             if (const int64_t r = first_mismatch(all, me, 1); r >= 0) {
                               TORCH_CHECK_VALUE(false, "sharding_spec on rank: ", me,
                                                 " does not match with sharding_spec on rank: ", r,
                                                 " (the target layouts differ: boxes or placements)");
                             }
                           }),
                 &moves);
  if (unchanged) {
    if (target.get() != source.get()) {
      // Keep the placements as this call wrote them (the layouts agree on everything else).
      impl->set_layout(target, impl->local_shards(), impl->local_shard_indices());
    }
    return;
  }
  const bool requires_grad = self.requires_grad();
  for (auto& t : out.tensors) {
    t.requires_grad_(requires_grad);
  }
  impl->set_layout(target, std::move(out.tensors), std::move(out.indices));
}

// The agreement of a scatter by a spec whose shard() is not torch_shard's (EnumerableShardingSpec,
// user specs): the same src rank, size, dtype and spec (a fingerprint of it) on every rank, before the
// spec's own shard() runs. Same op kind and values as `shard`, so a rank scattering by a chunk spec
// and a rank with another spec raise together.
void agree_shard(int64_t src, c10::IntArrayRef global_size, c10::ScalarType dtype, int64_t spec_fingerprint,
                 c10::string_view group_name) {
  check_not_tracing("_agree_shard", kCommunicates);
  auto pg = comm::resolve_group(std::string(group_name), "shard");
  std::exception_ptr error;
  try {
    TORCH_CHECK_INDEX(src >= 0 && src < pg->getSize(), "torch_shard.shard: src_rank ", src,
                      " is not a rank of a group of size ", pg->getSize());
  } catch (...) {
    error = std::current_exception();
  }
  comm::Moves moves;
  moves.send.resize(pg->getSize());
  moves.recv.resize(pg->getSize());
  const Values mine{src, size_and_dtype_fp(global_size.vec(), dtype), spec_fingerprint, 0};
  comm::exchange(*pg, comm::comm_device(*pg), agreement(comm::OpKind::kShard, mine, error, check_shard),
                 &moves);
}

// A rank whose Python-side preparation failed (a bad spec, an unknown placement) still takes part in
// the agreement round of the op its peers are running, so they raise too instead of waiting for it.
// It returns normally on this rank, whatever the others did: the caller then raises its own error.
void abort_op(c10::string_view op, c10::string_view error_class, c10::string_view group_name,
              c10::string_view message) {
  check_not_tracing("_abort", kCommunicates);
  const std::optional<comm::OpKind> kind = comm::op_from_name(std::string(op));
  // The class's code in the one table (comm::error_class_names); any other class reports kOther.
  comm::ErrorCode code = comm::ErrorCode::kOther;
  const auto names = comm::error_class_names();
  for (size_t k = 0; k < names.size(); ++k) {
    if (error_class == names[k] && static_cast<comm::ErrorCode>(k + 1) != comm::ErrorCode::kLost) {
      code = static_cast<comm::ErrorCode>(k + 1);
      break;
    }
  }
  struct AbortedHere : std::exception {};
  auto pg = comm::resolve_group(std::string(group_name), "_abort");
  // An unknown op still takes part (round 1 has the same shape for every op), so the peers, whatever
  // they run, raise too; this rank then raises that its own call was wrong.
  std::string reason = message.empty() ? std::string(error_class) : std::string(message);
  if (!kind.has_value()) {
    code = comm::ErrorCode::kValueError;
    reason = "ValueError: torch_shard._abort: unknown op '" + std::string(op) + "'";
  }
  comm::Agreement failed =
      agreement(kind.value_or(comm::OpKind::kCompare), Values{}, std::make_exception_ptr(AbortedHere{}),
                [](const std::vector<Values>&, int64_t) {});
  failed.error_code = code;
  // What the other ranks are told (NOTE [ Reasons travel ]): the Python exception in words.
  failed.reason = reason;
  try {
    comm::exchange(*pg, comm::comm_device(*pg), failed, nullptr);
  } catch (const AbortedHere&) {
    // Expected: the exchange rethrows this rank's own failure once every rank knows of it.
  }
  TORCH_CHECK_VALUE(kind.has_value(), "torch_shard._abort: unknown op '", op, "'");
}

std::vector<std::string> error_classes() {
  return comm::error_class_names();
}

} // namespace ops

TORCH_LIBRARY_IMPL(torch_shard, CompositeImplicitAutograd, m) {
  m.impl("shard", TORCH_FN(ops::shard));
  m.impl("gather", TORCH_FN(ops::gather));
  m.impl("reshard", TORCH_FN(ops::reshard));
  m.impl("_abort", TORCH_FN(ops::abort_op));
  m.impl("_agree_shard", TORCH_FN(ops::agree_shard));
  m.impl("_error_classes", TORCH_FN(ops::error_classes));
}

} // namespace torch_shard
