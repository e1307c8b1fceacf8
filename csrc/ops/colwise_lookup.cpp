// A column-wise sharded lookup (F.embedding, F.embedding_bag sum / mean / max) as ONE C++ call per
// forward and one per backward.
//
// NOTE [ A column-wise lookup in one call ]
// Each rank holds a block of columns of every row, so every rank's ids are needed by every rank.
// torch_shard._colwise_lookup does, for one rank:
//   1. the ids' range check on their device, folded into this rank's status;
//   2. the agreed input exchange (torch_shard._share_inputs.with_words, NOTE [ Shared inputs ]): every
//      rank's offsets, ids (int32 where the table allows: half the bytes) and per-sample weights
//      reach every rank, or every rank raises;
//   3. ONE ATen kernel over every requester's bags in this rank's columns (embedding, or _embedding_bag
//      in the caller's mode: a column block pools exactly as the whole row would, padding and max ties
//      included), never on an empty block or with no ids (NOTE [ Empty shards reach no embedding
//      kernel ] in _common.py);
//   4. one all-to-all gives each requester its rows of this block, and the requester puts the blocks
//      side by side in column order.
// _colwise_lookup_backward sends each owner the gradient of its columns (the reverse of 4) and runs the
// kernel's backward there. max_norm composes in Python: it renormalises the shard in place, with a sum
// of the rows' partial norms over the ranks, which a functional op may not do.

#include <algorithm>
#include <limits>
#include <tuple>
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
#include <ATen/ops/where.h>
#include <ATen/ops/zeros.h>
#include <c10/util/Exception.h>
#include <torch/library.h>

#include "comm/process_group.h"
#include "ops/lookup_parts.h"
#include "ops/untraceable.h"

namespace torch_shard {
namespace {

constexpr const char* kLookup = "torch_shard._colwise_lookup";
constexpr const char* kLookupBackward = "torch_shard._colwise_lookup_backward";

constexpr int64_t kEmbedding = -1; // F.embedding; 0, 1, 2: embedding_bag sum, mean, max (ATen's codes)

// `saved` (the forward's second output, the backward's input), by position.
enum Saved : size_t {
  kIds = 0,    // every requester's ids, in rank order (the kernel's index dtype)
  kOffsets,    // bags: their offsets into kIds
  kOffset2bag, // bags: _embedding_bag's, for its backward
  kBagSize,
  kMaxIndices,
  kWeights, // every requester's per-sample weights (empty without)
  kCounts,  // CPU int64: [own status, rows of each requester (W), columns of each owner (W),
            //             first column of each owner (W)]
  kNumSaved
};

std::tuple<at::Tensor, std::vector<at::Tensor>>
colwise_lookup(const at::Tensor& local, const at::Tensor& ids, const std::optional<at::Tensor>& offsets,
               const std::optional<at::Tensor>& per_sample_weights, const std::optional<at::Tensor>& status,
               c10::IntArrayRef column_starts, c10::IntArrayRef column_widths, int64_t num_embeddings,
               int64_t padding_idx, int64_t mode, bool int32, bool needs_grad, int64_t fingerprint,
               c10::ArrayRef<double> arguments, int64_t range_code, c10::string_view group_name) {
  check_not_tracing("_colwise_lookup", "communicates over its process group");
  TORCH_CHECK_VALUE(mode >= kEmbedding && mode <= 2, kLookup,
                    ": mode must be -1 (embedding), 0 (sum), 1 (mean) or 2 (max), got ", mode);
  const bool bags = mode != kEmbedding;
  TORCH_CHECK_VALUE(local.dim() == 2 && local.size(0) == num_embeddings, kLookup,
                    ": the weight shard must be [num_embeddings, columns], got ", local.sizes());
  TORCH_CHECK_VALUE(padding_idx >= -1 && padding_idx < num_embeddings, kLookup, ": padding_idx ", padding_idx,
                    " is not a row (or -1)");
  TORCH_CHECK_VALUE(bags == (offsets.has_value() && offsets->defined()), kLookup,
                    ": offsets are given exactly for embedding_bag");
  TORCH_CHECK_TYPE(ids.scalar_type() == at::kLong && ids.dim() == 1, kLookup, ": ids must be 1-D int64, got ",
                   ids.dim(), "-D ", ids.scalar_type());
  TORCH_CHECK_VALUE(ids.device() == local.device(), kLookup, ": ids are on ", ids.device(),
                    ", the weight shard on ", local.device());
  const bool weighted = per_sample_weights.has_value() && per_sample_weights->defined();
  if (weighted) {
    TORCH_CHECK_VALUE(mode == 0 && per_sample_weights->dim() == 1 &&
                          per_sample_weights->numel() == ids.numel() &&
                          per_sample_weights->device() == local.device(),
                      kLookup, ": per_sample_weights must be 1-D, one per id, with mode sum");
  }
  if (bags) {
    TORCH_CHECK_VALUE(offsets->scalar_type() == at::kLong && offsets->dim() == 1 &&
                          offsets->device() == local.device(),
                      kLookup, ": offsets must be 1-D int64 on the weight shard's device");
  }
  const auto pg = comm::resolve_group(std::string(group_name), "_colwise_lookup");
  const int64_t me = pg->getRank();
  const auto world = static_cast<int64_t>(column_starts.size());
  TORCH_CHECK_VALUE(world == pg->getSize() && column_widths.size() == column_starts.size(), kLookup,
                    ": one first column and one width per rank of the group (", pg->getSize(), "), got ",
                    column_starts.size(), " and ", column_widths.size());
  TORCH_CHECK_VALUE(!int32 || num_embeddings <= std::numeric_limits<int32_t>::max(), kLookup,
                    ": int32 ids need fewer than 2**31 rows, got ", num_embeddings);
  for (int64_t r = 0; r < world; ++r) {
    TORCH_CHECK_VALUE(column_starts[r] >= 0 && column_widths[r] >= 0, kLookup, ": negative columns");
  }
  TORCH_CHECK_VALUE(column_widths[me] == local.size(1), kLookup, ": this rank's width ", column_widths[me],
                    " is not its shard's ", local.size(1));
  const auto long_options = ids.options().dtype(at::kLong);
  const c10::ScalarType index = int32 ? at::kInt : at::kLong;

  // 1. The range check (first: the caller's host-side messages run in the same order).
  const at::Tensor failed = num_embeddings ? (ids.lt(0) | ids.ge(num_embeddings)).any() : ids.eq(ids).any();
  const at::Tensor base =
      status.has_value() && status->defined() ? status->to(ids.device()) : at::zeros({}, long_options);
  const at::Tensor verdict = at::where(failed, c10::Scalar(range_code), base);

  // 2. Every rank's bags on every rank.
  std::vector<at::Tensor> parts{bags ? *offsets : ids.narrow(0, 0, 0), ids.to(index)};
  if (weighted) {
    parts.push_back(*per_sample_weights);
  }
  auto [everyone, info] = ops::share_inputs_agreed(parts, fingerprint, static_cast<int64_t>(weighted),
                                                   group_name, arguments, verdict, std::nullopt);
  std::vector<at::Tensor> saved(kNumSaved);
  for (auto& t : saved) {
    t = at::empty({0}, long_options);
  }
  std::vector<int64_t> counts(1 + 3 * world, 0);
  counts[0] = info[0];
  if (info[0] != 0) { // this rank's input failed its check: the caller raises the detailed error
    // Only the counts (the caller tells the failure from the list's length, reading no tensor).
    return {at::empty({0}, local.options()), {at::tensor(counts, at::TensorOptions().dtype(at::kLong))}};
  }
  const auto width = static_cast<int64_t>(parts.size());
  TORCH_CHECK(static_cast<int64_t>(everyone.size()) == world * width, kLookup, ": ", everyone.size(),
              " parts received, expected ", world * width);
  // One set of bags for every requester: ids one after the other, offsets shifted by the ids before.
  std::vector<int64_t> rows_of(world);
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
      all_offsets.push_back(shift ? their_offsets + shift : their_offsets);
    }
    if (weighted) {
      all_weights.push_back(everyone[r * width + 2]);
    }
    shift = layout::checked_add(shift, their_ids.numel(), "torch_shard._colwise_lookup: ids");
  }
  auto joined = [](const std::vector<at::Tensor>& pieces, const at::Tensor& none) {
    return pieces.empty() ? none : (pieces.size() == 1 ? pieces[0] : at::cat(pieces));
  };
  // The kernel takes ids and offsets of one dtype: int32 while the offsets fit (ATen's kernels take
  // both), else int64.
  const c10::ScalarType kernel_index =
      int32 && shift <= std::numeric_limits<int32_t>::max() ? at::kInt : at::kLong;
  const at::Tensor group_ids = joined(all_ids, ids.narrow(0, 0, 0).to(index)).to(kernel_index);
  const at::Tensor group_offsets =
      bags ? joined(all_offsets, offsets->narrow(0, 0, 0)).to(kernel_index) : at::Tensor();
  std::optional<at::Tensor> group_weights;
  if (weighted) {
    group_weights = joined(all_weights, per_sample_weights->narrow(0, 0, 0));
  }
  const int64_t total_rows = ops::checked_total(rows_of);
  const int64_t mine = rows_of[me];

  // 3. One kernel over every requester's bags in this rank's columns.
  const int64_t columns = local.size(1);
  const bool lookup = columns > 0 && group_ids.numel() > 0;
  at::Tensor found;
  if (!lookup) {
    found = at::zeros({total_rows, columns}, local.options());
  } else if (!bags) {
    found = at::embedding(local, group_ids, padding_idx);
  } else if (needs_grad) {
    auto [result, offset2bag, bag_size, max_indices] = at::_embedding_bag(
        local, group_ids, group_offsets, false, mode, false, group_weights, false, padding_idx);
    found = result;
    saved[kOffset2bag] = offset2bag;
    saved[kBagSize] = bag_size;
    saved[kMaxIndices] = max_indices;
  } else {
    found = std::get<0>(at::_embedding_bag_forward_only(local, group_ids, group_offsets, false, mode, false,
                                                        group_weights, false, padding_idx));
  }
  // Requesters with bags but no ids: their bags' rows are the kernel's too (empty bags give 0).
  TORCH_CHECK(found.size(0) == total_rows, kLookup, ": the kernel gave ", found.size(0), " rows, expected ",
              total_rows);

  // 4. Each requester its rows of this block; the blocks side by side in column order.
  // Rows of this rank's columns out, this rank's rows of each owner's columns in.
  std::vector<int64_t> send(world), recv(world);
  for (int64_t r = 0; r < world; ++r) {
    send[r] = layout::checked_mul(rows_of[r], columns, "torch_shard._colwise_lookup: elements");
    recv[r] = layout::checked_mul(mine, column_widths[r], "torch_shard._colwise_lookup: elements");
  }
  const at::Tensor back =
      world == 1 ? found.reshape({-1}) : ops::all_to_all_counts(found.reshape({-1}), send, recv, group_name);
  std::vector<std::pair<int64_t, int64_t>> order; // (first column, owner)
  std::vector<int64_t> first_element(world);
  int64_t at = 0;
  for (int64_t o = 0; o < world; ++o) {
    order.emplace_back(column_starts[o], o);
    first_element[o] = at;
    at += mine * column_widths[o];
  }
  std::sort(order.begin(), order.end());
  std::vector<at::Tensor> blocks;
  for (const auto& [first, o] : order) {
    if (column_widths[o]) {
      blocks.push_back(
          back.narrow(0, first_element[o], mine * column_widths[o]).view({mine, column_widths[o]}));
    }
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
  for (int64_t r = 0; r < world; ++r) {
    counts[1 + r] = rows_of[r];
    counts[1 + world + r] = column_widths[r];
    counts[1 + 2 * world + r] = column_starts[r];
  }
  saved[kCounts] = at::tensor(counts, at::TensorOptions().dtype(at::kLong));
  std::vector<at::Tensor> outputs{out};
  ops::copy_aliases(outputs,
                    {local, ids, offsets.value_or(at::Tensor()), per_sample_weights.value_or(at::Tensor())});
  ops::copy_aliases(saved,
                    {local, ids, offsets.value_or(at::Tensor()), per_sample_weights.value_or(at::Tensor())});
  return {outputs[0], saved};
}

at::Tensor colwise_lookup_backward(const at::Tensor& grad, at::TensorList saved, int64_t rows,
                                   int64_t padding_idx, int64_t mode, c10::string_view group_name) {
  check_not_tracing("_colwise_lookup_backward", "communicates over its process group");
  TORCH_CHECK_VALUE(saved.size() == kNumSaved, kLookupBackward, ": expected ",
                    static_cast<int64_t>(kNumSaved), " saved tensors, got ", saved.size());
  TORCH_CHECK_VALUE(mode >= kEmbedding && mode <= 2, kLookupBackward, ": bad mode ", mode);
  TORCH_CHECK_VALUE(grad.dim() == 2 && rows >= 0, kLookupBackward, ": grad must be 2-D, got ", grad.sizes());
  const auto pg = comm::resolve_group(std::string(group_name), "_colwise_lookup_backward");
  const int64_t me = pg->getRank();
  const at::Tensor counts = saved[kCounts].contiguous();
  const int64_t world = pg->getSize();
  TORCH_CHECK_VALUE(counts.is_cpu() && counts.scalar_type() == at::kLong && counts.numel() == 1 + 3 * world,
                    kLookupBackward, ": malformed counts");
  const int64_t* c = counts.const_data_ptr<int64_t>();
  const std::vector<int64_t> rows_of(c + 1, c + 1 + world), widths(c + 1 + world, c + 1 + 2 * world),
      starts(c + 1 + 2 * world, c + 1 + 3 * world);
  const int64_t total_rows = ops::checked_total(rows_of);
  const int64_t mine = rows_of[me], columns = widths[me];
  TORCH_CHECK_VALUE(grad.size(0) == mine, kLookupBackward, ": grad has ", grad.size(0), " rows, expected ",
                    mine);
  // Each owner the gradient of its columns (the reverse of the forward's exchange).
  std::vector<at::Tensor> pieces;
  for (int64_t o = 0; o < world; ++o) {
    if (widths[o] == 0) { // an empty block's offset may lie past the last column
      pieces.push_back(grad.new_empty({0}));
      continue;
    }
    TORCH_CHECK_VALUE(starts[o] >= 0 && widths[o] > 0 &&
                          layout::checked_add(starts[o], widths[o], "columns") <= grad.size(1),
                      kLookupBackward, ": rank ", o, "'s columns are outside grad's ", grad.size(1));
    pieces.push_back(grad.narrow(1, starts[o], widths[o]).reshape({-1}));
  }
  std::vector<int64_t> send(world), recv(world);
  for (int64_t o = 0; o < world; ++o) {
    send[o] = layout::checked_mul(mine, widths[o], "elements");
    recv[o] = layout::checked_mul(rows_of[o], columns, "elements");
  }
  const at::Tensor flat = world == 1 ? pieces[0] : at::cat(pieces);
  const at::Tensor got =
      (world == 1 ? flat : ops::all_to_all_counts(flat, send, recv, group_name)).view({total_rows, columns});
  const at::Tensor& ids = saved[kIds];
  const bool lookup = columns > 0 && ids.numel() > 0 && rows > 0;
  if (!lookup) {
    return at::zeros({rows, columns}, grad.options());
  }
  if (mode == kEmbedding) {
    TORCH_CHECK_VALUE(ids.numel() == total_rows, kLookupBackward, ": saved ids do not match the counts");
    return at::embedding_dense_backward(got, ids, rows, padding_idx, /*scale_grad_by_freq=*/false);
  }
  TORCH_CHECK_VALUE(saved[kOffsets].numel() <= total_rows &&
                        saved[kOffsets].scalar_type() == ids.scalar_type(),
                    kLookupBackward, ": saved offsets do not match the counts");
  const at::Tensor& weights = saved[kWeights];
  // _embedding_bag_backward rebuilds offset2bag where the CPU forward left it empty (sum mode).
  return at::_embedding_bag_backward(
      got, ids, saved[kOffsets], saved[kOffset2bag], saved[kBagSize], saved[kMaxIndices], rows,
      /*scale_grad_by_freq=*/false, mode,
      /*sparse=*/false, weights.numel() ? std::optional<at::Tensor>(weights) : std::nullopt, padding_idx);
}

} // namespace

TORCH_LIBRARY_IMPL(torch_shard, CPU, m) {
  m.impl("_colwise_lookup", TORCH_FN(colwise_lookup));
  m.impl("_colwise_lookup_backward", TORCH_FN(colwise_lookup_backward));
}

TORCH_LIBRARY_IMPL(torch_shard, CUDA, m) {
  m.impl("_colwise_lookup", TORCH_FN(colwise_lookup));
  m.impl("_colwise_lookup_backward", TORCH_FN(colwise_lookup_backward));
}

} // namespace torch_shard
