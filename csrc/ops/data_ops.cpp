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
using ops::DataOpCall;
using ops::kCommunicates;
using ops::raise_first_mismatch;
using ops::raise_if_argument_differs;

// What every rank must agree on about a tensor besides its layout.
int64_t size_and_dtype_fp(const layout::Dims& size, c10::ScalarType dtype) {
  return Fingerprint().add(size).add(static_cast<int64_t>(dtype)).as_int64();
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
  raise_if_argument_differs(all, me, 0, "src_rank");
  raise_first_mismatch(
      all, me,
      {{1, "torch_shard.shard: the tensor on rank ", " has a different size or dtype than on rank ",
        "; every rank must pass a tensor of the same size and dtype"},
       {2, "sharding_spec on rank: ", " does not match with sharding_spec on rank: ",
        " (their layouts differ: boxes or placements)"}});
}

// The agreement of a gather: the same destination rank, and the same layout and dtype everywhere.
void check_gather(const std::vector<Values>& all, int64_t me) {
  raise_if_argument_differs(all, me, 0, "dst");
  raise_first_mismatch(
      all, me,
      {{1, "torch_shard.gather: the layout on rank: ", " does not match with the layout on rank: ",
        " (size, dtype, boxes or placements differ)"}});
}

// The agreement of a reshard: the same layout and dtype, and the same target layout, everywhere.
void check_reshard(const std::vector<Values>& all, int64_t me) {
  raise_first_mismatch(
      all, me,
      {{0, "torch_shard.reshard: the layout on rank: ", " does not match with the layout on rank: ",
        " (size, dtype, boxes or placements differ)"},
       {1, "sharding_spec on rank: ", " does not match with sharding_spec on rank: ",
        " (the target layouts differ: boxes or placements)"}});
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
  DataOpCall call(group, "shard");
  const int64_t me = call.me;
  // Follows the tensors this rank moves (the source, on the source rank; its new shards).
  if (me == src && tensor.has_value() && tensor->defined()) {
    call.device = comm::comm_device(*call.pg, tensor->device());
  }
  call.prepare([&] {
    TORCH_CHECK_INDEX(src >= 0 && src < call.world, "torch_shard.shard: src_rank ", src,
                      " is not a rank of a group of size ", call.world);
    call.target = layout_from_args(global_size, chunk_dim, shard_offsets, shard_sizes, placement_index,
                                   placements, placement_owners, call.world, /*validate=*/true, "shard");
    check_owned(*call.target, call.world, "shard");
    if (const auto mine = call.target->shards_of(me);
        !call.device.is_cuda() || (me != src && !mine.empty())) {
      const auto placed = mine.empty()
                              ? std::nullopt
                              : std::optional<c10::Device>(call.target->placement(mine.front()).device);
      if (placed.has_value() && placed->is_cuda()) {
        call.device = comm::comm_device(*call.pg, placed);
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
      call.src_local = LocalTensors{{*tensor}, {0}};
    }
    call.source = Layout::whole(global_size.vec(), src, call.device);
    call.dst_local = comm::allocate_local(*call.target, me, dtype);
    call.plan_moves(dtype);
    return Values{src, size_and_dtype_fp(global_size.vec(), dtype),
                  static_cast<int64_t>(call.target->fingerprint()), 0};
  });
  call.exchange(comm::OpKind::kShard, check_shard);
  LocalTensors& out = call.dst_local;
  for (auto& t : out.tensors) {
    t.requires_grad_(requires_grad);
  }
  return make_sharded_tensor(call.target, std::move(out.tensors), std::move(out.indices), dtype, call.device,
                             /*pin_memory=*/false, group, me);
}

void gather(const at::Tensor& self, int64_t dst, const std::optional<at::Tensor>& out) {
  check_not_tracing("gather", kCommunicates);
  at::NoGradGuard no_grad;
  auto* impl = unsafe_get_sharded_impl(self, "gather");
  DataOpCall call(*impl, "gather");
  call.prepare([&] {
    TORCH_CHECK_INDEX(dst >= 0 && dst < call.world, "torch_shard.gather: dst ", dst,
                      " is not a rank of a group of size ", call.world);
    const bool has_out = out.has_value() && out->defined();
    if (call.me == dst) {
      TORCH_CHECK_VALUE(has_out, "Argument ``dst_tensor`` must be specified on destination rank ", dst);
      TORCH_CHECK_TYPE(!is_sharded_tensor(*out), "torch_shard.gather: `out` must be a dense tensor");
      TORCH_CHECK_VALUE(out->sizes().vec() == impl->global_size(), "Argument ``dst_tensor`` have size ",
                        out->sizes(), ",but should be ", layout::dims_str(impl->global_size()));
      call.dst_local = LocalTensors{{*out}, {0}};
    } else {
      TORCH_CHECK_VALUE(!has_out, "Argument ``dst_tensor`` must NOT be specified on non-destination ranks.");
    }
    impl->check_local_shards("gather");
    check_owned(*call.source, call.world, "gather");
    call.src_local = LocalTensors{impl->local_shards(), impl->local_shard_indices()};
    call.target = Layout::whole(impl->global_size(), dst, has_out ? out->device() : call.device);
    const auto dtype = impl->dtype().toScalarType();
    call.plan_moves(dtype);
    return Values{dst, layout_and_dtype_fp(*call.source, dtype), 0, 0};
  });
  call.exchange(comm::OpKind::kGather, check_gather);
}

void reshard(const at::Tensor& self, std::optional<int64_t> chunk_dim,
             const std::optional<at::Tensor>& shard_offsets, const std::optional<at::Tensor>& shard_sizes,
             const std::optional<at::Tensor>& placement_index, std::vector<std::string> placements,
             c10::IntArrayRef placement_owners) {
  check_not_tracing("reshard", kCommunicates);
  at::NoGradGuard no_grad;
  auto* impl = unsafe_get_sharded_impl(self, "reshard");
  DataOpCall call(*impl, "reshard");
  bool unchanged = false;
  call.prepare([&] {
    // Upstream keeps resharded metadata in rank order (stable for several shards per rank).
    call.target = layout_from_args(impl->global_size(), chunk_dim, shard_offsets, shard_sizes,
                                   placement_index, placements, placement_owners, call.world,
                                   /*validate=*/true, "reshard")
                      ->sorted_by_owner();
    check_owned(*call.target, call.world, "reshard");
    impl->check_local_shards("reshard");
    check_owned(*call.source, call.world, "reshard");
    // Same boxes, owners and device types, and this rank's shards already where the target puts them:
    // no data moves (the placements may still be written differently, e.g. "cpu" and "cpu:0").
    unchanged = call.target->same_as(*call.source);
    for (size_t k = 0; unchanged && k < impl->local_shards().size(); ++k) {
      const auto idx = static_cast<size_t>(impl->local_shard_indices()[k]);
      unchanged =
          layout::on_placement_device(impl->local_shards()[k].device(), call.target->placement(idx).device);
    }
    const auto dtype = impl->dtype().toScalarType();
    if (!unchanged) {
      call.src_local = LocalTensors{impl->local_shards(), impl->local_shard_indices()};
      // A pinned tensor stays pinned (is_pinned() and the metadata keep telling the truth).
      call.dst_local = comm::allocate_local(*call.target, call.me, dtype, impl->pin_memory());
      call.plan_moves(dtype);
    }
    return Values{layout_and_dtype_fp(*call.source, dtype), static_cast<int64_t>(call.target->fingerprint()),
                  0, 0};
  });
  call.exchange(comm::OpKind::kReshard, check_reshard);
  if (unchanged) {
    if (call.target.get() != call.source.get()) {
      // Keep the placements as this call wrote them (the layouts agree on everything else).
      impl->set_layout(call.target, impl->local_shards(), impl->local_shard_indices());
    }
    return;
  }
  const bool requires_grad = self.requires_grad();
  LocalTensors& out = call.dst_local;
  for (auto& t : out.tensors) {
    t.requires_grad_(requires_grad);
  }
  impl->set_layout(call.target, std::move(out.tensors), std::move(out.indices));
}

// The agreement of a scatter by a spec whose shard() is not torch_shard's (EnumerableShardingSpec,
// user specs): the same src rank, size, dtype and spec (a fingerprint of it) on every rank, before the
// spec's own shard() runs. Same op kind and values as `shard`, so a rank scattering by a chunk spec
// and a rank with another spec raise together.
void agree_shard(int64_t src, c10::IntArrayRef global_size, c10::ScalarType dtype, int64_t spec_fingerprint,
                 c10::string_view group_name) {
  check_not_tracing("_agree_shard", kCommunicates);
  DataOpCall call(std::string(group_name), "shard");
  call.prepare([&] {
    TORCH_CHECK_INDEX(src >= 0 && src < call.world, "torch_shard.shard: src_rank ", src,
                      " is not a rank of a group of size ", call.world);
    return Values{src, size_and_dtype_fp(global_size.vec(), dtype), spec_fingerprint, 0};
  });
  call.exchange(comm::OpKind::kShard, check_shard);
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
} // namespace torch_shard
