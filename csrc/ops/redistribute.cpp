// The op _redistribute: local tensors moved from one layout to another in one exchange, where either
// layout may hold a box on several ranks (DTensor's Replicate() mesh dims). torch_shard.interop's
// redistribute (a DTensor to other placements) runs on it, forward and backward.
//
// NOTE [ Redistributing replicated layouts ]
// A DTensor layout is a box per mesh coordinate: Shard mesh dims split the tensor (as torch.chunk),
// Replicate mesh dims repeat a box on every rank along them. Moving from one such layout to another is
// the reshard engine's move (comm/transfer.h: every target shard receives the intersections of its box
// with the source boxes, in one exchange) with two differences:
//   * the source may hold a box on several ranks: for every target shard, one replica supplies it,
//     the target rank's own copy when it has one (NOTE [ Replicated source shards ], layout/plan.cpp),
//     so an element crosses the network once per target rank that lacks it, never more;
//   * the target may hold a box on several ranks: each receives its own copy.
// Neither layout is a ShardedTensor layout (overlapping boxes), so each is checked here: boxes in
// bounds (checked int64, NOTE [ Checked box arithmetic ]), any two either identical or disjoint, and
// the distinct boxes tiling the tensor. The ranks agree on both layouts and the dtype before any byte
// moves (one agreement, as every data op); a rank whose arguments fail its checks makes every rank
// raise.

#include "ops/redistribute.h"

#include <memory>
#include <string>
#include <vector>

#include <ATen/core/grad_mode.h>
#include <ATen/ops/empty.h>

#include "comm/exchange.h"
#include "comm/process_group.h"
#include "comm/transfer.h"
#include "layout/layout.h"
#include "ops/agreement.h"
#include "ops/layout_args.h"
#include "ops/untraceable.h"

namespace torch_shard {
namespace ops {
namespace {

constexpr const char* kRedistribute = "_redistribute";

void check_redistribute(const std::vector<comm::Values>& all, int64_t me) {
  raise_first_mismatch(
      all, me,
      {{0, "torch_shard.redistribute: the tensor on rank ", " does not match the tensor on rank ",
        " (global size, dtype, mesh or placements differ)"},
       {1, "torch_shard.redistribute: the target placements on rank ", " differ from those on rank "}});
}

} // namespace

std::vector<at::Tensor> redistribute(at::TensorList sources, const at::Tensor& like,
                                     c10::IntArrayRef global_size, const at::Tensor& src_offsets,
                                     const at::Tensor& src_sizes, c10::IntArrayRef src_owners,
                                     const at::Tensor& dst_offsets, const at::Tensor& dst_sizes,
                                     c10::IntArrayRef dst_owners, c10::string_view group_name) {
  check_not_tracing(kRedistribute, kCommunicates);
  // Autograd is torch_shard.interop's (its backward is this op with the layouts swapped).
  at::NoGradGuard no_grad;
  DataOpCall call(std::string(group_name), kRedistribute, like.device());
  const auto dtype = like.scalar_type();
  call.prepare([&] {
    call.source = replicated_layout(global_size, src_offsets, src_sizes, src_owners, call.world,
                                    like.device().type(), kRedistribute, "source");
    call.target = replicated_layout(global_size, dst_offsets, dst_sizes, dst_owners, call.world,
                                    like.device().type(), kRedistribute, "target");
    const int64_t me = call.me;
    const auto mine_src = call.source->shards_of(me);
    TORCH_CHECK_VALUE(mine_src.size() == sources.size(), "torch_shard.redistribute: rank ", me, " holds ",
                      mine_src.size(), " source boxes, but got ", sources.size(), " tensors");
    for (size_t k = 0; k < sources.size(); ++k) {
      const at::Tensor& t = sources[k];
      const auto& box = call.source->box(static_cast<size_t>(mine_src[k]));
      TORCH_CHECK_VALUE(t.sizes() == c10::IntArrayRef(box.sizes),
                        "torch_shard.redistribute: the local tensor ", k, " on rank ", me, " has size ",
                        t.sizes(), ", but its box ",
                        layout::describe_box(box, static_cast<size_t>(mine_src[k])), " needs ", box.sizes);
      TORCH_CHECK_TYPE(t.scalar_type() == dtype, "torch_shard.redistribute: the local tensor ", k,
                       " on rank ", me, " is ", t.scalar_type(), ", expected ", dtype);
      TORCH_CHECK_VALUE(t.device() == like.device(), "torch_shard.redistribute: the local tensor ", k,
                        " on rank ", me, " is on ", t.device(), ", expected ", like.device());
      call.src_local.tensors.push_back(t.contiguous());
      call.src_local.indices.push_back(mine_src[k]);
    }
    for (const int64_t i : call.target->shards_of(me)) {
      call.dst_local.tensors.push_back(
          at::empty(call.target->box(static_cast<size_t>(i)).sizes, like.options()));
      call.dst_local.indices.push_back(i);
    }
    call.plan_moves(dtype);
    return comm::Values{layout_and_dtype_fp(*call.source, dtype),
                        static_cast<int64_t>(call.target->fingerprint()), 0, 0};
  });
  call.exchange(comm::OpKind::kRedistribute, check_redistribute);
  return std::move(call.dst_local.tensors);
}

} // namespace ops
} // namespace torch_shard
