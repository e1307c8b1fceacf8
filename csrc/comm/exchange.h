// The one engine behind every torch_shard data op: agree, then move, in as few rounds as possible.
//
// See NOTE [ Agreed exchange ] in exchange.cpp for the protocol.
#pragma once

#include <array>
#include <exception>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>

#include "comm/exchange_options.h"

namespace torch_shard {
namespace comm {

// Which collective a rank is running; ranks that disagree raise instead of mixing up their messages.
// Kinds start at 1: a zeroed header word names no op.
enum class OpKind : int64_t { kShard = 1, kGather, kReshard, kShareInputs, kCompare, kRedistribute };

const char* op_name(OpKind op);
// The kind named `name` (op_name's inverse), or nullopt.
std::optional<OpKind> op_from_name(const std::string& name);

// Values every rank sends to every rank in the agreement (op-specific: ranks, fingerprints, ...).
constexpr int kAgreedValues = 4;
using Values = std::array<int64_t, kAgreedValues>;

// Byte counts a receiver cannot know in advance (inputs of different sizes per rank): it takes what
// the sender declares in the agreement round.
constexpr int64_t kDeclared = -1;

// One message from this rank to a peer. Either `direct` (a contiguous 1-D uint8 tensor of exactly
// `bytes`, on the communication device) is sent as it is, or `pack` fills a staging buffer.
struct Outgoing {
  int64_t bytes = 0;
  at::Tensor direct;
  std::function<void(const at::Tensor& into)> pack;
};

// One message from a peer to this rank. `bytes` is what this rank expects (or kDeclared). Either it is
// received straight into `direct`, or `unpack` reads it from a staging buffer.
struct Incoming {
  int64_t bytes = 0;
  at::Tensor direct;
  std::function<void(const at::Tensor& from)> unpack;
};

// This rank's part of an exchange: one Outgoing and one Incoming per group rank (its own entries are
// ignored), and `local`, which moves what stays on this rank (run only once all ranks agreed).
struct Moves {
  std::vector<Outgoing> send;
  std::vector<Incoming> recv;
  std::function<void()> local;
  // The same part as `local`, described as a message to itself (optional). A dense all-to-all may
  // route it through the collective when that makes this rank's whole send or receive buffer one
  // tensor's memory (no pack or no unpack at all); `local` then does not run.
  Outgoing self_send;
  Incoming self_recv;
};

// Throws (the same exception on every rank: every rank calls it with the same table) when the agreed
// values of the ranks are inconsistent. It may run twice on the hub of round 1 (once before it replies),
// so it must give the same result each time and leave nothing behind that a second run would double.
using Check = std::function<void(const std::vector<Values>& all, int64_t me)>;

// Words a rank tells every peer in the agreement round without agreeing on them (op-specific: the
// byte count of each part of a shared input).
constexpr int kNotes = 3;
using Notes = std::array<int64_t, kNotes>;

// Error classes a failing rank reports; the others raise the same class, naming that rank. The one
// table of these codes: Python reads the class names from torch.ops.torch_shard._error_classes().
enum class ErrorCode : int64_t {
  kNone = 0,
  kValueError = 1,
  kTypeError = 2,
  kIndexError = 3,
  kNotImplementedError = 4,
  kRuntimeError = 5,
  kOther = 6,
  kLost = 7, // set by the hub for a peer whose connection broke (see NOTE [ Round 1 through a hub ])
};

ErrorCode classify(std::exception_ptr error);

// The Python class name of each ErrorCode from 1 on, in code order (kOther: "RuntimeError").
std::vector<std::string> error_class_names();

// What this rank brings to the agreement round.
struct Agreement {
  OpKind op = OpKind::kCompare;
  Values values{}; // checked by `check` on every rank
  Check check;
  // This rank's local failure: its moves are then ignored, and it rethrows `error` once the others
  // know. `error_code` overrides the class derived from `error`, and `reason` the words the other
  // ranks are told (NOTE [ Reasons travel ]; by default "<class>: <message>" of `error`).
  std::exception_ptr error;
  ErrorCode error_code = ErrorCode::kNone;
  std::string reason;
  Notes notes{};
  // Computed on the device without the host reading them first; the host reads them (with the headers
  // of every peer) in the exchange's one copy to the host. See NOTE [ One host read per exchange ].
  //   status: one int64, an ErrorCode of this rank's input found on the device (0: none). A rank
  //   whose status is not 0 runs raise_status (given that code), which must throw its own error (it
  //   may read device memory: only a failed op runs it); the others raise the same class, naming it
  //   and carrying that error's message (NOTE [ Reasons travel ]).
  //   words: [world] int64; words[p] is told to rank p.
  at::Tensor status;
  std::function<void(ErrorCode)> raise_status;
  at::Tensor words;
};

// What the agreement round told this rank (every rank agreed when exchange() returns).
struct Outcome {
  std::vector<int64_t> declared;  // bytes each peer declared it sends here
  std::vector<Notes> notes;       // every rank's notes, by rank
  std::vector<int64_t> words_in;  // words[me] of each rank (0 from a rank without words)
  std::vector<int64_t> words_out; // this rank's words, as sent (empty without words)
};

// Runs the agreement and, when every rank agrees, the moves. Collective over `pg`: every rank calls it
// with the same op. `device` is the communication device (comm_device()); `moves` may be null only when
// the agreement carries an error.
Outcome exchange(c10d::ProcessGroup& pg, c10::Device device, const Agreement& agreement, Moves* moves);

} // namespace comm
} // namespace torch_shard
