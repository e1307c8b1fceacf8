// Row-wise max pooled on the requester: see ops/rowwise_max.h.
//
// NOTE [ Max pools on the requester ]
// In max mode every owner looks up the rows of the ids it was sent, as for F.embedding, and sends them
// back in the order it received them. The requester runs ATen's embedding_bag max kernel over those
// rows, with its own offsets and each id pointing at its row among the rows sent back (the inverse of
// its owner order, `perm`). So the kernel the dense op runs sees the dense op's rows in the dense op's
// order: result, winners and ties (the first maximum of a bag wins, NaN as ATen treats it) are the
// dense op's by construction, and no partial maxima from several owners need combining. The price is
// bytes: one row per id comes back instead of one per (bag, owner that holds some of its ids), and
// with many ranks those two counts meet. The backward is the kernel's own backward to those rows,
// sent back to their owners, then F.embedding's backward there (the CPU loops replace ATen's CPU max
// backward, which runs one op per column, with one pass over the winners). padding_idx: a padding id
// points at one extra row past the received ones, which the kernel is told is its padding row, so it
// takes no part, as in the dense op.

#include "ops/rowwise_max.h"

#include <optional>

#include <ATen/Dispatch.h>
#include <ATen/ops/_embedding_bag.h>
#include <ATen/ops/_embedding_bag_dense_backward.h>
#include <ATen/ops/_embedding_bag_forward_only.h>
#include <ATen/ops/arange.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/empty_like.h>
#include <ATen/ops/zeros.h>
#include <c10/util/Exception.h>

#include "ops/lookup_common.h"
#include "ops/rowwise_lookup.h"

namespace torch_shard {
namespace ops {

at::Tensor max_of_rows(const at::Tensor& back, const at::Tensor& ids, const at::Tensor& offsets,
                       const at::Tensor& perm, int64_t padding_idx, bool needs_grad,
                       std::vector<at::Tensor>& saved) {
  const int64_t n = ids.numel(), dim = back.size(1);
  if (n == 0 || dim == 0) { // NOTE [ Empty shards reach no embedding kernel ]
    return at::zeros({offsets.numel(), dim}, back.options());
  }
  // Each id's row among those sent back: perm[j] is the id whose row is back[j].
  const at::Tensor where = at::empty_like(perm).index_copy_(0, perm, at::arange(n, perm.options()));
  at::Tensor rows = back;
  int64_t pad = -1;
  if (padding_idx >= 0) {
    rows = at::cat({back, at::zeros({1, dim}, back.options())});
    where.masked_fill_(ids.eq(padding_idx), n);
    pad = n;
  }
  if (!needs_grad) {
    return std::get<0>(at::_embedding_bag_forward_only(rows, where, offsets, /*scale_grad_by_freq=*/false,
                                                       aten_bag_mode(LookupMode::kMax), /*sparse=*/false,
                                                       std::nullopt, /*include_last_offset=*/false, pad));
  }
  auto [result, offset2bag, bag_size, max_indices] =
      at::_embedding_bag(rows, where, offsets, /*scale_grad_by_freq=*/false, aten_bag_mode(LookupMode::kMax),
                         /*sparse=*/false, std::nullopt, /*include_last_offset=*/false, pad);
  saved[kRowPerm] = where;
  saved[kRowOffsets] = offsets;
  saved[kRowOffset2bag] = offset2bag;
  saved[kRowBagSize] = bag_size;
  saved[kRowMaxIndices] = max_indices;
  return result;
}

namespace {

// The CPU loops' backward: each element's gradient added to its winner's row. A bag without ids has no
// winner; ATen's CPU kernel marks it by its size (0), not by its winners' index.
at::Tensor max_rows_backward_loops(const at::Tensor& grad, const at::Tensor& winners,
                                   const at::Tensor& bag_size, int64_t num_ids) {
  const int64_t bags = grad.size(0), dim = grad.size(1);
  at::Tensor out = at::zeros({num_ids, dim}, grad.options());
  const at::Tensor g = grad.contiguous(), w = winners.contiguous(), sizes = bag_size.contiguous();
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, grad.scalar_type(), "max_rows_backward", [&] {
    const scalar_t* from = g.const_data_ptr<scalar_t>();
    scalar_t* to = out.mutable_data_ptr<scalar_t>();
    const int64_t* winner = w.const_data_ptr<int64_t>();
    const int64_t* size = sizes.const_data_ptr<int64_t>();
    for (int64_t b = 0; b < bags; ++b) {
      if (size[b] == 0) {
        continue;
      }
      for (int64_t d = 0; d < dim; ++d) {
        const int64_t row = winner[b * dim + d];
        TORCH_CHECK_VALUE(row >= 0 && row < num_ids, "torch_shard: a saved max winner (", row,
                          ") is not one of the ", num_ids, " rows pooled");
        to[row * dim + d] += from[b * dim + d];
      }
    }
  });
  return out;
}

} // namespace

at::Tensor max_rows_backward(const at::Tensor& grad, at::TensorList saved, int64_t num_ids,
                             int64_t padding_idx) {
  const int64_t dim = grad.size(1);
  if (num_ids == 0 || dim == 0) { // max_of_rows ran no kernel
    return at::zeros({num_ids, dim}, grad.options());
  }
  if (loops_for(grad)) {
    return max_rows_backward_loops(grad, saved[kRowMaxIndices], saved[kRowBagSize], num_ids);
  }
  const int64_t pad = padding_idx >= 0 ? num_ids : -1;
  // The dense backward itself: max mode reads only the winners (and the bags' sizes).
  const at::Tensor rows_grad = at::_embedding_bag_dense_backward(
      grad, saved[kRowPerm], saved[kRowOffset2bag], saved[kRowBagSize], saved[kRowMaxIndices],
      num_ids + (pad >= 0 ? 1 : 0), /*scale_grad_by_freq=*/false, aten_bag_mode(LookupMode::kMax),
      std::nullopt, pad);
  return pad >= 0 ? rows_grad.narrow(0, 0, num_ids) : rows_grad;
}

} // namespace ops
} // namespace torch_shard
