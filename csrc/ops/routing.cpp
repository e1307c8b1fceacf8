// Row-wise routing: NOTE [ Ids only to their owners ], NOTE [ Idle owners ] and NOTE [ Requester-side
// routing in one op ] in ops/routing.h.

#include "ops/routing.h"

#include <algorithm>
#include <vector>

#include <ATen/Dispatch.h>
#include <ATen/TensorOperators.h>
#include <ATen/ops/arange.h>
#include <ATen/ops/bucketize.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/cumsum.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/searchsorted.h>
#include <ATen/ops/sort.h>
#include <ATen/ops/zeros.h>
#include <c10/util/Exception.h>

#include "layout/box.h"

namespace torch_shard {
namespace ops {

namespace {

constexpr const char* kRouting = "torch_shard: row-wise routing";

// The non-empty blocks' (first row, rank), by first row.
std::vector<std::pair<int64_t, int64_t>> owned_ranges(const Blocks& rows) {
  std::vector<std::pair<int64_t, int64_t>> owned;
  for (int64_t r = 0; r < rows.world(); ++r) {
    if (rows.sizes[r] > 0) {
      owned.emplace_back(rows.starts[r], r);
    }
  }
  std::sort(owned.begin(), owned.end());
  return owned;
}

// The CPU loops (NOTE [ Requester-side routing in one op ]): one pass for owners, counts and lengths,
// one to lay the ids out by owner.
template <typename index_t>
int64_t bucket_loop(const int64_t* ids, int64_t n, const int64_t* offsets, int64_t num_bags, bool bags,
                    const std::vector<int64_t>& starts, const std::vector<int64_t>& owners, int64_t world,
                    index_t* send, int64_t* perm, int64_t* words, int64_t* divisors, int64_t padding_idx) {
  std::vector<int64_t> owner(static_cast<size_t>(n));
  std::vector<int64_t> count(static_cast<size_t>(world), 0);
  const int64_t stride = bags ? num_bags : 0;
  std::vector<int64_t> lengths(static_cast<size_t>(world * stride), 0);
  int64_t bag = 0;
  for (int64_t i = 0; i < n; ++i) {
    const int64_t id = ids[i];
    int64_t o = 0;
    if (!starts.empty()) {
      // The last owned range starting at or before id (the first one for ids below every start).
      const auto it = std::upper_bound(starts.begin(), starts.end(), id);
      o = owners[static_cast<size_t>(it == starts.begin() ? 0 : (it - starts.begin()) - 1)];
    }
    owner[static_cast<size_t>(i)] = o;
    ++count[static_cast<size_t>(o)];
    if (bags) {
      while (bag + 1 < num_bags && offsets[bag + 1] <= i) {
        ++bag;
      }
      ++lengths[static_cast<size_t>(o * stride + bag)];
      divisors[bag] += id != padding_idx;
    }
  }
  // Where each owner's block (its ids, then its per-bag lengths: NOTE [ Idle owners ], only with ids)
  // starts in `send`, and where its ids start among the sorted positions.
  std::vector<int64_t> block(static_cast<size_t>(world)), first(static_cast<size_t>(world));
  int64_t at = 0, sorted = 0;
  for (int64_t o = 0; o < world; ++o) {
    const int64_t held = count[static_cast<size_t>(o)];
    const int64_t stride_o = held ? stride : 0;
    block[static_cast<size_t>(o)] = at;
    first[static_cast<size_t>(o)] = sorted;
    at += held + stride_o;
    sorted += held;
    words[o] = encode_word(held, num_bags);
    for (int64_t b = 0; b < stride_o; ++b) {
      send[at - stride_o + b] = static_cast<index_t>(lengths[static_cast<size_t>(o * stride + b)]);
    }
  }
  for (int64_t i = 0; i < n; ++i) {
    const auto o = static_cast<size_t>(owner[static_cast<size_t>(i)]);
    send[block[o]++] = static_cast<index_t>(ids[i]);
    perm[first[o]++] = i;
  }
  return at;
}

Bucketed bucket_with_loops(const at::Tensor& ids, const std::optional<at::Tensor>& offsets,
                           const Blocks& rows, c10::ScalarType index, int64_t padding_idx) {
  const bool bags = offsets.has_value();
  const int64_t n = ids.numel();
  const int64_t num_bags = bags ? offsets->numel() : 0;
  const int64_t world = rows.world();
  std::vector<int64_t> starts, owners;
  for (const auto& [first, r] : owned_ranges(rows)) {
    starts.push_back(first);
    owners.push_back(r);
  }
  const int64_t send_size =
      layout::checked_add(n, layout::checked_mul(world, num_bags, kRouting), "torch_shard: ids and lengths");
  const auto long_options = ids.options().dtype(at::kLong);
  Bucketed out;
  out.loops = true;
  out.index = index;
  out.send = at::empty({send_size}, ids.options().dtype(index));
  out.perm = at::empty({n}, long_options);
  out.words = at::empty({world}, long_options);
  out.divisors = at::empty({num_bags}, long_options);
  int64_t* divisor = out.divisors.mutable_data_ptr<int64_t>();
  std::fill(divisor, divisor + num_bags, int64_t{0});
  const at::Tensor flat = ids.contiguous();
  const at::Tensor bag_offsets = bags ? offsets->contiguous() : at::Tensor();
  int64_t sent = 0;
  AT_DISPATCH_INDEX_TYPES(index, kRouting, [&] {
    sent = bucket_loop<index_t>(
        flat.const_data_ptr<int64_t>(), n, bags ? bag_offsets.const_data_ptr<int64_t>() : nullptr, num_bags,
        bags, starts, owners, world, out.send.mutable_data_ptr<index_t>(),
        out.perm.mutable_data_ptr<int64_t>(), out.words.mutable_data_ptr<int64_t>(), divisor, padding_idx);
  });
  if (sent < send_size) {
    out.send = out.send.narrow(0, 0, sent); // idle owners got no lengths
  }
  std::for_each(divisor, divisor + num_bags, [](int64_t& d) { d = std::max(d, int64_t{1}); });
  return out;
}

// The same from ATen ops, reading no device memory on the host. Every id falls in a bucket: one per owned
// range, and two for ids outside the table (below it, at or past its end). Those go to a virtual owner
// `world` that is never sent anything: its count is the input's range check (Bucketed::outside), and an
// input with such ids fails the agreement before any exchange.
Bucketed bucket_composed(const at::Tensor& ids, const RoutedBags& given, const Blocks& rows,
                         c10::ScalarType index, int64_t padding_idx, bool mean, int64_t num_embeddings) {
  const int64_t world = rows.world();
  const bool bags = given.any();
  const int64_t n = ids.numel();
  const int64_t num_bags = bags ? given.count : 0;
  const auto long_options = ids.options().dtype(at::kLong);
  const auto owned = owned_ranges(rows);
  const auto ranges = static_cast<int64_t>(owned.size());
  // One host-to-device copy: the buckets' boundaries (0, each later range's first row, the table's size;
  // a bucket is the number of boundaries at or below an id), then each bucket's owner.
  std::vector<int64_t> table{0};
  for (int64_t k = 1; k < ranges; ++k) {
    table.push_back(owned[static_cast<size_t>(k)].first);
  }
  if (ranges > 0) {
    table.push_back(num_embeddings);
  }
  const auto boundaries = static_cast<int64_t>(table.size());
  table.push_back(world);
  for (const auto& pair : owned) {
    table.push_back(pair.second);
  }
  table.push_back(world);
  const at::Tensor both = to_device(table, ids.device());
  const at::Tensor bucket =
      at::bucketize(ids, both.narrow(0, 0, boundaries), /*out_int32=*/false, /*right=*/true);
  const at::Tensor owner = both.narrow(0, boundaries, boundaries + 1).index_select(0, bucket);
  Bucketed out;
  out.index = index;
  // Each id's key: its owner, and with bags its bag under the owner. Sorted by key (stably: each
  // owner's ids stay in the requester's order), the keys count themselves: how many lie below each
  // value is a search in them.
  const bool by_bag = bags && num_bags > 0;
  at::Tensor bag, key = owner;
  int64_t keys = world + 1;
  if (by_bag && given.length >= 0) {
    // A 2-D input's bag b is its row b.
    key = at::add(at::arange(num_bags, long_options).unsqueeze(1), owner.view({num_bags, given.length}),
                  /*alpha=*/num_bags)
              .view({-1});
    keys = layout::checked_mul(keys, num_bags, kRouting);
  } else if (by_bag) {
    // Bag b holds the ids from offsets[b] on: the number of later bags' starts at or below a position.
    // Unchecked offsets (their verdict travels with the agreement) still give bags in range.
    bag = at::bucketize(at::arange(n, long_options), given.offsets->slice(0, 1), /*out_int32=*/false,
                        /*right=*/true);
    key = at::add(bag, owner, /*alpha=*/num_bags);
    keys = layout::checked_mul(keys, num_bags, kRouting);
  }
  const auto [sorted, perm] = at::sort(key, /*stable=*/true, /*dim=*/0, /*descending=*/false);
  const at::Tensor below = at::searchsorted(sorted, at::arange(keys + 1, long_options)); // keys below j
  const at::Tensor per_owner = below.slice(0, 0, keys + 1, by_bag ? num_bags : 1);
  const at::Tensor counts = per_owner.slice(0, 1) - per_owner.slice(0, 0, world + 1);
  if (by_bag) {
    out.lengths =
        (below.slice(0, 1) - below.slice(0, 0, keys)).view({world + 1, num_bags}).narrow(0, 0, world);
  }
  out.outside = counts.select(0, world);
  out.words = counts.narrow(0, 0, world);
  if (bags) {
    out.words = out.words + (num_bags << kBagsShift);
  }
  out.perm = perm;
  out.send = ids.index_select(0, out.perm);
  if (!bags) {
    out.send = out.send.to(index);
  }
  if (mean && num_bags) {
    out.divisors =
        padding_idx < 0 ? out.lengths.sum(0)
        : given.length >= 0
            ? ids.view({num_bags, given.length}).ne(padding_idx).sum(1)
            : at::zeros({num_bags}, long_options).index_add_(0, bag, ids.ne(padding_idx).to(at::kLong));
    out.divisors.clamp_min_(1);
  }
  return out;
}

} // namespace

Bucketed bucket_ids(const at::Tensor& ids, const RoutedBags& bags, const Blocks& rows, c10::ScalarType index,
                    int64_t padding_idx, bool mean, int64_t num_embeddings) {
  TORCH_INTERNAL_ASSERT(ids.scalar_type() == at::kLong && ids.dim() == 1);
  const std::optional<at::Tensor>& offsets = bags.offsets;
  TORCH_INTERNAL_ASSERT(!offsets.has_value() || (offsets->scalar_type() == at::kLong && offsets->dim() == 1 &&
                                                 offsets->numel() == bags.count));
  TORCH_INTERNAL_ASSERT(bags.length < 0 ||
                        layout::checked_mul(bags.count, bags.length, kRouting) == ids.numel());
  if (loops_for(ids)) {
    TORCH_INTERNAL_ASSERT(offsets.has_value() || bags.length < 0,
                          "the CPU loops route bags by their offsets");
    return bucket_with_loops(ids, offsets, rows, index, padding_idx);
  }
  return bucket_composed(ids, bags, rows, index, padding_idx, mean, num_embeddings);
}

std::vector<int64_t> Routes::send_sizes() const {
  std::vector<int64_t> sizes(world());
  for (int64_t o = 0; o < world(); ++o) {
    sizes[o] = counts_out[o] + (counts_out[o] > 0 && bags ? num_bags : 0);
  }
  return sizes;
}

std::vector<int64_t> Routes::recv_sizes() const {
  std::vector<int64_t> sizes(world());
  for (int64_t r = 0; r < world(); ++r) {
    sizes[r] = counts_in[r] + bags_in[r];
  }
  return sizes;
}

std::vector<int64_t> Routes::back_rows() const {
  std::vector<int64_t> rows(world());
  for (int64_t o = 0; o < world(); ++o) {
    rows[o] = bags ? (counts_out[o] > 0 ? num_bags : 0) : counts_out[o];
  }
  return rows;
}

int64_t Routes::senders() const {
  return std::count_if(counts_out.begin(), counts_out.end(), [](int64_t c) { return c > 0; });
}

Routes routes_from(const std::vector<int64_t>& words_in, const std::vector<int64_t>& words_out, bool bags,
                   int64_t num_bags) {
  const auto world = static_cast<int64_t>(words_in.size());
  TORCH_INTERNAL_ASSERT(static_cast<int64_t>(words_out.size()) == world);
  Routes routes;
  routes.bags = bags;
  routes.num_bags = num_bags;
  routes.counts_in.resize(world);
  routes.counts_out.resize(world);
  routes.bags_in.resize(world);
  for (int64_t r = 0; r < world; ++r) {
    routes.counts_in[r] = word_ids(words_in[r], bags);
    routes.counts_out[r] = word_ids(words_out[r], bags);
    // NOTE [ Idle owners ]: lengths come only with ids; bags without ids here are not pooled here.
    routes.bags_in[r] = routes.counts_in[r] > 0 ? word_bags(words_in[r], bags) : 0;
  }
  return routes;
}

at::Tensor send_buffer(const Bucketed& bucketed, const Routes& routes) {
  if (bucketed.loops || !routes.bags) {
    return bucketed.send;
  }
  std::vector<at::Tensor> pieces;
  int64_t at = 0;
  for (int64_t o = 0; o < routes.world(); ++o) {
    if (routes.counts_out[o] > 0) {
      pieces.push_back(bucketed.send.narrow(0, at, routes.counts_out[o]));
      pieces.push_back(bucketed.lengths[o]);
    }
    at += routes.counts_out[o];
  }
  const at::Tensor send = pieces.empty() ? bucketed.send.narrow(0, 0, 0) : at::cat(pieces);
  return send.to(bucketed.index);
}

std::pair<at::Tensor, at::Tensor> unpack_received(const at::Tensor& received, const Routes& routes,
                                                  int64_t row_start, bool loops) {
  const int64_t total_ids = checked_total(routes.counts_in), total_bags = checked_total(routes.bags_in);
  TORCH_INTERNAL_ASSERT(received.dim() == 1 && received.numel() == total_ids + total_bags);
  if (!routes.bags) {
    return {received - row_start, at::Tensor()};
  }
  if (!loops) {
    std::vector<at::Tensor> id_parts, length_parts;
    int64_t at = 0;
    for (int64_t r = 0; r < routes.world(); ++r) {
      id_parts.push_back(received.narrow(0, at, routes.counts_in[r]));
      length_parts.push_back(received.narrow(0, at + routes.counts_in[r], routes.bags_in[r]));
      at += routes.counts_in[r] + routes.bags_in[r];
    }
    const at::Tensor lengths = at::cat(length_parts);
    return {at::cat(id_parts) - row_start, at::cumsum(lengths, 0, received.scalar_type()) - lengths};
  }
  at::Tensor ids = at::empty({total_ids}, received.options());
  at::Tensor offsets = at::empty({total_bags}, received.options());
  const at::Tensor flat = received.contiguous();
  AT_DISPATCH_INDEX_TYPES(received.scalar_type(), kRouting, [&] {
    const index_t* in = flat.const_data_ptr<index_t>();
    index_t* out_ids = ids.mutable_data_ptr<index_t>();
    index_t* out_offsets = offsets.mutable_data_ptr<index_t>();
    int64_t at = 0, id_at = 0, bag_at = 0;
    for (int64_t r = 0; r < routes.world(); ++r) {
      const int64_t first_id = id_at, count = routes.counts_in[r];
      for (int64_t i = 0; i < count; ++i) {
        out_ids[id_at++] = static_cast<index_t>(static_cast<int64_t>(in[at++]) - row_start);
      }
      // The lengths a checked requester sent add up to its ids; anything else is a bug, never input.
      int64_t position = first_id;
      for (int64_t b = 0; b < routes.bags_in[r]; ++b) {
        const int64_t length = in[at++];
        out_offsets[bag_at++] = static_cast<index_t>(position);
        TORCH_INTERNAL_ASSERT(length >= 0 && length <= first_id + count - position, "rank ", r,
                              "'s bag lengths do not add up to its ", count, " ids");
        position += length;
      }
      TORCH_INTERNAL_ASSERT(routes.bags_in[r] == 0 || position == first_id + count, "rank ", r,
                            "'s bag lengths do not add up to its ", count, " ids");
    }
  });
  return {ids, offsets};
}

} // namespace ops
} // namespace torch_shard
