// A row-wise sharded lookup (F.embedding, F.embedding_bag sum / mean / max) as ONE C++ call per forward
// and one per backward.
//
// NOTE [ A row-wise lookup in one call ]
// torch_shard._rowwise_lookup does, for one rank, everything between its Python argument checks and its
// result (NOTE [ Ids only to their owners ] in
// torch_shard/sharding_spec/chunk_sharding_spec_ops/_routing.py has the protocol):
//   1. the requester buckets its ids by owner: fused loops on the CPU (torch_shard._bucket_ids), an ATen
//      composition on other devices that reads no device memory on the host;
//   2. the agreement (torch_shard._share_inputs.with_words): every rank's checks, layout and arguments,
//      and the word each rank tells each owner (how many of its ids the owner holds, and its bags);
//      the only host read of device memory in the forward;
//   3. one all-to-all carries each owner its ids (and, for bags, their per-bag lengths), one more the
//      per-sample weights when given;
//   4. the owner looks every requester's ids up in ONE kernel (ATen's embedding, or _embedding_bag in
//      sum mode; for max our _embedding_bag_partial: NOTE [ Max over owners ]), never on an empty shard
//      or with no ids (NOTE [ Empty shards reach no embedding kernel ] in _common.py);
//   5. one all-to-all returns each requester its rows (embedding) or its bags' partial results, which it
//      puts in place (embedding), adds up and divides (sum, mean) or takes from one owner (max).
// It returns the result and what the backward needs (`saved`). _rowwise_lookup_backward sends the
// output's gradient to the owners (the reverse of 5) and runs the lookup kernel's backward there: one
// call too. Autograd connects them (torch_shard/_op_registrations.py). One rank: no all-to-all at all.
// max_norm keeps the composed path in Python: it rewrites the weight shard in place between 3 and 4,
// which a functional op may not do.
//
// NOTE [ Idle owners ]
// An owner that holds none of a requester's ids contributes nothing to its bags, and both sides know it
// from the agreement (the word is 0 in the count bits). So the requester sends it no per-bag lengths,
// it pools no bags for that requester, and it sends nothing back: the requester adds up only the
// owners it sent ids to. With many ranks and few ids per rank most owners are idle for most requesters.

#include <algorithm>
#include <limits>
#include <numeric>
#include <tuple>
#include <vector>

#include <ATen/TensorOperators.h>
#include <ATen/ops/_embedding_bag.h>
#include <ATen/ops/_embedding_bag_backward.h>
#include <ATen/ops/_embedding_bag_forward_only.h>
#include <ATen/ops/arange.h>
#include <ATen/ops/argsort.h>
#include <ATen/ops/bucketize.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/cumsum.h>
#include <ATen/ops/embedding.h>
#include <ATen/ops/embedding_dense_backward.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/full.h>
#include <ATen/ops/ones_like.h>
#include <ATen/ops/tensor.h>
#include <ATen/ops/where.h>
#include <ATen/ops/zeros.h>
#include <ATen/ops/zeros_like.h>
#include <c10/util/Exception.h>
#include <torch/library.h>

#include "layout/box.h"
#include "ops/lookup_parts.h"
#include "ops/untraceable.h"

namespace torch_shard {
namespace {

constexpr const char* kLookup = "torch_shard._rowwise_lookup";
constexpr const char* kLookupBackward = "torch_shard._rowwise_lookup_backward";
constexpr int64_t kBagsShift = 32;

// `mode`: what the caller looks up.
constexpr int64_t kEmbedding = -1; // F.embedding: one row per id
constexpr int64_t kSum = 0;        // F.embedding_bag(mode="sum")
constexpr int64_t kMean = 1;       // F.embedding_bag(mode="mean")
constexpr int64_t kMax = 2;        // F.embedding_bag(mode="max")

// `saved` (the forward's second output, the backward's input), by position.
enum Saved : size_t {
  kIds = 0,    // the ids this rank owns, every requester's, less its first row (index dtype)
  kOffsets,    // bags: their offsets into kIds
  kOffset2bag, // bags: _embedding_bag's, for its backward (empty when no kernel ran)
  kBagSize,
  kMaxIndices,
  kWeights,  // the per-sample weights of kIds (empty without)
  kPerm,     // requester: its ids in owner order (positions in its ids)
  kDivisors, // mean: each bag's divisor (int64)
  kChosen,   // max: per output element, which of the owners that sent results won (int64)
  kCounts,   // CPU int64: [own status, counts_in (W), counts_out (W), bags_in (W), bags]
  kNumSaved
};

// A small host vector on `device` with no host sync: a copy to a GPU from pinned memory does not wait.
at::Tensor to_device(const std::vector<int64_t>& values, c10::Device device) {
  at::Tensor host = at::tensor(values, at::TensorOptions().dtype(at::kLong));
  if (device.is_cpu()) {
    return host;
  }
  if (device.is_cuda()) {
    host = host.pin_memory();
  }
  return host.to(device, /*non_blocking=*/true);
}

// What a requester prepared before the agreement.
struct Prepared {
  at::Tensor send;     // loops: the whole send buffer; composition: its ids in owner order
  at::Tensor lengths;  // composition, bags: [W, bags] ids of each bag per owner (index dtype)
  at::Tensor perm;     // positions of the ids in owner order
  at::Tensor words;    // told to the owners with the agreement
  at::Tensor status;   // this rank's input check, the range check first
  at::Tensor divisors; // mean: per bag
};

// The ATen composition of torch_shard._bucket_ids (for every device; the CPU takes the loops).
Prepared prepare_composed(const at::Tensor& ids, const std::optional<at::Tensor>& offsets,
                          c10::IntArrayRef row_ranges, int64_t num_embeddings, c10::ScalarType index,
                          int64_t range_code, const std::optional<at::Tensor>& status, int64_t padding_idx,
                          bool mean) {
  const auto world = static_cast<int64_t>(row_ranges.size() / 2);
  const bool bags = offsets.has_value() && offsets->defined();
  const int64_t n = ids.numel();
  const int64_t num_bags = bags ? offsets->numel() : 0;
  const auto long_options = ids.options().dtype(at::kLong);
  std::vector<std::pair<int64_t, int64_t>> owned; // (first row, rank) of the non-empty ranges
  for (int64_t r = 0; r < world; ++r) {
    if (row_ranges[2 * r + 1] > row_ranges[2 * r]) {
      owned.emplace_back(row_ranges[2 * r], r);
    }
  }
  std::sort(owned.begin(), owned.end());
  at::Tensor owner;
  if (owned.empty()) {
    owner = at::zeros_like(ids);
  } else {
    std::vector<int64_t> table;
    for (const auto& pair : owned) {
      table.push_back(pair.first);
    }
    for (const auto& pair : owned) {
      table.push_back(pair.second);
    }
    const at::Tensor both = to_device(table, ids.device()).view({2, -1});
    // Row ranges tile [0, rows): the last start at or before an id is its range (the first range for
    // ids below every start: an out-of-range id still names a rank, and fails the range check below).
    const at::Tensor range =
        (at::bucketize(ids, both[0], /*out_int32=*/false, /*right=*/true) - 1).clamp_min(0);
    owner = both[1].index_select(0, range);
  }
  Prepared out;
  const at::Tensor counts = at::zeros({world}, long_options).index_add_(0, owner, at::ones_like(owner));
  at::Tensor bag;
  if (bags && num_bags) {
    // Unchecked offsets (their verdict travels with the agreement) must still give bags in range.
    bag = (at::bucketize(at::arange(n, long_options), *offsets, false, true) - 1).clamp(0, num_bags - 1);
    const at::Tensor key = owner * num_bags + bag;
    out.lengths = at::zeros({world * num_bags}, ids.options().dtype(index))
                      .index_add_(0, key, at::ones_like(key, key.options().dtype(index)))
                      .view({world, num_bags});
  }
  out.words = bags ? counts + (num_bags << kBagsShift) : counts;
  out.perm = at::argsort(owner, /*stable=*/true, /*dim=*/0, /*descending=*/false);
  out.send = ids.index_select(0, out.perm).to(index);
  const at::Tensor failed = num_embeddings ? (ids.lt(0) | ids.ge(num_embeddings)).any() : ids.eq(ids).any();
  const at::Tensor base =
      status.has_value() && status->defined() ? status->to(ids.device()) : at::zeros({}, long_options);
  out.status = at::where(failed, c10::Scalar(range_code), base);
  if (mean && num_bags) {
    const at::Tensor keep = padding_idx >= 0 ? ids.ne(padding_idx).to(at::kLong) : at::ones_like(ids);
    out.divisors = at::zeros({num_bags}, long_options).index_add_(0, bag, keep).clamp_min(1);
  }
  return out;
}

// NOTE [ Max over owners ]
// Max mode: each owner pools the maximum of the ids it holds with torch_shard._embedding_bag_partial,
// which also reports, per output element, the POSITION of its winner among the ids it received (-1 for
// none). Both travel back (the positions as int32, relative to what that requester sent). The requester
// maps the positions back to its own ids (through its owner order, `perm`) and takes each element from
// ONE owner: among those holding the overall maximum, the one whose winner comes first in the bag, the
// dense op's choice (NOTE [ Max ties ] in csrc/ops/embedding_ops.cpp); 0 where no owner holds an id.
// `chosen` (saved) says which owner that was, so the backward sends each owner the gradient of exactly
// the elements it won.
at::Tensor max_over_owners(const at::Tensor& local, const at::Tensor& local_ids,
                           const at::Tensor& local_offsets, const at::Tensor& perm,
                           const std::vector<int64_t>& counts_in, const std::vector<int64_t>& counts_out,
                           const std::vector<int64_t>& bags_in, int64_t num_bags, int64_t owned,
                           int64_t local_pad, bool lookup, c10::string_view group_name,
                           std::vector<at::Tensor>& saved) {
  const auto world = static_cast<int64_t>(counts_in.size());
  const int64_t dim = local.size(1);
  const int64_t pooled_bags = ops::checked_total(bags_in);
  const auto long_options = local.options().dtype(at::kLong);
  const at::Tensor ids = local_ids.to(at::kLong), offsets = local_offsets.to(at::kLong);
  at::Tensor pooled, where;
  if (lookup) {
    std::tie(pooled, where) = ops::embedding_bag_partial(local, ids, offsets, std::nullopt, /*row_start=*/0,
                                                         "max", local_pad, /*fused=*/true, owned);
  } else {
    pooled = at::zeros({pooled_bags, dim}, local.options());
    where = at::full({pooled_bags, dim}, -1, long_options);
  }
  // Positions among the ids each requester sent here: less the ids of the requesters before it.
  std::vector<int64_t> firsts;
  firsts.reserve(static_cast<size_t>(pooled_bags));
  int64_t first = 0;
  for (int64_t r = 0; r < world; ++r) {
    firsts.insert(firsts.end(), static_cast<size_t>(bags_in[r]), first);
    first += counts_in[r];
  }
  const at::Tensor relative =
      (pooled_bags ? at::where(where.ge(0), where - to_device(firsts, local.device()).unsqueeze(1), where)
                   : where)
          .to(at::kInt);
  std::vector<int64_t> back_rows(world), block_first;
  int64_t at = 0;
  for (int64_t o = 0; o < world; ++o) {
    back_rows[o] = counts_out[o] > 0 ? num_bags : 0;
    if (counts_out[o] > 0) {
      block_first.push_back(at); // where owner o's ids start among this rank's ids in owner order
    }
    at += counts_out[o];
  }
  const auto senders = static_cast<int64_t>(block_first.size());
  const at::Tensor values = ops::move_rows(pooled, bags_in, back_rows, group_name);
  const at::Tensor positions = ops::move_rows(relative, bags_in, back_rows, group_name);
  saved[kIds] = ids;
  saved[kOffsets] = offsets;
  saved[kMaxIndices] = where;
  if (senders == 0) {
    saved[kChosen] = at::zeros({num_bags, dim}, long_options);
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
  saved[kChosen] = chosen.squeeze(0);
  const at::Tensor out = vals.gather(0, chosen).squeeze(0);
  return at::where(winner.squeeze(0).eq(std::numeric_limits<int64_t>::max()), 0, out);
}

std::tuple<at::Tensor, std::vector<at::Tensor>>
rowwise_lookup(const at::Tensor& local, const at::Tensor& ids, const std::optional<at::Tensor>& offsets,
               const std::optional<at::Tensor>& per_sample_weights, const std::optional<at::Tensor>& status,
               c10::IntArrayRef row_ranges, int64_t num_embeddings, int64_t row_start, int64_t padding_idx,
               int64_t mode, bool int32, bool needs_grad, bool loops, int64_t fingerprint,
               c10::ArrayRef<double> arguments, int64_t range_code, c10::string_view group_name) {
  check_not_tracing("_rowwise_lookup", "communicates over its process group");
  const bool bags = mode != kEmbedding;
  TORCH_CHECK_VALUE(mode >= kEmbedding && mode <= kMax, kLookup,
                    ": mode must be -1 (embedding), 0 (sum), 1 (mean) or 2 (max), got ", mode);
  TORCH_CHECK_VALUE(local.dim() == 2, kLookup, ": the weight shard must be 2-D, got ", local.sizes());
  TORCH_CHECK_VALUE(bags == (offsets.has_value() && offsets->defined()), kLookup,
                    ": offsets are given exactly for embedding_bag");
  TORCH_CHECK_TYPE(ids.scalar_type() == at::kLong && ids.dim() == 1, kLookup, ": ids must be 1-D int64, got ",
                   ids.dim(), "-D ", ids.scalar_type());
  TORCH_CHECK_VALUE(ids.device() == local.device(), kLookup, ": ids are on ", ids.device(),
                    ", the weight shard on ", local.device());
  const bool weighted = per_sample_weights.has_value() && per_sample_weights->defined();
  if (weighted) {
    TORCH_CHECK_VALUE(bags && mode == kSum && per_sample_weights->dim() == 1 &&
                          per_sample_weights->numel() == ids.numel() &&
                          per_sample_weights->device() == local.device(),
                      kLookup, ": per_sample_weights must be 1-D, one per id, with mode sum");
  }
  if (bags) {
    TORCH_CHECK_VALUE(offsets->scalar_type() == at::kLong && offsets->dim() == 1 &&
                          offsets->device() == local.device(),
                      kLookup, ": offsets must be 1-D int64 on the weight shard's device");
    TORCH_CHECK_VALUE(ids.numel() == 0 || offsets->numel() > 0, kLookup, ": ids without bags");
  }
  const auto world = static_cast<int64_t>(row_ranges.size() / 2);
  TORCH_CHECK_VALUE(world >= 1 && row_ranges.size() % 2 == 0, kLookup,
                    ": row_ranges must hold a (first, end) pair per rank");
  const int64_t rows = local.size(0), dim = local.size(1);
  TORCH_CHECK_VALUE(row_start >= 0 &&
                        layout::checked_add(row_start, rows, "row_start + rows") <= num_embeddings,
                    kLookup, ": the shard's rows [", row_start, ", ", row_start + rows,
                    ") are not within [0, ", num_embeddings, ")");
  const int64_t n = ids.numel();
  const int64_t num_bags = bags ? offsets->numel() : 0;
  const c10::ScalarType index = int32 ? at::kInt : at::kLong;
  const auto long_options = ids.options().dtype(at::kLong);

  // 1. The requester's ids by owner.
  const bool use_loops = loops && ids.is_cpu();
  Prepared mine;
  if (use_loops) {
    auto [send, perm, words, verdict, divisors] =
        ops::bucket_ids(ids, offsets, row_ranges, num_embeddings, int32, range_code, status, padding_idx,
                        /*lengths_for_idle=*/false);
    mine.send = send;
    mine.perm = perm;
    mine.words = words;
    mine.status = verdict;
    mine.divisors = divisors;
  } else {
    TORCH_CHECK_VALUE(!int32 || num_embeddings <= std::numeric_limits<int32_t>::max(), kLookup,
                      ": int32 ids need fewer than 2**31 rows, got ", num_embeddings);
    mine = prepare_composed(ids, offsets, row_ranges, num_embeddings, index, range_code, status, padding_idx,
                            mode == kMean);
  }

  // 2. The agreement, with the words.
  std::vector<at::Tensor> none{ids.narrow(0, 0, 0)};
  auto [unused, info] = ops::share_inputs_agreed(none, fingerprint, static_cast<int64_t>(weighted),
                                                 group_name, arguments, mine.status, mine.words);
  std::vector<at::Tensor> saved(kNumSaved);
  for (auto& t : saved) {
    t = at::empty({0}, long_options);
  }
  std::vector<int64_t> counts(1 + 3 * world + 1, 0);
  counts[0] = info[0];
  if (info[0] != 0) { // this rank's input failed its check: the caller raises the detailed error
    // Only the counts (the caller tells the failure from the list's length, reading no tensor).
    return {at::empty({0}, local.options()), {at::tensor(counts, at::TensorOptions().dtype(at::kLong))}};
  }
  std::vector<int64_t> counts_in(world), counts_out(world), bags_in(world), send_ids(world), recv_ids(world);
  std::vector<bool> busy_in(world), busy_out(world);
  constexpr int64_t kLow = (int64_t{1} << kBagsShift) - 1;
  for (int64_t r = 0; r < world; ++r) {
    counts_in[r] = bags ? info[1 + r] & kLow : info[1 + r];
    bags_in[r] = bags ? info[1 + r] >> kBagsShift : 0;
    counts_out[r] = bags ? info[1 + world + r] & kLow : info[1 + world + r];
    busy_in[r] = counts_in[r] > 0;
    busy_out[r] = counts_out[r] > 0;
    // NOTE [ Idle owners ]: lengths go only with ids.
    const int64_t lengths_in = busy_in[r] ? bags_in[r] : 0;
    send_ids[r] = counts_out[r] + (busy_out[r] ? num_bags : 0);
    recv_ids[r] = counts_in[r] + lengths_in;
    if (!busy_in[r]) {
      bags_in[r] = 0; // no ids from r: none of its bags is pooled here
    }
    counts[1 + r] = counts_in[r];
    counts[1 + world + r] = counts_out[r];
    counts[1 + 2 * world + r] = bags_in[r];
  }
  counts[1 + 3 * world] = num_bags;
  const int64_t owned = ops::checked_total(counts_in), pooled_bags = ops::checked_total(bags_in);

  // 3. Each owner its ids (with their lengths), then their per-sample weights.
  if (!use_loops && bags) {
    std::vector<at::Tensor> pieces;
    int64_t at = 0;
    for (int64_t o = 0; o < world; ++o) {
      if (busy_out[o]) {
        pieces.push_back(mine.send.narrow(0, at, counts_out[o]));
        pieces.push_back(mine.lengths[o]);
      }
      at += counts_out[o];
    }
    mine.send = pieces.empty() ? mine.send.narrow(0, 0, 0) : at::cat(pieces);
  }
  const at::Tensor received = ops::move_rows(mine.send, send_ids, recv_ids, group_name);
  at::Tensor local_ids, local_offsets;
  if (!bags) {
    local_ids = received - row_start;
  } else if (use_loops) {
    std::tie(local_ids, local_offsets) = ops::unpack_routed(received, counts_in, bags_in, row_start);
  } else {
    std::vector<at::Tensor> id_parts, length_parts;
    int64_t at = 0;
    for (int64_t r = 0; r < world; ++r) {
      id_parts.push_back(received.narrow(0, at, counts_in[r]));
      length_parts.push_back(received.narrow(0, at + counts_in[r], bags_in[r]));
      at += recv_ids[r];
    }
    local_ids = at::cat(id_parts) - row_start;
    const at::Tensor lengths = at::cat(length_parts);
    local_offsets = at::cumsum(lengths, 0, index) - lengths;
  }
  std::optional<at::Tensor> local_weights;
  if (weighted) {
    local_weights =
        ops::move_rows(per_sample_weights->index_select(0, mine.perm), counts_out, counts_in, group_name);
  }

  // 4. One lookup kernel over every requester's ids, never on an empty shard or with no ids.
  const int64_t local_pad =
      padding_idx >= row_start && padding_idx < row_start + rows ? padding_idx - row_start : -1;
  const bool lookup = owned > 0 && local.numel() > 0;
  at::Tensor out;
  if (!bags) {
    const at::Tensor found =
        lookup ? at::embedding(local, local_ids, local_pad) : at::zeros({owned, dim}, local.options());
    // 5. Each requester its rows, put where its ids were (perm is a permutation: every row is written).
    const at::Tensor back = ops::move_rows(found, counts_in, counts_out, group_name);
    out = at::empty({n, dim}, local.options()).index_copy_(0, mine.perm, back);
  } else if (mode == kMax) {
    out = max_over_owners(local, local_ids, local_offsets, mine.perm, counts_in, counts_out, bags_in,
                          num_bags, owned, local_pad, lookup, group_name, saved);
  } else {
    at::Tensor pooled;
    if (!lookup) {
      pooled = at::zeros({pooled_bags, dim}, local.options());
    } else if (needs_grad) {
      auto [result, offset2bag, bag_size, max_indices] =
          at::_embedding_bag(local, local_ids, local_offsets, /*scale_grad_by_freq=*/false, /*mode=*/0,
                             /*sparse=*/false, local_weights, /*include_last_offset=*/false, local_pad);
      pooled = result;
      saved[kOffset2bag] = offset2bag;
      saved[kBagSize] = bag_size;
      saved[kMaxIndices] = max_indices;
    } else {
      pooled = std::get<0>(at::_embedding_bag_forward_only(local, local_ids, local_offsets, false, 0, false,
                                                           local_weights, false, local_pad));
    }
    // 5. Each requester its bags' partial sums from the owners it sent ids to (NOTE [ Idle owners ]).
    std::vector<int64_t> back_rows(world);
    int64_t senders = 0;
    for (int64_t o = 0; o < world; ++o) {
      back_rows[o] = busy_out[o] ? num_bags : 0;
      senders += busy_out[o];
    }
    const at::Tensor back = ops::move_rows(pooled, bags_in, back_rows, group_name);
    if (senders == 0) {
      out = at::zeros({num_bags, dim}, local.options());
    } else if (senders == 1) {
      out = back.view({num_bags, dim});
    } else {
      out = back.view({senders, num_bags, dim}).sum(0);
    }
    if (mode == kMean && num_bags) {
      out = out / mine.divisors.unsqueeze(1).to(out.scalar_type());
    }
  }
  if (needs_grad && mode != kMax) { // max saved its own (int64, for _embedding_bag_partial)
    saved[kIds] = local_ids;
    if (bags) {
      saved[kOffsets] = local_offsets;
    }
    if (weighted) {
      saved[kWeights] = *local_weights;
    }
    saved[kPerm] = mine.perm;
    if (mode == kMean && mine.divisors.defined()) {
      saved[kDivisors] = mine.divisors;
    }
  }
  saved[kCounts] = at::tensor(counts, at::TensorOptions().dtype(at::kLong));
  std::vector<at::Tensor> outputs{out};
  ops::copy_aliases(outputs,
                    {local, ids, offsets.value_or(at::Tensor()), per_sample_weights.value_or(at::Tensor())});
  ops::copy_aliases(saved,
                    {local, ids, offsets.value_or(at::Tensor()), per_sample_weights.value_or(at::Tensor())});
  return {outputs[0], saved};
}

at::Tensor rowwise_lookup_backward(const at::Tensor& grad, at::TensorList saved, int64_t rows,
                                   int64_t row_start, int64_t padding_idx, int64_t mode,
                                   c10::string_view group_name) {
  check_not_tracing("_rowwise_lookup_backward", "communicates over its process group");
  TORCH_CHECK_VALUE(saved.size() == kNumSaved, kLookupBackward, ": expected ",
                    static_cast<int64_t>(kNumSaved), " saved tensors, got ", saved.size());
  TORCH_CHECK_VALUE(mode >= kEmbedding && mode <= kMax, kLookupBackward, ": bad mode ", mode);
  TORCH_CHECK_VALUE(grad.dim() == 2, kLookupBackward, ": grad must be 2-D, got ", grad.sizes());
  const at::Tensor counts = saved[kCounts].contiguous();
  TORCH_CHECK_VALUE(counts.is_cpu() && counts.scalar_type() == at::kLong && (counts.numel() - 2) % 3 == 0 &&
                        counts.numel() >= 5,
                    kLookupBackward, ": malformed counts");
  const int64_t* c = counts.const_data_ptr<int64_t>();
  const int64_t world = (counts.numel() - 2) / 3;
  const std::vector<int64_t> counts_in(c + 1, c + 1 + world), counts_out(c + 1 + world, c + 1 + 2 * world),
      bags_in(c + 1 + 2 * world, c + 1 + 3 * world);
  const int64_t num_bags = c[1 + 3 * world];
  const int64_t dim = grad.size(1);
  const int64_t owned = ops::checked_total(counts_in);
  const at::Tensor& ids = saved[kIds];
  TORCH_CHECK_VALUE(ids.numel() == owned && rows >= 0, kLookupBackward,
                    ": saved ids do not match the counts");
  const int64_t local_pad =
      padding_idx >= row_start && padding_idx < row_start + rows ? padding_idx - row_start : -1;
  const bool lookup = owned > 0 && rows > 0 && dim > 0;
  if (mode == kEmbedding) {
    const at::Tensor& perm = saved[kPerm];
    TORCH_CHECK_VALUE(grad.size(0) == perm.numel() && ops::checked_total(counts_out) == perm.numel(),
                      kLookupBackward, ": grad must have one row per id");
    // Each row's gradient to the owner of its id (the reverse of the forward's return).
    const at::Tensor got = ops::move_rows(grad.index_select(0, perm), counts_out, counts_in, group_name);
    if (!lookup) {
      return at::zeros({rows, dim}, grad.options());
    }
    return at::embedding_dense_backward(got, ids, rows, local_pad, /*scale_grad_by_freq=*/false);
  }
  TORCH_CHECK_VALUE(grad.size(0) == num_bags, kLookupBackward, ": grad must have one row per bag (", num_bags,
                    "), got ", grad.sizes());
  TORCH_CHECK_VALUE(saved[kOffsets].numel() == ops::checked_total(bags_in) &&
                        saved[kOffsets].scalar_type() == ids.scalar_type(),
                    kLookupBackward, ": saved offsets do not match the counts");
  if (mode == kMax) {
    // Each owner the gradient of the elements it won (NOTE [ Max over owners ]), zero elsewhere.
    std::vector<int64_t> send_rows(world);
    int64_t senders = 0;
    for (int64_t o = 0; o < world; ++o) {
      send_rows[o] = counts_out[o] > 0 ? num_bags : 0;
      senders += counts_out[o] > 0;
    }
    const at::Tensor& chosen = saved[kChosen];
    TORCH_CHECK_VALUE(chosen.sizes() == grad.sizes() && chosen.scalar_type() == at::kLong, kLookupBackward,
                      ": saved winners do not match grad");
    const at::Tensor which = at::arange(senders, chosen.options()).view({-1, 1, 1});
    const at::Tensor spread =
        at::where(chosen.unsqueeze(0).eq(which), grad.unsqueeze(0), 0).reshape({-1, dim});
    const at::Tensor got = ops::move_rows(spread, send_rows, bags_in, group_name);
    if (!lookup) {
      return at::zeros({rows, dim}, grad.options());
    }
    return ops::embedding_bag_partial_backward(got.contiguous(), ids, saved[kOffsets], std::nullopt,
                                               saved[kMaxIndices], /*row_start=*/0, rows, "max", local_pad,
                                               owned, /*fused=*/true);
  }
  at::Tensor g = grad;
  if (mode == kMean && num_bags) {
    g = g / saved[kDivisors].unsqueeze(1).to(g.scalar_type());
  }
  // Every owner this rank sent ids to gets its bags' gradient (NOTE [ Idle owners ]).
  std::vector<int64_t> send_rows(world);
  int64_t senders = 0;
  for (int64_t o = 0; o < world; ++o) {
    send_rows[o] = counts_out[o] > 0 ? num_bags : 0;
    senders += counts_out[o] > 0;
  }
  const at::Tensor spread =
      senders > 1 ? g.unsqueeze(0).expand({senders, num_bags, dim}).reshape({-1, dim}) : g;
  const at::Tensor got = ops::move_rows(senders ? spread : g.narrow(0, 0, 0), send_rows, bags_in, group_name);
  if (!lookup) {
    return at::zeros({rows, dim}, grad.options());
  }
  const at::Tensor& weights = saved[kWeights];
  // _embedding_bag_backward, not the dense one: in sum mode the CPU forward may leave offset2bag empty,
  // and this one rebuilds it from the offsets.
  return at::_embedding_bag_backward(
      got.contiguous(), ids, saved[kOffsets], saved[kOffset2bag], saved[kBagSize], saved[kMaxIndices], rows,
      /*scale_grad_by_freq=*/false, /*mode=*/0,
      /*sparse=*/false, weights.numel() ? std::optional<at::Tensor>(weights) : std::nullopt, local_pad);
}

} // namespace

TORCH_LIBRARY_IMPL(torch_shard, CPU, m) {
  m.impl("_rowwise_lookup", TORCH_FN(rowwise_lookup));
  m.impl("_rowwise_lookup_backward", TORCH_FN(rowwise_lookup_backward));
}

TORCH_LIBRARY_IMPL(torch_shard, CUDA, m) {
  m.impl("_rowwise_lookup", TORCH_FN(rowwise_lookup));
  m.impl("_rowwise_lookup_backward", TORCH_FN(rowwise_lookup_backward));
}

} // namespace torch_shard
