// Row-wise sharded embedding_bag: what one weight shard contributes to one requester's bags.
//
// The owner of rows [row_start, row_start + rows) walks the requester's bags once and pools, per bag,
// the rows it owns (ids outside its range and the padding id are skipped): a sum (times the
// per-sample weights) or a max. The requester then combines the owners' partial results. One fused
// pass instead of mask + gather + scatter with their temporaries; the backward scatters the output
// gradient to the owned rows the same way (for max, to the row that won each element).
//
// NOTE [ Max ties ]
// Dense embedding_bag(mode="max") gives each output element's gradient to ONE id: the first id of the
// bag (in input order) that holds the maximum; its CPU and CUDA kernels both compare with a strict
// `>` walking the bag in order. So a partial max reports, per (bag, column), the POSITION in `ids` of
// its winner (the first owned id holding the shard's maximum, -1 for none), on every device: the
// requester then picks, among the owners holding the overall maximum, the one whose winner comes
// first, exactly the dense op's choice, and the backward gives the gradient to the row at that
// position. (A zero-initialised table ties everywhere; a row per owner would not say which came
// first.)
//
// Max on CPU takes the fused loops (unless cpu_loops() is off: NOTE [ Requester-side routing in one
// op ]); sums, and every other device, take an equivalent composition of ATen ops (see
// embedding_bag_partial) that never reads device memory on the host: see NOTE [ Partial pooling
// without host reads ].

#include <algorithm>
#include <limits>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include <ATen/Dispatch.h>
#include <ATen/OpMathType.h>
#include <ATen/TensorOperators.h>
#include <ATen/ops/_assert_async.h>
#include <ATen/ops/arange.h>
#include <ATen/ops/bucketize.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/full.h>
#include <ATen/ops/nonzero_static.h>
#include <ATen/ops/ones_like.h>
#include <ATen/ops/where.h>
#include <ATen/ops/zeros.h>
#include <torch/library.h>

#include "layout/box.h"
#include "ops/lookup_common.h"
#include "ops/partial_pooling.h"

namespace torch_shard {
namespace {

constexpr const char* kForward = "torch_shard._embedding_bag_partial";
constexpr const char* kBackward = "torch_shard._embedding_bag_partial_backward";

bool is_max(const char* op, c10::string_view mode) {
  TORCH_CHECK_VALUE(mode == "sum" || mode == "max", op, ": mode must be 'sum' or 'max', got ", mode);
  return mode == "max";
}

// NOTE [ Partial pooling preconditions ]
// These kernels are public ops, and the fused loops index raw pointers with the offsets they are
// given, so every precondition the loops rely on is checked here, whoever calls: ids and offsets
// 1-D int64 on the weight's device, per-sample weights one per id, offsets non-decreasing within
// [0, number of ids], and row_start / rows non-negative with row_start + rows representable. With
// them no index a kernel forms leaves its tensor: ids outside the shard's rows are skipped, never
// subtracted from. Ids before offsets[0] belong to no bag and are ignored (the sharded ops always
// pass offsets[0] == 0). On the CPU the offsets are checked on the host; on a GPU the same
// conditions are a device-side assertion (at::_assert_async), so checking costs no host sync.
void check_bags(const char* op, const at::Tensor& values, const char* values_name, const at::Tensor& ids,
                const at::Tensor& offsets, const std::optional<at::Tensor>& psw, int64_t row_start,
                int64_t rows) {
  TORCH_CHECK_VALUE(values.dim() == 2, op, ": ", values_name, " must be 2-D, got shape ", values.sizes());
  TORCH_CHECK_TYPE(at::isFloatingType(values.scalar_type()), op, ": ", values_name,
                   " must be a floating point tensor, got ", values.scalar_type());
  TORCH_CHECK_TYPE(ids.scalar_type() == at::kLong && offsets.scalar_type() == at::kLong, op,
                   ": ids and offsets must be int64, got ", ids.scalar_type(), " and ",
                   offsets.scalar_type());
  TORCH_CHECK_VALUE(ids.dim() == 1 && offsets.dim() == 1, op, ": ids and offsets must be 1-D, got ",
                    ids.dim(), "-D and ", offsets.dim(), "-D");
  const bool weighted = psw.has_value() && psw->defined();
  for (const at::Tensor* t : {&ids, &offsets, weighted ? &*psw : &ids}) {
    TORCH_CHECK(t->device() == values.device(), op,
                ": expected all tensors to be on the same device, but found at least two devices, ",
                values.device(), " and ", t->device(), "!");
  }
  if (weighted) {
    TORCH_CHECK_VALUE(psw->dim() == 1 && psw->numel() == ids.numel(), op,
                      ": per_sample_weights must be 1-D with one weight per id (", ids.numel(),
                      "), got shape ", psw->sizes());
    TORCH_CHECK_TYPE(at::isFloatingType(psw->scalar_type()), op,
                     ": per_sample_weights must be a floating point tensor, got ", psw->scalar_type());
  }
  TORCH_CHECK_VALUE(row_start >= 0 && rows >= 0, op, ": row_start and rows must be non-negative, got ",
                    row_start, " and ", rows);
  layout::checked_add(row_start, rows, "torch_shard: row_start + rows");
  const int64_t n = ids.numel();
  const int64_t bags = offsets.numel();
  if (bags == 0) {
    return;
  }
  if (!offsets.is_cpu()) {
    const at::Tensor inside = (offsets >= 0).all() & (offsets <= n).all();
    const at::Tensor ordered =
        bags > 1 ? (offsets.slice(0, 1) >= offsets.slice(0, 0, bags - 1)).all() : inside;
    at::_assert_async(inside & ordered,
                      "torch_shard._embedding_bag_partial: offsets must be non-decreasing and "
                      "within [0, the number of ids]");
    return;
  }
  const at::Tensor off = offsets.contiguous();
  const int64_t* o = off.const_data_ptr<int64_t>();
  for (int64_t b = 0; b < bags; ++b) {
    TORCH_CHECK(o[b] >= 0 && o[b] <= n, op, ": offsets must be within [0, ", n,
                "] (the number of ids), but offsets[", b, "] = ", o[b]);
    TORCH_CHECK(b == 0 || o[b] >= o[b - 1], op, ": offsets must be non-decreasing, but offsets[", b,
                "] = ", o[b], " is less than offsets[", b - 1, "] = ", o[b - 1]);
  }
}

// Bag b holds ids[offsets[b] : offsets[b + 1]] (the last bag runs to the end).
template <typename F>
void for_each_owned(const int64_t* ids, const int64_t* offsets, int64_t n, int64_t bags, int64_t row_start,
                    int64_t rows, int64_t padding_idx, F&& f) {
  const int64_t row_end = row_start + rows; // checked by check_bags
  for (int64_t b = 0; b < bags; ++b) {
    const int64_t end = b + 1 < bags ? offsets[b + 1] : n;
    for (int64_t i = offsets[b]; i < end; ++i) {
      const int64_t id = ids[i];
      if (id >= row_start && id < row_end && id != padding_idx) {
        f(b, i, id - row_start);
      }
    }
  }
}

// NOTE [ Partial pooling without host reads ]
// The ATen composition selects the ids a shard owns with nonzero_static, whose output size is given,
// never with masked_select / nonzero, whose output size the host must read from the device (a sync
// on a GPU). The size is `owned`: how many ids, from offsets[0] on, fall in the shard's rows. The
// sharded ops know it without reading device memory (each requester counts its ids per owner on its
// device, and the counts arrive with the agreement: NOTE [ One host read per exchange ]); a direct
// call without it pays one read to count. A wrong count is an error: checked on the host on the CPU,
// a device-side assertion on a GPU. Each id's bag comes from bucketize over the offsets (ids before
// offsets[0] get bag -1 and are left out), not from repeat_interleave, whose output size is data too.
struct OwnedIds {
  at::Tensor position;           // position in ids of each selected id
  at::Tensor rows;               // local row of each selected id
  at::Tensor bag;                // its bag
  at::Tensor keep;               // false for the padding id (selected, but contributes nothing)
  std::optional<at::Tensor> psw; // its per-sample weight
};

OwnedIds owned_ids(const char* op, const at::Tensor& ids, const at::Tensor& offsets,
                   const std::optional<at::Tensor>& psw, int64_t row_start, int64_t rows, int64_t padding_idx,
                   std::optional<int64_t> owned) {
  const int64_t n = ids.numel();
  const at::Tensor position = at::arange(n, ids.options());
  const at::Tensor bag = at::bucketize(position, offsets, /*out_int32=*/false, /*right=*/true) - 1;
  const at::Tensor in_range = (ids >= row_start) & (ids < row_start + rows) & (bag >= 0);
  int64_t count = 0;
  if (owned.has_value()) {
    count = *owned;
    TORCH_CHECK_VALUE(count >= 0 && count <= n, op, ": owned must be in [0, ", n, "], got ", count);
    if (in_range.is_cpu()) {
      const at::Tensor flags = in_range.contiguous();
      const bool* f = flags.const_data_ptr<bool>();
      const auto actual = static_cast<int64_t>(std::count(f, f + n, true));
      TORCH_CHECK_VALUE(actual == count, op, ": owned = ", count, ", but ", actual,
                        " of the ids (from offsets[0] on) fall in rows [", row_start, ", ", row_start + rows,
                        ")");
    } else {
      at::_assert_async(in_range.sum() == count,
                        "torch_shard._embedding_bag_partial: owned does not match the "
                        "number of ids in the shard's rows");
    }
  } else {
    count = in_range.sum().item<int64_t>(); // a host read: pass `owned` to avoid it on a GPU
  }
  const at::Tensor which = at::nonzero_static(in_range, count).squeeze(1);
  OwnedIds out;
  out.position = which;
  const at::Tensor selected = ids.index_select(0, which);
  out.rows = selected - row_start;
  out.bag = bag.index_select(0, which);
  out.keep = padding_idx >= 0 ? selected.ne(padding_idx)
                              : at::ones_like(selected, selected.options().dtype(at::kBool));
  if (psw.has_value() && psw->defined()) {
    out.psw = psw->index_select(0, which);
  }
  return out;
}

std::tuple<at::Tensor, at::Tensor> partial_cpu(const at::Tensor& weight, const at::Tensor& ids,
                                               const at::Tensor& offsets,
                                               const std::optional<at::Tensor>& psw, int64_t row_start,
                                               bool max_mode, int64_t padding_idx) {
  const at::Tensor w = weight.contiguous();
  const at::Tensor id = ids.contiguous();
  const at::Tensor off = offsets.contiguous();
  const int64_t bags = off.numel(), dim = w.size(1), rows = w.size(0), n = id.numel();
  at::Tensor out = max_mode ? at::full({bags, dim}, -std::numeric_limits<double>::infinity(), w.options())
                            : at::zeros({bags, dim}, w.options());
  at::Tensor arg = max_mode ? at::full({bags, dim}, -1, id.options()) : at::empty({0}, id.options());
  const bool weighted = psw.has_value() && psw->defined();
  const at::Tensor sw = weighted ? psw->contiguous().to(w.scalar_type()) : at::Tensor();
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, w.scalar_type(), "embedding_bag_partial", [&] {
    using acc_t = at::opmath_type<scalar_t>;
    const scalar_t* wp = w.const_data_ptr<scalar_t>();
    const scalar_t* sp = weighted ? sw.const_data_ptr<scalar_t>() : nullptr;
    const int64_t* idp = id.const_data_ptr<int64_t>();
    const int64_t* offp = off.const_data_ptr<int64_t>();
    if (max_mode) {
      scalar_t* op = out.mutable_data_ptr<scalar_t>();
      int64_t* ap = arg.mutable_data_ptr<int64_t>();
      // Strict `>` in input order: the first owned id holding the maximum wins (NOTE [ Max ties ]).
      for_each_owned(idp, offp, n, bags, row_start, rows, padding_idx,
                     [&](int64_t b, int64_t i, int64_t row) {
                       const scalar_t* src = wp + row * dim;
                       scalar_t* dst = op + b * dim;
                       int64_t* am = ap + b * dim;
                       for (int64_t d = 0; d < dim; ++d) {
                         if (am[d] < 0 || src[d] > dst[d]) {
                           dst[d] = src[d];
                           am[d] = i;
                         }
                       }
                     });
      return;
    }
    // Sums accumulate in the op-math type: straight into the output for float and double, in a
    // float buffer rounded once at the end for half and bfloat16.
    std::vector<acc_t> buffer;
    acc_t* acc = nullptr;
    if constexpr (std::is_same_v<acc_t, scalar_t>) {
      acc = reinterpret_cast<acc_t*>(out.mutable_data_ptr<scalar_t>()); // same type here
    } else {
      buffer.assign(static_cast<size_t>(bags * dim), acc_t(0));
      acc = buffer.data();
    }
    for_each_owned(idp, offp, n, bags, row_start, rows, padding_idx, [&](int64_t b, int64_t i, int64_t row) {
      const scalar_t* __restrict__ src = wp + row * dim;
      acc_t* __restrict__ dst = acc + b * dim;
      if (sp == nullptr) {
        for (int64_t d = 0; d < dim; ++d) {
          dst[d] += static_cast<acc_t>(src[d]);
        }
      } else {
        const acc_t scale = static_cast<acc_t>(sp[i]);
        for (int64_t d = 0; d < dim; ++d) {
          dst[d] += scale * static_cast<acc_t>(src[d]);
        }
      }
    });
    if constexpr (!std::is_same_v<acc_t, scalar_t>) {
      scalar_t* op = out.mutable_data_ptr<scalar_t>();
      for (int64_t k = 0; k < bags * dim; ++k) {
        op[k] = static_cast<scalar_t>(acc[k]);
      }
    }
  });
  return {out, arg};
}

// The same contract from ATen ops (NOTE [ Partial pooling without host reads ]).
std::tuple<at::Tensor, at::Tensor> partial_generic(const at::Tensor& weight, const OwnedIds& ids,
                                                   int64_t num_bags, bool max_mode) {
  const int64_t dim = weight.size(1);
  at::Tensor values = weight.index_select(0, ids.rows);
  const at::Tensor keep = ids.keep.unsqueeze(1);
  if (!max_mode) {
    if (ids.psw.has_value()) {
      values = values * ids.psw->to(weight.scalar_type()).unsqueeze(1);
    }
    values = at::where(keep, values, at::zeros({}, values.options()));
    return {at::zeros({num_bags, dim}, weight.options()).index_add(0, ids.bag, values),
            at::empty({0}, ids.rows.options())};
  }
  // Max with the winning position: reduce, then find, per (bag, column), the first position whose
  // value equals the max (NOTE [ Max ties ]: the CPU loop's choice).
  const auto lowest = at::full({}, -std::numeric_limits<double>::infinity(), values.options());
  values = at::where(keep, values, lowest);
  at::Tensor out = at::full({num_bags, dim}, -std::numeric_limits<double>::infinity(), weight.options())
                       .index_reduce(0, ids.bag, values, "amax", /*include_self=*/true);
  const at::Tensor winner = values.eq(out.index_select(0, ids.bag)) & keep;
  const auto none = at::full({}, std::numeric_limits<int64_t>::max(), ids.position.options());
  const at::Tensor candidate = at::where(winner, ids.position.unsqueeze(1).expand_as(values), none);
  at::Tensor first = at::full({num_bags, dim}, std::numeric_limits<int64_t>::max(), ids.position.options())
                         .index_reduce(0, ids.bag, candidate, "amin", /*include_self=*/true);
  return {out, at::where(first.eq(none), at::full({}, -1, first.options()), first)};
}

} // namespace

namespace ops {

std::tuple<at::Tensor, at::Tensor> embedding_bag_partial(const at::Tensor& weight, const at::Tensor& ids,
                                                         const at::Tensor& offsets,
                                                         const std::optional<at::Tensor>& per_sample_weights,
                                                         int64_t row_start, c10::string_view mode,
                                                         int64_t padding_idx, std::optional<int64_t> owned) {
  const bool max_mode = is_max(kForward, mode);
  check_bags(kForward, weight, "weight", ids, offsets, per_sample_weights, row_start, weight.size(0));
  // On CPU the fused loop beats the composition for max (which needs two index_reduce passes) but not
  // for sum, where ATen's vectorised index_select + index_add win, so sums always take the composition.
  if (max_mode && loops_for(weight)) {
    return partial_cpu(weight, ids, offsets, per_sample_weights, row_start, max_mode, padding_idx);
  }
  const OwnedIds selected =
      owned_ids(kForward, ids, offsets, per_sample_weights, row_start, weight.size(0), padding_idx, owned);
  return partial_generic(weight, selected, offsets.numel(), max_mode);
}

at::Tensor embedding_bag_partial_backward(const at::Tensor& grad, const at::Tensor& ids,
                                          const at::Tensor& offsets,
                                          const std::optional<at::Tensor>& per_sample_weights,
                                          const at::Tensor& argmax, int64_t row_start, int64_t rows,
                                          c10::string_view mode, int64_t padding_idx,
                                          std::optional<int64_t> owned) {
  const bool max_mode = is_max(kBackward, mode);
  check_bags(kBackward, grad, "grad", ids, offsets, per_sample_weights, row_start, rows);
  const int64_t num_bags = offsets.numel(), dim = grad.size(1);
  TORCH_CHECK_VALUE(grad.size(0) == num_bags, kBackward, ": grad must have one row per bag (", num_bags,
                    "), got shape ", grad.sizes());
  layout::checked_mul(rows, dim, "torch_shard._embedding_bag_partial_backward: rows * dim");
  at::Tensor grad_weight = at::zeros({rows, dim}, grad.options());
  if (rows == 0) {
    return grad_weight; // a shard without rows has no gradient (and no row an index could name)
  }
  if (max_mode) {
    TORCH_CHECK_TYPE(argmax.scalar_type() == at::kLong, kBackward, ": argmax must be int64, got ",
                     argmax.scalar_type());
    TORCH_CHECK_VALUE(argmax.dim() == 2 && argmax.size(0) == num_bags && argmax.size(1) == dim, kBackward,
                      ": argmax must have the shape of grad ", grad.sizes(), ", got ", argmax.sizes());
    TORCH_CHECK(argmax.device() == grad.device(), kBackward,
                ": expected all tensors to be on the same device, but found at least two devices, ",
                grad.device(), " and ", argmax.device(), "!");
    if (argmax.numel() > 0) {
      if (argmax.is_cpu()) {
        const at::Tensor rows_won = argmax.contiguous();
        const int64_t* a = rows_won.const_data_ptr<int64_t>();
        const auto [low, high] = std::minmax_element(a, a + rows_won.numel());
        const int64_t lo = *low, hi = *high;
        TORCH_CHECK_VALUE(lo >= -1 && hi < ids.numel(), kBackward, ": argmax holds positions in [", lo, ", ",
                          hi, "]; expected -1 (none) or a position in ids, in [0, ", ids.numel(), ")");
      } else {
        at::_assert_async(
            (argmax >= -1).all() & (argmax < ids.numel()).all(),
            "torch_shard._embedding_bag_partial_backward: argmax holds a position outside [-1, ids.numel())");
      }
    }
    // Each element of each bag's output came from the id at one position (or none: -1; NOTE [ Max
    // ties ]). Elements without one add nothing (their row is clamped to 0 and their gradient zeroed),
    // so no output size depends on data.
    if (ids.numel() == 0) {
      return grad_weight; // every position is -1 (checked above)
    }
    if (loops_for(grad)) {
      // One pass instead of ten over [bags, dim]: each element's gradient to the row of the id that
      // won it. Positions were checked above; each id is checked against the shard's rows before it
      // indexes anything.
      const at::Tensor g = grad.contiguous(), won_at = argmax.contiguous(), id = ids.contiguous();
      AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, g.scalar_type(), kBackward, [&] {
        const scalar_t* gp = g.const_data_ptr<scalar_t>();
        const int64_t* ap = won_at.const_data_ptr<int64_t>();
        const int64_t* idp = id.const_data_ptr<int64_t>();
        scalar_t* out = grad_weight.mutable_data_ptr<scalar_t>();
        for (int64_t b = 0; b < num_bags; ++b) {
          for (int64_t d = 0; d < dim; ++d) {
            const int64_t position = ap[b * dim + d];
            if (position < 0) {
              continue;
            }
            const int64_t row = idp[position] - row_start;
            TORCH_CHECK_VALUE(row >= 0 && row < rows, kBackward,
                              ": argmax names a position whose id is outside the shard's rows [", row_start,
                              ", ", row_start + rows, ")");
            out[row * dim + d] += gp[b * dim + d];
          }
        }
      });
      return grad_weight;
    }
    const at::Tensor valid = argmax.ge(0);
    const at::Tensor position = at::where(valid, argmax, at::zeros({}, argmax.options()));
    const at::Tensor won = ids.index_select(0, position.reshape({-1})).view({num_bags, dim}) - row_start;
    const at::Tensor inside = won.ge(0) & won.lt(rows);
    if (won.is_cpu()) {
      TORCH_CHECK_VALUE((inside | valid.logical_not()).all().item<bool>(), kBackward,
                        ": argmax names a position whose id is outside the shard's rows [", row_start, ", ",
                        row_start + rows, ")");
    } else {
      at::_assert_async((inside | valid.logical_not()).all(),
                        "torch_shard._embedding_bag_partial_backward: argmax names a position whose id is "
                        "outside the shard's rows");
    }
    const at::Tensor cols = at::arange(dim, argmax.options()).expand({num_bags, dim});
    const at::Tensor flat_index =
        at::where(valid & inside, won * dim + cols, at::zeros({}, argmax.options()));
    const at::Tensor contrib = at::where(valid & inside, grad, at::zeros({}, grad.options()));
    grad_weight.view({-1}).index_add_(0, flat_index.reshape({-1}), contrib.reshape({-1}));
    return grad_weight;
  }
  const OwnedIds selected =
      owned_ids(kBackward, ids, offsets, per_sample_weights, row_start, rows, padding_idx, owned);
  at::Tensor contrib = grad.index_select(0, selected.bag);
  if (selected.psw.has_value()) {
    contrib = contrib * selected.psw->to(grad.scalar_type()).unsqueeze(1);
  }
  contrib = at::where(selected.keep.unsqueeze(1), contrib, at::zeros({}, contrib.options()));
  grad_weight.index_add_(0, selected.rows, contrib);
  return grad_weight;
}

} // namespace ops
} // namespace torch_shard
