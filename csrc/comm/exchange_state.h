// The inside of the agreed exchange (comm/exchange.h), shared by the files that implement its parts:
//   exchange.cpp   the steps: round 1, verdict, round 2 (NOTE [ Agreed exchange ])
//   agreement.cpp  the header's fields, reading it on the host, the verdict's helpers, error classes
//   reasons.cpp    the failed ranks' messages to every rank (NOTE [ Reasons travel ])
//   round_one.cpp  how round 1 runs for a group: its slot, the hub or an all-to-all, its cost
//   hub.cpp        round 1 through a hub (NOTE [ Round 1 through a hub ])
//   round_two.cpp  the payloads that did not ride in round 1
// Nothing outside these files includes this header.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>

#include "comm/exchange.h"

namespace torch_shard {
namespace comm {

// ---- The header ----------------------------------------------------------------------------------
// One header per (sender, receiver) pair, kHeaderWords int64 words. kPeers: how many peers the sender
// has a message for; kMaxMessage: its largest message to a peer; kFits: its payloads fit their slots
// (they ride in round 1); kBytes: its payload bytes for THIS receiver. kRoom / kAppended: see NOTE
// [ Payloads riding the hub's messages ] (meaningful between a rank and the hub only).
enum HeaderField : int64_t { kOp, kError, kFits, kBytes, kPeers, kMaxMessage, kRoom, kAppended, kValue0 };
constexpr int64_t kNote0 = kValue0 + kAgreedValues; // after the kAgreedValues agreed values: kNotes notes
constexpr int64_t kWord = kNote0 + kNotes;          // the word addressed to this peer (Agreement::words)
constexpr int64_t kHeaderWords = kWord + 1;
constexpr int64_t kHeaderBytes = kHeaderWords * static_cast<int64_t>(sizeof(int64_t));
static_assert(kHeaderBytes % 16 == 0, "slots must stay aligned for every dtype");

// Payloads in a round-1 message start at multiples of 16 bytes (every dtype's alignment).
inline int64_t padded16(int64_t bytes) {
  return (bytes + 15) / 16 * 16;
}

// The exchange hook's two points (comm/exchange_options.h): as an exchange starts, and after its verdict.
void hook_point(OpKind op, int64_t me, bool before_agreement);

// ---- One exchange in progress ---------------------------------------------------------------------
struct Exchange {
  Exchange(c10d::ProcessGroup& pg, c10::Device device, const Agreement& agreement, Moves* moves);

  c10d::ProcessGroup& pg;
  const c10::Device device;
  const Agreement& agreement;
  Moves* const moves; // null only with an error
  const int64_t world;
  const int64_t me;
  const OpKind op;
  const bool p2p;       // the group's CPU backend is gloo: point-to-point messages are possible
  const bool failed;    // this rank brings an error (its moves are ignored)
  ErrorCode error_code; // its class
  bool device_words;    // the agreement carries device-computed words (read in the one host read)

  // How round 1 runs (the same on every rank: it depends on the group and the group's history only),
  // see round_one.cpp.
  bool hub_group = false; // round 1 may go through the hub on this group
  bool via_hub = false;   // ... and this one does (NOTE [ Round 1 follows the group's history ])
  bool unpadded = false;  // an all-to-all round 1 sends used bytes only (NOTE [ Round 1 of used bytes ])
  bool split = false;     // round 1's headers travel on the host, apart from its payload blocks
                          // (NOTE [ Headers on the host ])
  int64_t slot_bytes = 0; // through the hub: the payload bytes per peer that ride in round 1
  // An all-to-all round 1: the payload bytes the block from / to rank p holds, the same number at both
  // ends of a pair (NOTE [ Rooms ]).
  std::vector<int64_t> room_in, room_out;
  std::vector<int64_t> block_at; // all-to-all round 1: where the block from rank p starts in recv1

  // This rank's part of the pattern.
  bool fits = false;              // every payload of this rank rides in round 1 (the header's kFits)
  std::vector<uint8_t> rides_out; // this rank's payload to rank p rides in round 1
  int64_t out_degree = 0;         // peers this rank has a message for
  int64_t max_message = 0;        // its largest message to a peer
  std::vector<int64_t> headers;   // this rank's headers, row p addressed to rank p

  // Through the hub (NOTE [ Payloads riding the hub's messages ]).
  int64_t room = 0;                     // a non-hub: the hub's payload it takes after the hub's reply
  int64_t to_hub = 0;                   // a non-hub: the payload it appends to its message to the hub
  std::vector<int64_t> appended_out;    // payload bytes this rank appended to its message to p
  std::vector<at::Tensor> hub_messages; // the hub: every rank's whole round-1 message

  // Round 1's buffers and what it told this rank.
  at::Tensor send1, recv1;
  std::vector<int64_t> table; // received headers, row p from rank p
  std::vector<int64_t> words_out;

  // After the verdict.
  std::vector<int64_t> declared;     // payload bytes each peer sends here
  std::vector<int64_t> appended_in;  // of which appended to its round-1 message
  std::vector<int64_t> round_one_at; // where a payload that came in round 1 starts (-1: none)
  bool mismatch = false;             // a declared size differs from this rank's plan (a bug)

  int64_t field(int64_t rank, int64_t f) const { return table[rank * kHeaderWords + f]; }
  // Whether the payload from rank p came in round 1 (in its block, or in a hub message's slot).
  bool rides_in(int64_t p) const { return via_hub ? field(p, kFits) != 0 : field(p, kBytes) <= room_in[p]; }
  // Writes this rank's payload for `peer` into `into`.
  void write_payload(int64_t peer, const at::Tensor& into) const;
  // The payload from `peer` that came with round 1 (in a slot, or appended to a hub message).
  at::Tensor round_one_payload(int64_t peer) const;
  // Hands the payload from `peer` to its Incoming.
  void deliver(int64_t peer, const at::Tensor& bytes) const;
};

// One payload to write into a round's send buffer: `out`'s bytes at byte `at`.
struct PayloadAt {
  const Outgoing* out;
  int64_t at;
};
// Writes each payload (in the order given) into `buffer`. A message handed to several peers as the
// same tensor (Outgoing::direct: every rank's inputs shared with every rank) is copied once per run of
// evenly spaced blocks, not once per peer: one kernel on a GPU, whatever the number of ranks.
void write_payloads(const at::Tensor& buffer, const std::vector<PayloadAt>& payloads);

// ---- The parts (each in its file) ----------------------------------------------------------------
// agreement.cpp: see NOTE [ One host read per exchange ].
struct HostRead {
  std::vector<int64_t> words; // Agreement::words (empty when there are none)
  int64_t status = 0;         // Agreement::status (0 when there is none)
};
// The Python class of `code` ("ValueError", ...; kOther: "RuntimeError").
const char* error_class_name(ErrorCode code);
HostRead read_to_host(const Agreement& agreement, const at::Tensor& rows, int64_t world, int64_t* rows_out);
std::vector<Values> agreed_values(const int64_t* table, int64_t world);
int64_t round_two_messages(const int64_t* table, int64_t world);
bool agreed(const int64_t* table, int64_t world, OpKind op, const Check& check, int64_t me);
[[noreturn]] void raise_own_status(const Agreement& agreement, OpKind op, int64_t code);
void fill_headers(Exchange& x);
// Round 1 built on the host (the hub; an all-to-all of used bytes): reads Agreement::words and ::status
// now and writes them into this rank's headers.
void device_words_into_headers(Exchange& x);

// reasons.cpp: see NOTE [ Reasons travel ].
// "<class>: <message>" of `error` (Agreement::reason when it is set).
std::string describe_failure(const Agreement& agreement, std::exception_ptr error, ErrorCode code);
// Every failed rank's reason, by rank ("" for the others); `mine`: this rank's ("" unless it failed).
// Collective: every rank calls it after a round 1 whose table shows a failed rank and no lost one.
std::vector<std::string> exchange_reasons(Exchange& x, const std::string& mine);
// The error of a rank whose peer `rank` failed with `code` (`others`: how many more failed).
[[noreturn]] void raise_peer_failure(OpKind op, ErrorCode code, int64_t rank, const std::string& reason,
                                     int64_t others);

// round_one.cpp: how round 1 runs for this group (sets hub_group, via_hub, unpadded, slot_bytes and the
// rooms); the all-to-all round 1; what this op's table tells the group's next round 1 (every rank
// calls it once the table is complete, before the verdict can raise).
void plan_round_one(Exchange& x);
void all_to_all_round_one(Exchange& x);
void split_round_one(Exchange& x);
void remember_round_one(Exchange& x);

// hub.cpp: round 1 through the hub; then where each payload that rode in it starts.
void prepare_hub_payloads(Exchange& x);
void hub_round_one(Exchange& x);

// round_two.cpp: moves what did not come in round 1 (and this rank's local part).
void round_two(Exchange& x);

} // namespace comm
} // namespace torch_shard
