// A column-wise sharded lookup (F.embedding, F.embedding_bag sum / mean / max) as ONE C++ call per
// forward and one per backward.
//
// NOTE [ A column-wise lookup in one call ]
// Each rank holds a block of columns of every row, so every rank's ids are needed by every rank.
// torch_shard._colwise_lookup does, for one rank:
//   1. this rank's request: the checks of its arguments (a failure is this rank's and goes into the
//      agreement, so every rank raises) and its input's value checks on its device (NOTE [ Input
//      checks on the device ]);
//   2. the agreed input exchange (NOTE [ Shared inputs ]): every rank's offsets, ids (int32 where the
//      table allows: half the bytes) and per-sample weights reach every rank, or every rank raises;
//   3. ONE ATen kernel over every requester's bags in this rank's columns (embedding, or _embedding_bag
//      in the caller's mode: a column block pools exactly as the whole row would, padding and max ties
//      included), never on an empty block or with no ids (NOTE [ Empty shards reach no embedding
//      kernel ]);
//   4. one all-to-all gives each requester its rows of this block, and the requester puts the blocks
//      side by side in column order.
// _colwise_lookup_backward agrees too, sends each owner the gradient of its columns (the reverse of 4)
// and runs the kernel's backward there. max_norm is an op of its own that runs first (ops/renorm.cpp).

#include "ops/colwise_lookup.h"

#include <algorithm>
#include <exception>
#include <limits>

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
#include "ops/shared_inputs.h"

namespace torch_shard {
namespace ops {

namespace {

constexpr const char* kColumnLookup = "torch_shard._colwise_lookup";
constexpr const char* kColumnBackward = "torch_shard._colwise_lookup_backward";

// `saved` (the forward's second output, the backward's input), by position.
enum Saved : size_t {
  kIds = 0,    // every requester's ids, in rank order (the kernel's index dtype)
  kOffsets,    // bags: their offsets into kIds
  kOffset2bag, // bags: _embedding_bag's, for its backward
  kBagSize,
  kMaxIndices,
  kWeights, // every requester's per-sample weights (empty without)
  kCounts,  // CPU int64: [the table's rows, rows of each requester (W), columns of each owner (W), first
            //             column of each owner (W)]
  kNumSaved
};

// Step 1's result: what this rank brings to the lookup.
struct ColumnRequest {
  CheckedInput checked;          // the mode, the input as given and its device-side status
  std::vector<at::Tensor> parts; // shared: bag starts (empty for embedding), ids (index dtype), weights
  Blocks columns;
  int64_t fingerprint = 0;
  LookupMode mode() const { return checked.mode; }
};

ColumnRequest prepare_columns(c10d::ProcessGroup& pg, const LookupCall& call) {
  ColumnRequest req;
  req.columns = checked_blocks(kColumnLookup, call.block_starts, call.block_sizes, pg.getSize(),
                               checked_total(call.block_sizes));
  req.checked = check_input(kColumnLookup, call);
  req.checked.status = input_status(req.checked.input);
  const int64_t width = req.columns.sizes[pg.getRank()];
  TORCH_CHECK_VALUE(call.local.size(0) == call.num_embeddings && call.local.size(1) == width, kColumnLookup,
                    ": the weight shard of rank ", pg.getRank(), " must be [", call.num_embeddings, ", ",
                    width, "] (every row, its block's columns), got ", call.local.sizes());
  const at::Tensor& ids = req.checked.input.ids;
  const at::Tensor starts = is_bags(req.mode()) ? bag_offsets(req.checked.input) : ids.narrow(0, 0, 0);
  req.parts = {starts, ids.to(index_dtype(call.num_embeddings))};
  if (call.per_sample_weights.has_value()) {
    req.parts.push_back(*call.per_sample_weights);
  }
  req.fingerprint =
      table_fingerprint(call.fingerprint, call.num_embeddings, /*dim=*/1, call.local, req.columns);
  return req;
}

} // namespace

LookupResult colwise_lookup(const LookupCall& call) {
  const auto pg = lookup_group(call.group_name, "_colwise_lookup");
  const at::Tensor &local = call.local, &ids = call.ids;
  const std::optional<at::Tensor>&offsets = call.offsets, &per_sample_weights = call.per_sample_weights;
  const int64_t padding_idx = call.padding_idx, num_embeddings = call.num_embeddings;
  const bool needs_grad = call.needs_grad;
  const int64_t me = pg->getRank(), world = pg->getSize();
  // 1. This rank's request (a failure here is reported in the agreement).
  ColumnRequest req;
  const std::exception_ptr error = prepared(req, [&] { return prepare_columns(*pg, call); });
  // 2. Every rank's bags on every rank.
  const bool bags = is_bags(req.mode()), weighted = per_sample_weights.has_value();
  const std::vector<double> agreed =
      agreed_arguments(LookupOp::kColwise, call.arguments,
                       {static_cast<double>(req.mode()), static_cast<double>(padding_idx)});
  ShareRequest request = agreement_request(req.checked, req.fingerprint, agreed, local.device(), error);
  request.parts = req.parts;
  request.flags = weighted ? 1 : 0;
  request.borrow = true; // every peer's part is copied out (joined) before the results' exchange
  const std::vector<at::Tensor> everyone = share_inputs(*pg, request).parts;
  const auto width = static_cast<int64_t>(req.parts.size());
  TORCH_INTERNAL_ASSERT(static_cast<int64_t>(everyone.size()) == world * width);
  // One set of bags for every requester: ids one after the other, offsets shifted by the ids before
  // (one add over all of them, whatever the number of ranks).
  std::vector<int64_t> rows_of(world), shifts;
  std::vector<at::Tensor> all_ids, all_offsets, all_weights;
  int64_t shift = 0;
  for (int64_t r = 0; r < world; ++r) {
    const at::Tensor& their_offsets = everyone[r * width];
    const at::Tensor& their_ids = everyone[r * width + 1];
    rows_of[r] = bags ? their_offsets.numel() : their_ids.numel();
    if (bags && rows_of[r] == 0) {
      continue; // ids without bags belong to no bag
    }
    all_ids.push_back(their_ids);
    if (bags) {
      all_offsets.push_back(their_offsets);
      shifts.insert(shifts.end(), static_cast<size_t>(rows_of[r]), shift);
    }
    if (weighted) {
      all_weights.push_back(everyone[r * width + 2]);
    }
    shift = layout::checked_add(shift, their_ids.numel(), "torch_shard._colwise_lookup: ids");
  }
  // Peers' parts are views of the exchange's buffer (borrowed): what the kernel and the backward keep
  // must be a copy, which a join of several parts, a shift or a dtype conversion already is.
  auto owned = [&](const at::Tensor& t) {
    for (int64_t r = 0; r < world; ++r) {
      if (r == me) {
        continue; // this rank's own parts are the caller's tensors
      }
      for (int64_t k = 0; k < width; ++k) {
        if (t.is_alias_of(everyone[r * width + k])) {
          return t.clone();
        }
      }
    }
    return t;
  };
  auto joined = [](const std::vector<at::Tensor>& pieces, const at::Tensor& none) {
    return pieces.empty() ? none : (pieces.size() == 1 ? pieces[0] : at::cat(pieces));
  };
  // The kernel takes ids and offsets of one dtype: int32 while the offsets fit, else int64.
  const c10::ScalarType index = index_dtype(num_embeddings);
  const c10::ScalarType kernel_index =
      index == at::kInt && shift <= std::numeric_limits<int32_t>::max() ? at::kInt : at::kLong;
  const at::Tensor group_ids = owned(joined(all_ids, req.parts[1].narrow(0, 0, 0)).to(kernel_index));
  at::Tensor group_offsets;
  if (bags) {
    group_offsets = joined(all_offsets, req.parts[0].narrow(0, 0, 0));
    if (std::any_of(shifts.begin(), shifts.end(), [](int64_t s) { return s != 0; })) {
      group_offsets = group_offsets + to_device(shifts, group_offsets.device());
    }
    group_offsets = owned(group_offsets.to(kernel_index));
  }
  std::optional<at::Tensor> group_weights;
  if (weighted) {
    group_weights = owned(joined(all_weights, per_sample_weights->narrow(0, 0, 0)));
  }
  const int64_t total_rows = checked_total(rows_of);
  const int64_t mine = rows_of[me];

  // 3. One kernel over every requester's bags in this rank's columns.
  std::vector<at::Tensor> saved(kNumSaved);
  for (auto& t : saved) {
    t = at::empty({0}, ids.options().dtype(at::kLong));
  }
  const int64_t columns = local.size(1);
  const bool lookup = columns > 0 && group_ids.numel() > 0;
  at::Tensor found;
  if (!lookup) {
    found = at::zeros({total_rows, columns}, local.options());
  } else if (!bags) {
    found = at::embedding(local, group_ids, padding_idx);
  } else if (needs_grad) {
    auto [result, offset2bag, bag_size, max_indices] =
        at::_embedding_bag(local, group_ids, group_offsets, false, aten_bag_mode(req.mode()), false,
                           group_weights, false, padding_idx);
    found = result;
    saved[kOffset2bag] = offset2bag;
    saved[kBagSize] = bag_size;
    saved[kMaxIndices] = max_indices;
  } else {
    found = std::get<0>(at::_embedding_bag_forward_only(local, group_ids, group_offsets, false,
                                                        aten_bag_mode(req.mode()), false, group_weights,
                                                        false, padding_idx));
  }
  // Requesters with bags but no ids: their bags' rows are the kernel's too (empty bags give 0).
  TORCH_INTERNAL_ASSERT(found.size(0) == total_rows, "the kernel gave ", found.size(0), " rows, expected ",
                        total_rows);

  // 4. Each requester its rows of this block; the blocks side by side in column order.
  const Blocks& owners = req.columns;
  std::vector<int64_t> send(world), recv(world);
  for (int64_t r = 0; r < world; ++r) {
    send[r] = layout::checked_mul(rows_of[r], columns, "torch_shard._colwise_lookup: elements");
    recv[r] = layout::checked_mul(mine, owners.sizes[r], "torch_shard._colwise_lookup: elements");
  }
  const at::Tensor back =
      world == 1 ? found.reshape({-1}) : all_to_all_counts(*pg, found.reshape({-1}), send, recv);
  std::vector<std::pair<int64_t, int64_t>> order; // (first column, owner) of the non-empty blocks
  std::vector<int64_t> first_element(world);
  int64_t at = 0;
  for (int64_t o = 0; o < world; ++o) {
    if (owners.sizes[o] > 0) {
      order.emplace_back(owners.starts[o], o);
    }
    first_element[o] = at;
    at += mine * owners.sizes[o];
  }
  std::sort(order.begin(), order.end());
  std::vector<at::Tensor> blocks;
  for (const auto& [first, o] : order) {
    blocks.push_back(back.narrow(0, first_element[o], mine * owners.sizes[o]).view({mine, owners.sizes[o]}));
  }
  at::Tensor out = blocks.empty() ? at::zeros({mine, 0}, local.options())
                                  : (blocks.size() == 1 ? blocks[0] : at::cat(blocks, 1));
  if (needs_grad) {
    saved[kIds] = group_ids;
    if (bags) {
      saved[kOffsets] = group_offsets;
    }
    if (weighted) {
      saved[kWeights] = *group_weights;
    }
  }
  std::vector<int64_t> counts{num_embeddings};
  counts.insert(counts.end(), rows_of.begin(), rows_of.end());
  counts.insert(counts.end(), owners.sizes.begin(), owners.sizes.end());
  counts.insert(counts.end(), owners.starts.begin(), owners.starts.end());
  saved[kCounts] = at::tensor(counts, at::TensorOptions().dtype(at::kLong));
  return {out, saved};
}

at::Tensor colwise_lookup_backward(const at::Tensor& grad, at::TensorList saved, int64_t padding_idx,
                                   c10::string_view mode_name, c10::string_view group_name) {
  const auto pg = lookup_group(group_name, "_colwise_lookup_backward");
  const int64_t me = pg->getRank(), world = pg->getSize();
  // 1. This rank's checks (a failure here is reported in the agreement).
  LookupMode mode = LookupMode::kEmbedding;
  std::vector<int64_t> rows_of, widths, starts;
  int64_t rows = 0;
  std::exception_ptr error;
  try {
    const BackwardHead head =
        backward_head(kColumnBackward, mode_name, grad, saved, kNumSaved, kCounts, 1 + 3 * world);
    mode = head.mode;
    rows = head.counts[0];
    const int64_t* c = head.counts.data() + 1; // then each rank's rows, widths and first columns
    TORCH_CHECK_VALUE(rows >= 0 && padding_idx >= -1 && padding_idx < rows, kColumnBackward,
                      ": malformed counts");
    rows_of.assign(c, c + world);
    widths.assign(c + world, c + 2 * world);
    starts.assign(c + 2 * world, c + 3 * world);
    const Blocks owners = checked_blocks(kColumnBackward, starts, widths, world, grad.size(1));
    TORCH_CHECK_VALUE(grad.size(0) == rows_of[me], kColumnBackward, ": grad has ", grad.size(0),
                      " rows, expected ", rows_of[me]);
    const int64_t total_rows = checked_total(rows_of);
    if (mode == LookupMode::kEmbedding) {
      TORCH_CHECK_VALUE(saved[kIds].numel() == 0 || saved[kIds].numel() == total_rows, kColumnBackward,
                        ": saved ids do not match the counts");
    } else {
      TORCH_CHECK_VALUE(saved[kOffsets].numel() <= total_rows &&
                            saved[kOffsets].scalar_type() == saved[kIds].scalar_type(),
                        kColumnBackward, ": saved offsets do not match the counts");
    }
  } catch (...) {
    error = std::current_exception();
  }
  // 2. The agreement: every rank's checks, and the gradient's width and dtype (the bytes that move).
  agree_backward(*pg, LookupOp::kColwiseBackward, mode, grad, error);
  // 3. Each owner the gradient of its columns (the reverse of the forward's exchange).
  const int64_t total_rows = checked_total(rows_of);
  const int64_t mine = rows_of[me], columns = widths[me];
  std::vector<at::Tensor> pieces;
  for (int64_t o = 0; o < world; ++o) {
    // An empty block's start may lie past the last column.
    pieces.push_back(widths[o] ? grad.narrow(1, starts[o], widths[o]).reshape({-1}) : grad.new_empty({0}));
  }
  std::vector<int64_t> send(world), recv(world);
  for (int64_t o = 0; o < world; ++o) {
    send[o] = layout::checked_mul(mine, widths[o], "elements");
    recv[o] = layout::checked_mul(rows_of[o], columns, "elements");
  }
  const at::Tensor flat = world == 1 ? pieces[0] : at::cat(pieces);
  const at::Tensor got =
      (world == 1 ? flat : all_to_all_counts(*pg, flat, send, recv)).view({total_rows, columns});
  // 4. The kernel's backward, never on an empty block or with no ids.
  const at::Tensor& ids = saved[kIds];
  if (columns == 0 || ids.numel() == 0 || rows == 0) {
    return at::zeros({rows, columns}, grad.options());
  }
  if (mode == LookupMode::kEmbedding) {
    return at::embedding_dense_backward(got, ids, rows, padding_idx, /*scale_grad_by_freq=*/false);
  }
  const at::Tensor& weights = saved[kWeights];
  // _embedding_bag_backward rebuilds offset2bag where the CPU forward left it empty (sum mode).
  return at::_embedding_bag_backward(
      got, ids, saved[kOffsets], saved[kOffset2bag], saved[kBagSize], saved[kMaxIndices], rows,
      /*scale_grad_by_freq=*/false, aten_bag_mode(mode),
      /*sparse=*/false, weights.numel() ? std::optional<at::Tensor>(weights) : std::nullopt, padding_idx);
}

} // namespace ops
} // namespace torch_shard
