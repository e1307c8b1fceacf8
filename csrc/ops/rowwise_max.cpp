// Row-wise max over owners: see ops/rowwise_max.h.

#include "ops/rowwise_max.h"

#include <limits>
#include <tuple>

#include <ATen/TensorOperators.h>
#include <ATen/ops/_embedding_bag_forward_only.h>
#include <ATen/ops/arange.h>
#include <ATen/ops/full.h>
#include <ATen/ops/where.h>
#include <ATen/ops/zeros.h>

#include "ops/collectives.h"
#include "ops/lookup_common.h"
#include "ops/partial_pooling.h"
#include "ops/rowwise_lookup.h"

namespace torch_shard {
namespace ops {

namespace {

// Which kernel an owner pools with: _embedding_bag_partial's fused loops on the CPU, and its composition
// where padding_idx is among the owner's rows (it skips them); elsewhere ATen's max pooling over the
// rows gathered in the order received, whose winners are then positions (owner_max).
bool partial_kernel(const at::Tensor& local, int64_t local_pad) {
  return loops_for(local) || local_pad >= 0;
}

// The owner's partial max of every requester's bags and each element's winner: a position among `ids`
// (-1 for a bag it holds no id of), the first maximum of the bag among them (ATen keeps the first of
// equal maxima, as the dense op does). `ids` and `offsets` are int64.
std::tuple<at::Tensor, at::Tensor> owner_max(const at::Tensor& local, const at::Tensor& ids,
                                             const at::Tensor& offsets, int64_t local_pad, int64_t owned) {
  if (partial_kernel(local, local_pad)) {
    return embedding_bag_partial(local, ids, offsets, std::nullopt, /*row_start=*/0, "max", local_pad, owned);
  }
  const at::Tensor rows = local.index_select(0, ids);
  auto [pooled, offset2bag, bag_size, winner] = at::_embedding_bag_forward_only(
      rows, at::arange(ids.numel(), ids.options()), offsets, /*scale_grad_by_freq=*/false,
      aten_bag_mode(LookupMode::kMax), /*sparse=*/false, /*per_sample_weights=*/std::nullopt,
      /*include_last_offset=*/false, /*padding_idx=*/-1);
  return {pooled, winner.masked_fill_(bag_size.eq(0).unsqueeze(1), -1)};
}

} // namespace

// NOTE [ Max over owners ]
// Max mode: each owner pools the maximum of the ids it holds (owner_max), and reports, per output
// element, the POSITION of its winner among the ids it received (-1 for none).
// Both travel back (the positions as int32, relative to what that requester sent). The requester maps
// the positions back to its own ids (through its owner order, `perm`) and takes each element from ONE
// owner: among those holding the overall maximum, the one whose winner comes first in the bag, the
// dense op's choice (NOTE [ Max ties ] in ops/partial_pooling.cpp); 0 where no owner holds an id.
// `chosen` (saved) says which owner that was, so the backward sends each owner the gradient of exactly
// the elements it won.
at::Tensor max_over_owners(c10d::ProcessGroup& pg, const at::Tensor& local, const at::Tensor& local_ids,
                           const at::Tensor& local_offsets, const at::Tensor& perm, const Routes& routes,
                           int64_t local_pad, std::vector<at::Tensor>& saved) {
  const int64_t world = routes.world(), num_bags = routes.num_bags;
  const int64_t dim = local.size(1);
  const int64_t owned = checked_total(routes.counts_in), pooled_bags = checked_total(routes.bags_in);
  const auto long_options = local.options().dtype(at::kLong);
  // int64, as every kernel here and the backward's take them (ATen's winners then come in int64 too).
  const at::Tensor ids = local_ids.to(at::kLong), offsets = local_offsets.to(at::kLong);
  at::Tensor pooled, where;
  if (owned > 0 && local.numel() > 0) { // NOTE [ Empty shards reach no embedding kernel ]
    std::tie(pooled, where) = owner_max(local, ids, offsets, local_pad, owned);
  } else {
    pooled = at::zeros({pooled_bags, dim}, local.options());
    where = at::full({pooled_bags, dim}, -1, ids.options());
  }
  // Positions among the ids each requester sent here: less the ids of the requesters before it.
  std::vector<int64_t> firsts;
  firsts.reserve(static_cast<size_t>(pooled_bags));
  int64_t first = 0;
  for (int64_t r = 0; r < world; ++r) {
    firsts.insert(firsts.end(), static_cast<size_t>(routes.bags_in[r]), first);
    first += routes.counts_in[r];
  }
  const at::Tensor relative =
      (pooled_bags ? (where - to_device(firsts, local.device()).unsqueeze(1)).masked_fill_(where.lt(0), -1)
                   : where)
          .to(at::kInt);
  std::vector<int64_t> block_first; // where each owner that got ids starts among this rank's sorted ids
  int64_t at = 0;
  for (int64_t o = 0; o < world; ++o) {
    if (routes.counts_out[o] > 0) {
      block_first.push_back(at);
    }
    at += routes.counts_out[o];
  }
  const auto senders = static_cast<int64_t>(block_first.size());
  const at::Tensor values = move_rows(pg, pooled, routes.bags_in, routes.back_rows());
  const at::Tensor positions = move_rows(pg, relative, routes.bags_in, routes.back_rows());
  saved[kRowIds] = ids;
  saved[kRowOffsets] = offsets;
  saved[kRowMaxIndices] = where;
  if (senders == 0) {
    saved[kRowChosen] = at::zeros({num_bags, dim}, long_options);
    return at::zeros({num_bags, dim}, local.options());
  }
  // Each element from the owner holding the overall maximum whose winner comes first in the bag.
  const at::Tensor vals = values.view({senders, num_bags, dim});
  const at::Tensor pos = positions.view({senders, num_bags, dim});
  const at::Tensor none = pos.lt(0);
  // (the received values are this call's own: masked in place)
  const at::Tensor best = vals.masked_fill_(none, -std::numeric_limits<double>::infinity()).amax({0}, true);
  // Each winner's position in this rank's own order (clamped: an owner without one names a valid id).
  const at::Tensor in_order = pos + to_device(block_first, local.device(), at::kInt).view({-1, 1, 1});
  at::Tensor original = perm.index_select(0, in_order.clamp_min_(0).reshape({-1})).view(pos.sizes());
  original.masked_fill_(vals.ne(best) | none, std::numeric_limits<int64_t>::max());
  auto [winner, chosen] = original.min(0, /*keepdim=*/true);
  saved[kRowChosen] = chosen.squeeze(0);
  return best.squeeze(0).masked_fill_(winner.squeeze(0).eq(std::numeric_limits<int64_t>::max()), 0);
}

at::Tensor max_backward(c10d::ProcessGroup& pg, const at::Tensor& grad, at::TensorList saved,
                        const Routes& routes, int64_t rows, int64_t local_pad) {
  const int64_t dim = grad.size(1);
  // Each owner the gradient of the elements it won, zero elsewhere.
  const at::Tensor& chosen = saved[kRowChosen];
  const at::Tensor which = at::arange(routes.senders(), chosen.options()).view({-1, 1, 1});
  const at::Tensor spread = at::where(chosen.unsqueeze(0).eq(which), grad.unsqueeze(0), 0).reshape({-1, dim});
  const at::Tensor got = move_rows(pg, spread, routes.back_rows(), routes.bags_in);
  const int64_t owned = checked_total(routes.counts_in);
  if (owned == 0 || rows == 0 || dim == 0) { // NOTE [ Empty shards reach no embedding kernel ]
    return at::zeros({rows, dim}, grad.options());
  }
  return embedding_bag_partial_backward(got.contiguous(), saved[kRowIds], saved[kRowOffsets], std::nullopt,
                                        saved[kRowMaxIndices], /*row_start=*/0, rows, "max", local_pad,
                                        owned);
}

} // namespace ops
} // namespace torch_shard
