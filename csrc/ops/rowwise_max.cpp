// Row-wise max over owners: see ops/rowwise_max.h.

#include "ops/rowwise_max.h"

#include <limits>
#include <tuple>

#include <ATen/TensorOperators.h>
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

// NOTE [ Max over owners ]
// Max mode: each owner pools the maximum of the ids it holds with _embedding_bag_partial, which also
// reports, per output element, the POSITION of its winner among the ids it received (-1 for none).
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
  const at::Tensor ids = local_ids.to(at::kLong), offsets = local_offsets.to(at::kLong);
  at::Tensor pooled, where;
  if (owned > 0 && local.numel() > 0) { // NOTE [ Empty shards reach no embedding kernel ]
    std::tie(pooled, where) =
        embedding_bag_partial(local, ids, offsets, std::nullopt, /*row_start=*/0, "max", local_pad, owned);
  } else {
    pooled = at::zeros({pooled_bags, dim}, local.options());
    where = at::full({pooled_bags, dim}, -1, long_options);
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
      (pooled_bags ? at::where(where.ge(0), where - to_device(firsts, local.device()).unsqueeze(1), where)
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
  const at::Tensor vals = values.view({senders, num_bags, dim});
  const at::Tensor pos = positions.view({senders, num_bags, dim}).to(at::kLong);
  const at::Tensor held = pos.ge(0);
  const at::Tensor in_order = pos + to_device(block_first, local.device()).view({-1, 1, 1});
  const at::Tensor original =
      at::where(held, perm.index_select(0, at::where(held, in_order, 0).reshape({-1})).view_as(pos), -1);
  const at::Tensor best = at::where(held, vals, c10::Scalar(-std::numeric_limits<double>::infinity()))
                              .amax({0}, /*keepdim=*/true);
  const at::Tensor candidates =
      at::where(held & vals.eq(best), original, c10::Scalar(std::numeric_limits<int64_t>::max()));
  auto [winner, chosen] = candidates.min(0, /*keepdim=*/true);
  saved[kRowChosen] = chosen.squeeze(0);
  const at::Tensor out = vals.gather(0, chosen).squeeze(0);
  return at::where(winner.squeeze(0).eq(std::numeric_limits<int64_t>::max()), 0, out);
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
