// Row-wise routing: each id to the rank that owns its row, and the words that size the exchange.
//
// NOTE [ Ids only to their owners ]
// A row-wise requester sorts its ids by owner (stably: each owner's ids stay in the requester's order)
// and sends owner o only the ids o holds, plus, for embedding_bag, how many of them each of its bags
// has (o's per-bag lengths): one all-to-all of ids and lengths, and one of per-sample weights when
// given. Each owner then looks all its requesters' ids up in ONE kernel and sends each requester only
// its bags' partial results (its rows, for embedding), which the requester combines. Per rank and
// forward the ids part sends its own ids once plus one length per bag per owner, whatever the number
// of ranks. The sizes of both all-to-alls are known to every rank without reading device memory: the
// count of a requester's ids for each owner travels with the agreement as a WORD (encode_word), and so,
// for embedding_bag, does the requester's number of bags (the word's high 32 bits). Ids and lengths
// travel as int32 when the table has fewer than 2**31 rows (index_dtype).
//
// NOTE [ Idle owners ]
// An owner that holds none of a requester's ids contributes nothing to its bags, and both sides know it
// from the agreement (the word's count is 0). So the requester sends it no per-bag lengths, it pools no
// bags for that requester, and it sends nothing back: the requester combines only the owners it sent
// ids to. With many ranks and few ids per rank most owners are idle for most requesters.
//
// NOTE [ Requester-side routing in one op ]
// A requester's preparation (the owner of each id, each owner's per-bag lengths, the ids in owner order
// with each owner's lengths after them, the words, mean's divisors) is one pass over its ids on the
// CPU, instead of some twenty small ATen ops: the loops read the ids on the host. Every other device
// takes an ATen composition with the same results, which reads no device memory on the host (NOTE
// [ One host read per exchange ]); cpu_loops() off runs that composition on the CPU too (for tests).
// The input has NOT been checked yet (its verdict travels with the agreement that follows), so ids out
// of range and ill-formed offsets must leave every index in bounds: an id outside the table goes to the
// nearest owned range (loops) or to no owner (the composition, which counts those ids as the input's
// range check: Bucketed::outside), an id before the first offset to bag 0.
#pragma once

#include <cstdint>
#include <optional>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>
#include <c10/core/ScalarType.h>

#include "ops/lookup_common.h"

namespace torch_shard {
namespace ops {

// A requester's word to an owner: how many of its ids the owner holds, and (bags) its number of bags.
constexpr int kBagsShift = 32;
inline int64_t encode_word(int64_t ids, int64_t bags) {
  return ids + (bags << kBagsShift);
}
inline int64_t word_ids(int64_t word, bool bags) {
  return bags ? word & ((int64_t{1} << kBagsShift) - 1) : word;
}
inline int64_t word_bags(int64_t word, bool bags) {
  return bags ? word >> kBagsShift : 0;
}

// A requester's ids, bucketed by owner.
struct Bucketed {
  bool loops = false;                // prepared by the CPU loops (else the ATen composition)
  c10::ScalarType index = at::kLong; // the dtype ids and lengths travel as (index_dtype)
  at::Tensor send;     // loops: the send buffer (each owner of some ids: its ids, then its per-bag
                       // lengths), index dtype; composition: the ids in owner order (int64 with bags:
                       // send_buffer converts them along with the lengths)
  at::Tensor lengths;  // composition with bags: [world, bags], each owner's ids per bag (int64)
  at::Tensor perm;     // the positions of the ids in owner order (int64)
  at::Tensor words;    // [world] int64: what each owner is told with the agreement
  at::Tensor divisors; // mean: each bag's ids other than padding_idx, at least 1 (int64)
  at::Tensor outside;  // composition: 0-dim int64, how many ids lie outside the table (the range check)
};

// A requester's bags as its routing sees them: none (F.embedding, and max, whose ids travel without
// their bags), `count` bags given by their starts, or (a 2-D input) `count` bags of `length` ids each.
struct RoutedBags {
  std::optional<at::Tensor> offsets;
  int64_t count = 0;
  int64_t length = -1;
  bool any() const { return offsets.has_value() || length >= 0; }
};

// `rows`: each group rank's rows (tiling the table of `num_embeddings` rows).
Bucketed bucket_ids(const at::Tensor& ids, const RoutedBags& bags, const Blocks& rows, c10::ScalarType index,
                    int64_t padding_idx, bool mean, int64_t num_embeddings);

// What the agreement's words tell this rank about its exchanges with each peer (NOTE [ Idle owners ]).
struct Routes {
  bool bags = false;
  int64_t num_bags = 0;            // this rank's bags
  std::vector<int64_t> counts_in;  // ids each requester sends here
  std::vector<int64_t> counts_out; // ids this rank sends each owner
  std::vector<int64_t> bags_in;    // bags of each requester pooled here (0 from one that sent no ids)

  int64_t world() const { return static_cast<int64_t>(counts_in.size()); }
  // Elements of the ids' all-to-all: ids, and lengths only along with ids.
  std::vector<int64_t> send_sizes() const;
  std::vector<int64_t> recv_sizes() const;
  // Rows each owner sends this rank back (bags: its bags when it got ids from this rank; else its ids).
  std::vector<int64_t> back_rows() const;
  int64_t senders() const; // owners this rank sent ids to
};
Routes routes_from(const std::vector<int64_t>& words_in, const std::vector<int64_t>& words_out, bool bags,
                   int64_t num_bags);

// What this rank sends in the ids' all-to-all (Routes::send_sizes per owner).
at::Tensor send_buffer(const Bucketed& bucketed, const Routes& routes);

// Owner side: every requester's ids less `row_start`, in rank order, and, for bags, their bags'
// offsets into them (both in `received`'s dtype).
std::pair<at::Tensor, at::Tensor> unpack_received(const at::Tensor& received, const Routes& routes,
                                                  int64_t row_start, bool loops);

} // namespace ops
} // namespace torch_shard
