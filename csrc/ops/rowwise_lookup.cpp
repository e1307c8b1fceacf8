// A row-wise sharded lookup (F.embedding, F.embedding_bag sum / mean / max) as ONE C++ call per forward
// and one per backward.
//
// NOTE [ A row-wise lookup in one call ]
// torch_shard._rowwise_lookup does, for one rank, everything between its Python argument checks and its
// result (the protocol: NOTE [ Ids only to their owners ] in ops/routing.h):
//   1. this rank's request: the checks of its arguments (shapes, devices, the weight shard against its
//      block: a failure is this rank's and goes into the agreement, so every rank raises), its input's
//      value checks on its device (NOTE [ Input checks on the device ]) and its ids bucketed by owner
//      (NOTE [ Requester-side routing in one op ]);
//   2. the agreement (NOTE [ Shared inputs ]): every rank's failures, layout and arguments, and the word
//      each rank tells each owner (how many of its ids the owner holds, and its bags); the only host
//      read of device memory in the forward;
//   3. one all-to-all carries each owner its ids (and, for sum and mean, their per-bag lengths), one
//      more the per-sample weights when given;
//   4. the owner looks every requester's ids up in ONE kernel (ATen's embedding, or _embedding_bag in
//      sum mode), never on an empty shard or with no ids (NOTE [ Empty shards reach no embedding
//      kernel ]);
//   5. one all-to-all returns each requester its rows (embedding, max) or its bags' partial sums, which
//      it puts in place (embedding), pools with ATen's max kernel (max: NOTE [ Max pools on the
//      requester ] in ops/rowwise_max.cpp), or adds up and divides (sum, mean).
// It returns the result and what the backward needs (`saved`). _rowwise_lookup_backward agrees too (a
// bad call on one rank raises on every rank), sends the output's gradient to the owners (the reverse of
// 5) and runs the lookup kernel's backward there. Autograd connects them
// (torch_shard/_support/_op_registrations.py). One rank: no all-to-all at all. max_norm is an op of its
// own that runs first (ops/renorm.cpp), as dense F.embedding calls embedding_renorm_ first.

#include "ops/rowwise_lookup.h"

#include <exception>
#include <optional>
#include <vector>

#include <ATen/TensorOperators.h>
#include <ATen/ops/_embedding_bag.h>
#include <ATen/ops/_embedding_bag_backward.h>
#include <ATen/ops/_embedding_bag_forward_only.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/embedding.h>
#include <ATen/ops/embedding_dense_backward.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/tensor.h>
#include <ATen/ops/zeros.h>
#include <c10/util/Exception.h>

#include "layout/layout.h"
#include "ops/agreement.h"
#include "ops/collectives.h"
#include "ops/lookup_checks.h"
#include "ops/lookup_common.h"
#include "ops/routing.h"
#include "ops/rowwise_max.h"
#include "ops/shared_inputs.h"

namespace torch_shard {
namespace ops {

namespace {

constexpr const char* kRowLookup = "torch_shard._rowwise_lookup";
constexpr const char* kRowBackward = "torch_shard._rowwise_lookup_backward";

// Whether owners pool bags (sum, mean: their per-bag lengths travel with the ids) or send rows back
// (embedding, and max: NOTE [ Max pools on the requester ]).
bool owners_pool(LookupMode mode) {
  return mode == LookupMode::kSum || mode == LookupMode::kMean;
}

// Step 1's result: what this rank brings to the lookup.
struct RowRequest {
  CheckedInput checked;              // the mode, the input as given and its device-side status
  at::Tensor ids;                    // the ids that belong to a bag (all of them for embedding)
  std::optional<at::Tensor> offsets; // bags: their starts
  std::optional<at::Tensor> weights; // per-sample weights of `ids`
  int64_t num_bags = 0;
  int64_t row_start = 0; // this rank's first row
  int64_t local_pad = -1;
  Bucketed bucketed;
  int64_t fingerprint = 0; // the table (table_fingerprint)
  LookupMode mode() const { return checked.mode; }
};

RowRequest prepare_rows(c10d::ProcessGroup& pg, const LookupCall& call) {
  const int64_t me = pg.getRank();
  const Blocks rows =
      checked_blocks(kRowLookup, call.block_starts, call.block_sizes, pg.getSize(), call.num_embeddings);
  RowRequest req;
  req.checked = check_input(kRowLookup, call);
  TORCH_CHECK_VALUE(call.local.size(0) == rows.sizes[me], kRowLookup, ": the weight shard of rank ", me,
                    " must have its block's ", rows.sizes[me], " rows, got shape ", call.local.sizes());
  req.row_start = rows.sizes[me] > 0 ? rows.starts[me] : 0;
  req.local_pad = call.padding_idx >= req.row_start && call.padding_idx < req.row_start + rows.sizes[me]
                      ? call.padding_idx - req.row_start
                      : -1;
  const LookupInput& input = req.checked.input;
  // The composition routes a 2-D input's bags by their rows (bucket_ids); the CPU loops and max's
  // pooling take offsets.
  const bool fixed = owners_pool(req.mode()) && input.fixed() && !loops_for(input.ids);
  if (is_bags(req.mode())) {
    req.num_bags = bag_count(input);
    if (!fixed) {
      req.offsets = bag_offsets(input);
    }
  }
  // Ids that belong to no bag (there are no bags) go nowhere.
  const bool nowhere = is_bags(req.mode()) && req.num_bags == 0;
  req.ids = nowhere ? input.ids.narrow(0, 0, 0) : input.ids;
  if (call.per_sample_weights.has_value()) {
    req.weights = nowhere ? call.per_sample_weights->narrow(0, 0, 0) : *call.per_sample_weights;
  }
  // A word holds a count below 2**32 and a bag count below 2**31.
  constexpr int64_t kLimit = int64_t{1} << 31;
  TORCH_CHECK_VALUE(req.ids.numel() < kLimit && req.num_bags < kLimit, kRowLookup,
                    ": a row-wise sharded lookup takes fewer than 2**31 ids and 2**31 bags per rank, got ",
                    req.ids.numel(), " ids and ", req.num_bags, " bags");
  const RoutedBags bags = !owners_pool(req.mode()) ? RoutedBags{}
                          : fixed                  ? RoutedBags{std::nullopt, req.num_bags, input.bag_length}
                                                   : RoutedBags{req.offsets, req.num_bags, -1};
  req.bucketed = bucket_ids(req.ids, bags, rows, index_dtype(call.num_embeddings), call.padding_idx,
                            req.mode() == LookupMode::kMean, call.num_embeddings);
  // The routing counted the ids outside the table, unless it saw none of them (no bags to put them in).
  req.checked.status = input_status(req.checked.input, nowhere ? at::Tensor() : req.bucketed.outside);
  req.fingerprint = table_fingerprint(call.fingerprint, call.num_embeddings, /*dim=*/0, call.local, rows);
  return req;
}

// Step 2: every rank's failures and arguments, and the words. Raises on every rank unless all agree.
Routes agree(c10d::ProcessGroup& pg, const RowRequest& req, std::exception_ptr error, const at::Tensor& local,
             c10::ArrayRef<double> arguments, int64_t padding_idx) {
  const std::vector<double> agreed = agreed_arguments(
      LookupOp::kRowwise, arguments, {static_cast<double>(req.mode()), static_cast<double>(padding_idx)});
  ShareRequest request = agreement_request(req.checked, req.fingerprint, agreed, local.device(), error);
  request.flags = req.weights.has_value() ? 1 : 0;
  if (!error) {
    request.words = req.bucketed.words;
  }
  const Shared shared = share_inputs(pg, request);
  return routes_from(shared.words_in, shared.words_out, owners_pool(req.mode()), req.num_bags);
}

// Step 3's result: what this rank received as an owner.
struct Received {
  at::Tensor ids;                    // every requester's ids here, less this rank's first row
  at::Tensor offsets;                // bags: their offsets into `ids`
  std::optional<at::Tensor> weights; // their per-sample weights
};

Received send_ids(c10d::ProcessGroup& pg, const RowRequest& req, const Routes& routes) {
  const at::Tensor received =
      move_rows(pg, send_buffer(req.bucketed, routes), routes.send_sizes(), routes.recv_sizes());
  Received got;
  std::tie(got.ids, got.offsets) = unpack_received(received, routes, req.row_start, loops_for(received));
  if (req.weights.has_value()) {
    got.weights =
        move_rows(pg, req.weights->index_select(0, req.bucketed.perm), routes.counts_out, routes.counts_in);
  }
  return got;
}

// Steps 4 and 5 for F.embedding and max: the rows of this rank's ids, in owner order.
at::Tensor rows_back(c10d::ProcessGroup& pg, const at::Tensor& local, const RowRequest& req,
                     const Routes& routes, const Received& got) {
  const int64_t owned = checked_total(routes.counts_in);
  const bool lookup = owned > 0 && local.numel() > 0;
  const at::Tensor found = lookup ? at::embedding(local, got.ids, req.local_pad)
                                  : at::zeros({owned, local.size(1)}, local.options());
  return move_rows(pg, found, routes.counts_in, routes.counts_out);
}

// Steps 4 and 5 for sum and mean: each owner pools its part of every requester's bags; each requester
// adds up the parts from the owners it sent ids to (NOTE [ Idle owners ]).
at::Tensor pooled_back(c10d::ProcessGroup& pg, const at::Tensor& local, const RowRequest& req,
                       const Routes& routes, const Received& got, bool needs_grad,
                       std::vector<at::Tensor>& saved) {
  const int64_t dim = local.size(1), num_bags = req.num_bags;
  const bool lookup = checked_total(routes.counts_in) > 0 && local.numel() > 0;
  at::Tensor pooled;
  if (!lookup) {
    pooled = at::zeros({checked_total(routes.bags_in), dim}, local.options());
  } else if (needs_grad) {
    auto [result, offset2bag, bag_size, max_indices] =
        at::_embedding_bag(local, got.ids, got.offsets, /*scale_grad_by_freq=*/false,
                           aten_bag_mode(LookupMode::kSum), /*sparse=*/false, got.weights,
                           /*include_last_offset=*/false, req.local_pad);
    pooled = result;
    saved[kRowOffset2bag] = offset2bag;
    saved[kRowBagSize] = bag_size;
    saved[kRowMaxIndices] = max_indices;
  } else {
    pooled = std::get<0>(at::_embedding_bag_forward_only(local, got.ids, got.offsets, false,
                                                         aten_bag_mode(LookupMode::kSum), false, got.weights,
                                                         false, req.local_pad));
  }
  const at::Tensor back = move_rows(pg, pooled, routes.bags_in, routes.back_rows());
  const int64_t senders = routes.senders();
  at::Tensor out = senders == 0   ? at::zeros({num_bags, dim}, local.options())
                   : senders == 1 ? back.view({num_bags, dim})
                                  : back.view({senders, num_bags, dim}).sum(0);
  if (req.mode() == LookupMode::kMean && num_bags) {
    // In the result's dtype once, for the forward and (saved) the backward alike.
    const at::Tensor divisors = req.bucketed.divisors.to(out.scalar_type());
    out = out / divisors.unsqueeze(1);
    if (needs_grad) {
      saved[kRowDivisors] = divisors;
    }
  }
  return out;
}

std::vector<int64_t> saved_counts(const RowRequest& req, const at::Tensor& local, const Routes& routes) {
  std::vector<int64_t> counts{local.size(0), req.row_start, routes.num_bags};
  counts.insert(counts.end(), routes.counts_in.begin(), routes.counts_in.end());
  counts.insert(counts.end(), routes.counts_out.begin(), routes.counts_out.end());
  counts.insert(counts.end(), routes.bags_in.begin(), routes.bags_in.end());
  return counts;
}

} // namespace

LookupResult rowwise_lookup(const LookupCall& call) {
  const auto pg = lookup_group(call.group_name, "_rowwise_lookup");
  const at::Tensor &local = call.local, &ids = call.ids;
  const int64_t padding_idx = call.padding_idx;
  const bool needs_grad = call.needs_grad;
  // 1. This rank's request (a failure here is reported in the agreement).
  RowRequest req;
  const std::exception_ptr error = prepared(req, [&] { return prepare_rows(*pg, call); });
  // 2. The agreement, with the words.
  const Routes routes = agree(*pg, req, error, local, call.arguments, padding_idx);
  // 3. Each owner its ids (with their lengths), then their per-sample weights.
  const Received got = send_ids(*pg, req, routes);
  // 4 and 5. One lookup kernel over every requester's ids here; each requester its results.
  std::vector<at::Tensor> saved(kRowNumSaved);
  for (auto& t : saved) {
    t = at::empty({0}, ids.options().dtype(at::kLong));
  }
  at::Tensor out;
  if (req.mode() == LookupMode::kEmbedding) {
    // perm is a permutation: every row is written.
    out = at::empty({req.ids.numel(), local.size(1)}, local.options())
              .index_copy_(0, req.bucketed.perm, rows_back(*pg, local, req, routes, got));
  } else if (req.mode() == LookupMode::kMax) {
    out = max_of_rows(rows_back(*pg, local, req, routes, got), req.ids, *req.offsets, req.bucketed.perm,
                      padding_idx, needs_grad, saved);
  } else {
    out = pooled_back(*pg, local, req, routes, got, needs_grad, saved);
  }
  if (needs_grad) {
    saved[kRowIds] = got.ids;
    if (got.offsets.defined()) {
      saved[kRowOffsets] = got.offsets;
    }
    if (got.weights.has_value()) {
      saved[kRowWeights] = *got.weights;
    }
    if (req.mode() != LookupMode::kMax) { // max saved its ids' rows among those sent back
      saved[kRowPerm] = req.bucketed.perm;
    }
  }
  saved[kRowCounts] = at::tensor(saved_counts(req, local, routes), at::TensorOptions().dtype(at::kLong));
  return {out, saved};
}

at::Tensor rowwise_lookup_backward(const at::Tensor& grad, at::TensorList saved, int64_t padding_idx,
                                   c10::string_view mode_name, c10::string_view group_name) {
  const auto pg = lookup_group(group_name, "_rowwise_lookup_backward");
  const int64_t world = pg->getSize();
  // 1. This rank's checks (a failure here is reported in the agreement).
  LookupMode mode = LookupMode::kEmbedding;
  Routes routes;
  int64_t rows = 0, row_start = 0;
  at::Tensor max_rows_grad; // max: the requester's part, before the agreement (it checks saved winners)
  std::exception_ptr error;
  try {
    const BackwardHead head =
        backward_head(kRowBackward, mode_name, grad, saved, kRowNumSaved, kRowCounts, 3 + 3 * world);
    mode = head.mode;
    const int64_t* c = head.counts.data();
    rows = c[0];
    row_start = c[1];
    TORCH_CHECK_VALUE(rows >= 0 && row_start >= 0, kRowBackward, ": malformed counts");
    routes.bags = owners_pool(mode);
    routes.num_bags = c[2];
    c += 3;
    routes.counts_in.assign(c, c + world);
    routes.counts_out.assign(c + world, c + 2 * world);
    routes.bags_in.assign(c + 2 * world, c + 3 * world);
    TORCH_CHECK_VALUE(saved[kRowIds].numel() == checked_total(routes.counts_in), kRowBackward,
                      ": saved ids do not match the counts");
    if (mode == LookupMode::kEmbedding) {
      TORCH_CHECK_VALUE(grad.size(0) == saved[kRowPerm].numel() &&
                            checked_total(routes.counts_out) == saved[kRowPerm].numel(),
                        kRowBackward, ": grad must have one row per id");
    } else {
      TORCH_CHECK_VALUE(grad.size(0) == routes.num_bags, kRowBackward, ": grad must have one row per bag (",
                        routes.num_bags, "), got ", grad.sizes());
    }
    if (owners_pool(mode)) {
      TORCH_CHECK_VALUE(saved[kRowOffsets].numel() == checked_total(routes.bags_in) &&
                            saved[kRowOffsets].scalar_type() == saved[kRowIds].scalar_type(),
                        kRowBackward, ": saved offsets do not match the counts");
    }
    if (mode == LookupMode::kMax && checked_total(routes.counts_out) > 0 && grad.size(1) > 0) {
      TORCH_CHECK_VALUE(
          saved[kRowPerm].numel() == checked_total(routes.counts_out) &&
              saved[kRowPerm].scalar_type() == at::kLong && saved[kRowOffsets].numel() == routes.num_bags &&
              saved[kRowMaxIndices].sizes() == grad.sizes() &&
              saved[kRowMaxIndices].scalar_type() == at::kLong &&
              saved[kRowBagSize].numel() == routes.num_bags && saved[kRowBagSize].scalar_type() == at::kLong,
          kRowBackward, ": saved positions do not match the counts and grad");
    }
    if (mode == LookupMode::kMean && routes.num_bags) {
      TORCH_CHECK_VALUE(saved[kRowDivisors].numel() == routes.num_bags &&
                            saved[kRowDivisors].scalar_type() == grad.scalar_type(),
                        kRowBackward, ": saved divisors do not match the bags and grad");
    }
    if (mode == LookupMode::kMax) {
      max_rows_grad = max_rows_backward(grad, saved, checked_total(routes.counts_out), padding_idx);
    }
  } catch (...) {
    error = std::current_exception();
  }
  // 2. The agreement: every rank's checks, and the gradient's columns and dtype (the bytes that move).
  agree_backward(*pg, LookupOp::kRowwiseBackward, mode, grad, error);
  // 3. The output's gradient to the owners (the reverse of the forward's step 5), 4. the kernel's backward.
  const int64_t dim = grad.size(1);
  const at::Tensor& ids = saved[kRowIds];
  const int64_t local_pad =
      padding_idx >= row_start && padding_idx < row_start + rows ? padding_idx - row_start : -1;
  const bool lookup = ids.numel() > 0 && rows > 0 && dim > 0;
  if (!owners_pool(mode)) {
    // The gradient of the rows sent back, in owner order, back to their owners.
    const at::Tensor rows_grad =
        mode == LookupMode::kEmbedding ? grad.index_select(0, saved[kRowPerm]) : max_rows_grad;
    const at::Tensor got = move_rows(*pg, rows_grad, routes.counts_out, routes.counts_in);
    return lookup ? at::embedding_dense_backward(got, ids, rows, local_pad, /*scale_grad_by_freq=*/false)
                  : at::zeros({rows, dim}, grad.options());
  }
  const at::Tensor g =
      mode == LookupMode::kMean && routes.num_bags ? grad / saved[kRowDivisors].unsqueeze(1) : grad;
  // Every owner this rank sent ids to gets its bags' gradient (NOTE [ Idle owners ]).
  const int64_t senders = routes.senders();
  const at::Tensor spread = senders > 1 ? at::cat(std::vector<at::Tensor>(senders, g)) : g;
  const at::Tensor got =
      move_rows(*pg, senders ? spread : g.narrow(0, 0, 0), routes.back_rows(), routes.bags_in);
  if (!lookup) {
    return at::zeros({rows, dim}, grad.options());
  }
  const at::Tensor& weights = saved[kRowWeights];
  // _embedding_bag_backward, not the dense one: in sum mode the CPU forward may leave offset2bag empty,
  // and this one rebuilds it from the offsets.
  return at::_embedding_bag_backward(
      got.contiguous(), ids, saved[kRowOffsets], saved[kRowOffset2bag], saved[kRowBagSize],
      saved[kRowMaxIndices], rows, /*scale_grad_by_freq=*/false, aten_bag_mode(LookupMode::kSum),
      /*sparse=*/false, weights.numel() ? std::optional<at::Tensor>(weights) : std::nullopt, local_pad);
}

} // namespace ops
} // namespace torch_shard
