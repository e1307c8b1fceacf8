// max_norm on a sharded weight, row- and column-wise: the op _embedding_renorm_.
//
// NOTE [ max_norm on a sharded weight ]
// Dense F.embedding / F.embedding_bag with max_norm first renormalise, in place and under no_grad, every
// row their input looks up whose norm exceeds max_norm (ATen's embedding_renorm_), then look up. The
// sharded ops do the same, in one call before the lookup, with the rows ANY rank looks up and each
// row's whole norm:
//   1. this rank's checks (a failure goes into the agreement), its ids' range check on their device
//      (NOTE [ Input checks on the device ]) and, row-wise, its ids bucketed by owner (NOTE [ Ids only
//      to their owners ], without bags);
//   2. the agreement (NOTE [ Shared inputs ]): failures, layout, max_norm and norm_type, the lookup's
//      arguments (so nothing is renormalised for a lookup the ranks disagree on); row-wise with the
//      words, column-wise sharing every rank's ids;
//   3. row-wise: one all-to-all takes each id to its owner, which renormalises its rows;
//   4. column-wise: each rank computes, for every looked-up row, its part of the norm over its columns,
//      and one all-reduce combines the parts.
// A norm is what torch.norm computes: a sum of |w|^p for a finite p (then the p-th root), the largest
// |w| for p = inf, the smallest for -inf, a count of non-zeros for p = 0; a row whose norm exceeds
// max_norm is scaled by max_norm / (norm + 1e-7), as embedding_renorm_ does. Both ways compute it here
// on every device rather than row-wise through ATen's embedding_renorm_: its CUDA kernel sums pow(w, p)
// without the absolute value for p other than 1 and 2 (negative parts for p = 3, NaN for p = 0.5), so
// on a GPU row- and column-wise sharding would disagree with each other, and both with the definition
// (and with the dense op on the CPU, which they match). Rows repeat among the ids; every copy gets the
// same scale, so writing them all equals writing one, and no unique (an output size the host would
// read from a GPU) is needed.
// Never on an empty shard or without ids (NOTE [ Empty shards reach no embedding kernel ]).

#include "ops/renorm.h"

#include <cmath>
#include <exception>
#include <string>
#include <vector>

#include <ATen/TensorOperators.h>
#include <ATen/core/grad_mode.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/full.h>
#include <ATen/ops/full_like.h>
#include <ATen/ops/where.h>
#include <c10/util/Exception.h>

#include "layout/layout.h"
#include "ops/agreement.h"
#include "ops/collectives.h"
#include "ops/lookup_checks.h"
#include "ops/lookup_common.h"
#include "ops/routing.h"
#include "ops/shared_inputs.h"

namespace torch_shard {
namespace ops {

namespace {

constexpr const char* kRenorm = "torch_shard._embedding_renorm_";

// Step 1's result.
struct RenormRequest {
  CheckedInput checked; // the ids and their range check's device-side status
  Blocks blocks;
  int64_t row_start = 0;
  Bucketed bucketed;             // row-wise
  std::vector<at::Tensor> parts; // column-wise: this rank's ids (index dtype)
  int64_t fingerprint = 0;
};

RenormRequest prepare_renorm(c10d::ProcessGroup& pg, const at::Tensor& local, const at::Tensor& ids,
                             int64_t dim, c10::IntArrayRef block_starts, c10::IntArrayRef block_sizes,
                             int64_t num_embeddings, double max_norm, int64_t fingerprint) {
  RenormRequest req;
  const int64_t me = pg.getRank();
  const std::optional<at::Tensor> none;
  req.checked =
      check_input(kRenorm, LookupCall{local, ids, none, none, block_starts, block_sizes, num_embeddings,
                                      /*padding_idx=*/-1, "embedding", false, fingerprint});
  TORCH_CHECK_INDEX(dim == 0 || dim == 1, kRenorm, ": the sharded dim must be 0 (rows) or 1 (columns), got ",
                    dim);
  TORCH_CHECK_VALUE(max_norm > 0, kRenorm, ": max_norm must be larger than zero, got ", max_norm);
  const int64_t dim_size = dim == 0 ? num_embeddings : checked_total(block_sizes);
  req.blocks = checked_blocks(kRenorm, block_starts, block_sizes, pg.getSize(), dim_size);
  TORCH_CHECK_VALUE(local.size(dim) == req.blocks.sizes[me] && (dim == 0 || local.size(0) == num_embeddings),
                    kRenorm, ": the weight shard of rank ", me, " must hold its block's ",
                    req.blocks.sizes[me], dim == 0 ? " rows" : " columns of every row", ", got shape ",
                    local.sizes());
  const c10::ScalarType index = index_dtype(num_embeddings);
  if (dim == 0) {
    req.row_start = req.blocks.sizes[me] > 0 ? req.blocks.starts[me] : 0;
    req.bucketed =
        bucket_ids(ids, RoutedBags{}, req.blocks, index, /*padding_idx=*/-1, /*mean=*/false, num_embeddings);
    req.checked.status = input_status(req.checked.input, req.bucketed.outside);
  } else {
    req.parts = {ids.to(index)};
    req.checked.status = input_status(req.checked.input);
  }
  req.fingerprint = table_fingerprint(fingerprint, num_embeddings, dim, local, req.blocks);
  return req;
}

// Each of `rows`' part of its norm over the columns `local` holds (all of them, row-wise).
at::Tensor norm_parts(const at::Tensor& local, const at::Tensor& rows, double p) {
  if (local.size(1) == 0) {
    // An empty block joins the combination with its identity.
    return at::full({rows.numel()}, std::isinf(p) && p < 0 ? INFINITY : 0.0,
                    local.options().dtype(at::kDouble));
  }
  const at::Tensor magnitudes = local.index_select(0, rows).abs().to(at::kDouble);
  if (std::isinf(p)) {
    return p > 0 ? magnitudes.amax(1) : magnitudes.amin(1);
  }
  if (p == 0) {
    return magnitudes.ne(0).sum(1, /*keepdim=*/false, at::kDouble);
  }
  return magnitudes.pow(p).sum(1);
}

// Scales the rows of `local` whose whole norm (combined from the parts) exceeds max_norm.
void scale_rows(const at::Tensor& local, const at::Tensor& rows, const at::Tensor& combined, double max_norm,
                double p) {
  const at::Tensor norms = std::isinf(p) || p == 0 ? combined : combined.pow(1.0 / p);
  const at::Tensor scale = at::where(norms > max_norm, at::full_like(norms, max_norm) / (norms + 1e-7), 1.0);
  local.index_copy_(0, rows, local.index_select(0, rows) * scale.unsqueeze(1).to(local.scalar_type()));
}

// Step 4: the column-wise renormalisation of `rows` (every rank's ids, repeats included).
void renorm_columns(c10d::ProcessGroup& pg, const at::Tensor& local, const at::Tensor& rows, double max_norm,
                    double p) {
  const auto op = std::isinf(p) ? (p > 0 ? c10d::ReduceOp::MAX : c10d::ReduceOp::MIN) : c10d::ReduceOp::SUM;
  const at::Tensor combined = all_reduce(pg, norm_parts(local, rows, p), op);
  if (local.numel() > 0) {
    scale_rows(local, rows, combined, max_norm, p);
  }
}

} // namespace

void embedding_renorm(const at::Tensor& local, const at::Tensor& ids, int64_t dim,
                      c10::IntArrayRef block_starts, c10::IntArrayRef block_sizes, int64_t num_embeddings,
                      double max_norm, double norm_type, int64_t fingerprint, c10::ArrayRef<double> arguments,
                      c10::string_view group_name) {
  const auto pg = lookup_group(group_name, "_embedding_renorm_");
  // In place on a leaf that may require grad, as F.embedding's embedding_renorm_ under no_grad.
  at::NoGradGuard no_grad;
  // 1. This rank's request (a failure here is reported in the agreement).
  RenormRequest req;
  const std::exception_ptr error = prepared(req, [&] {
    return prepare_renorm(*pg, local, ids, dim, block_starts, block_sizes, num_embeddings, max_norm,
                          fingerprint);
  });
  // 2. The agreement: row-wise with the words, column-wise sharing every rank's ids.
  const std::vector<double> agreed =
      agreed_arguments(LookupOp::kRenorm, arguments, {static_cast<double>(dim), max_norm, norm_type});
  ShareRequest request = agreement_request(req.checked, req.fingerprint, agreed, local.device(), error);
  request.parts = req.parts;
  if (!error && dim == 0) {
    request.words = req.bucketed.words;
  }
  const Shared shared = share_inputs(*pg, request);
  if (dim == 0) {
    // 3. Each id to its owner, which renormalises its rows.
    const Routes routes = routes_from(shared.words_in, shared.words_out, /*bags=*/false, 0);
    const at::Tensor received =
        move_rows(*pg, send_buffer(req.bucketed, routes), routes.send_sizes(), routes.recv_sizes());
    if (received.numel() > 0 && local.numel() > 0) {
      const at::Tensor rows =
          unpack_received(received, routes, req.row_start, loops_for(received)).first.to(at::kLong);
      scale_rows(local, rows, norm_parts(local, rows, norm_type), max_norm, norm_type);
    }
    return;
  }
  // 4. Every rank's ids; each row's norm over every rank's columns.
  const at::Tensor rows = (shared.parts.size() == 1 ? shared.parts[0] : at::cat(shared.parts)).to(at::kLong);
  if (rows.numel() > 0) { // the same on every rank: every rank holds every rank's ids
    renorm_columns(*pg, local, rows, max_norm, norm_type);
  }
}

} // namespace ops
} // namespace torch_shard
