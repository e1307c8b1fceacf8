#include "comm/exchange.h"

#include <algorithm>
#include <atomic>
#include <cstring>

#include <ATen/ops/empty.h>
#include <c10/macros/Macros.h>
#include <c10/util/Exception.h>

#include "comm/exchange_state.h"
#include "comm/process_group.h"

namespace torch_shard {
namespace comm {

// NOTE [ Agreed exchange ]
// A data op must never let ranks disagree on what crosses the wire: a gloo all-to-all whose sizes
// differ between sender and receiver aborts the process, and a rank that raises while its peers wait
// in a collective hangs them. So every op starts with an agreement round, and the same round carries
// the data when it is small:
//
//   Round 1 (always): every rank receives from each peer a block whose size every rank computes from
//   the group and the group's history alone (comm/round_one.cpp), never from its arguments, so the
//   round is safe whatever they are (a sender may send less than the block, where gloo allows it, never
//   more). The header (HeaderField, comm/exchange_state.h) tells the peer: the op being run, this
//   rank's error code (0: its local checks passed), whether this rank's payloads ride in round 1, how
//   many payload bytes it sends to THAT peer, kAgreedValues op-specific values (src/dst ranks, layout
//   fingerprints), notes and a device-computed word. A payload that fits its room rides in the block.
//   Round 1 runs as one all-to-all whose rooms the group's history predicts (NOTE [ Round 1 follows
//   the group's history ], NOTE [ Rooms ]), or, on small CPU groups when the history predicts no big
//   dense op, through a hub (comm/hub.cpp); on CUDA groups with a CPU backend its headers travel on the
//   host (NOTE [ Headers on the host ]).
//
//   Verdict: every rank now holds every rank's header, the same table everywhere, so all reach the
//   same verdict: an error anywhere raises on every rank (the failing rank its own exception, the
//   others the same class naming it); a different op or different agreed values raise on every rank.
//   No data has been written yet (slots are read only after the verdict), so a failed op leaves its
//   inputs and outputs untouched and the group usable.
//
//   Round 2 (only if some rank's payload did not fit; comm/round_two.cpp): the senders that did not
//   fit send their messages with the sizes they declared in round 1; receivers size their buffers
//   from those declarations, so the sizes on the wire always match. Each header also says to how many
//   peers its sender will send and its largest message, so every rank knows the pattern and picks the
//   same collective: on groups with point-to-point messages (gloo), pair by pair for sparse patterns
//   (a scatter, a gather) or big messages (each packed while the previous ones travel), one
//   all-to-all otherwise; on NCCL, always one all-to-all (one kernel).
//
// The host reads device memory once per exchange, the headers this rank received: NOTE [ One host read
// per exchange ] (comm/agreement.cpp).

// NOTE [ Faults under NCCL ]
// What the agreement guarantees holds on every backend: a rank whose arguments fail (on the host or in
// a device-side check) reports it in round 1, and every rank raises before any data moves. What
// happens when a rank FAILS AFTER the agreement (a crash, a lost GPU) is the backend's business, and
// NCCL differs from gloo. NCCL work is asynchronous: Work::wait() only orders the current CUDA stream
// after the collective, so the surviving ranks' hosts block at their next read of device memory (the
// next op's header copy, or the user's), behind a collective that never completes. ProcessGroupNCCL's
// watchdog thread then acts when the group's timeout passes, as TORCH_NCCL_ASYNC_ERROR_HANDLING says:
// the default (3) ends the process; 1 aborts the communicators and ends it; 2 aborts the communicators
// only, after which waiting calls raise; 0 does nothing (a hang). With TORCH_NCCL_BLOCKING_WAIT=1,
// wait() itself blocks the host and raises DistBackendError at the timeout. So under NCCL "the other
// ranks raise" holds with blocking wait; by default they are ended by the watchdog after the timeout
// instead of hanging. The fault tests (tests/test_faults.py) exercise gloo, whose timeouts and closed
// connections raise in the waiting call; they run on gloo on every machine.

namespace {

std::atomic<ExchangeHook> exchange_hook{nullptr};

} // namespace

void set_exchange_hook(ExchangeHook hook) {
  exchange_hook.store(hook);
}

namespace {

// A group whose CPU backend is gloo carries point-to-point messages; a backend written in Python
// (torch's threaded test group) or NCCL alone gets collectives only.
bool has_point_to_point(c10d::ProcessGroup& pg) {
  return has_backend_for(pg, c10::DeviceType::CPU) &&
         pg.getBackend(c10::DeviceType::CPU)->getBackendName() == "gloo";
}

} // namespace

void hook_point(OpKind op, int64_t me, bool before_agreement) {
  const ExchangeHook hook = exchange_hook.load(std::memory_order_relaxed);
  if (C10_UNLIKELY(hook != nullptr)) {
    hook(op_name(op), me, before_agreement);
  }
}

Exchange::Exchange(c10d::ProcessGroup& pg, c10::Device device, const Agreement& agreement, Moves* moves)
    : pg(pg), device(device), agreement(agreement), moves(moves), world(pg.getSize()), me(pg.getRank()),
      op(agreement.op), p2p(has_point_to_point(pg)), failed(agreement.error != nullptr),
      error_code(agreement.error_code) {
  TORCH_INTERNAL_ASSERT(failed || (moves != nullptr && static_cast<int64_t>(moves->send.size()) == world &&
                                   static_cast<int64_t>(moves->recv.size()) == world));
  TORCH_INTERNAL_ASSERT(!agreement.words.defined() ||
                        (agreement.words.dim() == 1 && agreement.words.numel() == world &&
                         agreement.words.scalar_type() == at::kLong));
  TORCH_INTERNAL_ASSERT(!agreement.status.defined() ||
                        (agreement.status.numel() == 1 && agreement.status.scalar_type() == at::kLong &&
                         agreement.raise_status));
  if (failed && error_code == ErrorCode::kNone) {
    error_code = classify(agreement.error);
  }
  device_words = !failed && (agreement.words.defined() || agreement.status.defined());
  appended_out.assign(world, 0);
}

namespace {

// One message into `into`: its tensor copied, or packed.
void write_one(const Outgoing& out, const at::Tensor& into) {
  if (out.direct.defined()) {
    into.copy_(out.direct);
  } else {
    out.pack(into);
  }
}

} // namespace

void write_payloads(const at::Tensor& buffer, const std::vector<PayloadAt>& payloads) {
  TORCH_INTERNAL_ASSERT(buffer.dim() == 1 && buffer.is_contiguous() && buffer.scalar_type() == at::kByte);
  auto same_message = [](const Outgoing& a, const Outgoing& b) {
    return a.direct.defined() && b.direct.defined() && a.direct.is_same(b.direct) && a.bytes == b.bytes;
  };
  size_t i = 0;
  while (i < payloads.size()) {
    const Outgoing& out = *payloads[i].out;
    const int64_t bytes = out.bytes, first = payloads[i].at;
    TORCH_INTERNAL_ASSERT(first >= 0 && bytes >= 0 && first + bytes <= buffer.numel());
    // The run: later payloads of the same tensor, each `stride` bytes after the one before it (blocks
    // never overlap, so stride >= bytes).
    size_t end = i + 1;
    const int64_t stride = end < payloads.size() ? payloads[end].at - first : 0;
    while (end < payloads.size() && same_message(out, *payloads[end].out) &&
           payloads[end].at - payloads[end - 1].at == stride && stride >= bytes) {
      ++end;
    }
    const auto runs = static_cast<int64_t>(end - i);
    if (bytes == 0) {
      // nothing to write
    } else if (runs > 1) {
      TORCH_INTERNAL_ASSERT(first + (runs - 1) * stride + bytes <= buffer.numel());
      buffer.as_strided({runs, bytes}, {stride, 1}, buffer.storage_offset() + first)
          .copy_(out.direct.view({1, bytes}).expand({runs, bytes}));
    } else {
      write_one(out, buffer.narrow(0, first, bytes));
    }
    i = end;
  }
}

void Exchange::write_payload(int64_t peer, const at::Tensor& into) const {
  write_one(moves->send[peer], into);
}

at::Tensor Exchange::round_one_payload(int64_t peer) const {
  const at::Tensor& message = me == 0 && appended_in[peer] > 0 ? hub_messages[peer] : recv1;
  return message.narrow(0, round_one_at[peer], declared[peer]);
}

void Exchange::deliver(int64_t peer, const at::Tensor& bytes) const {
  const Incoming& in = moves->recv[peer];
  if (mismatch || declared[peer] == 0) {
    return;
  }
  if (in.direct.defined()) {
    if (in.direct.data_ptr() != bytes.data_ptr()) {
      in.direct.copy_(bytes);
    }
  } else {
    in.unpack(bytes);
  }
}

namespace {

Outcome single_rank(const Exchange& x) {
  if (x.failed) {
    std::rethrow_exception(x.agreement.error);
  }
  const HostRead read = read_to_host(x.agreement, at::Tensor(), 1, nullptr);
  if (read.status != 0) {
    raise_own_status(x.agreement, x.op, read.status);
  }
  x.agreement.check({x.agreement.values}, 0);
  if (x.moves->local) {
    x.moves->local();
  }
  Outcome outcome;
  outcome.declared = {0};
  outcome.notes = {x.agreement.notes};
  outcome.words_in = read.words.empty() ? std::vector<int64_t>{0} : read.words;
  outcome.words_out = read.words;
  return outcome;
}

// This rank's part of the pattern, from its moves: which payloads ride in round 1 (through the hub,
// all of them or none; in an all-to-all, each that fits its room).
void describe_moves(Exchange& x) {
  x.rides_out.assign(x.world, 0);
  x.fits = !x.failed;
  if (x.failed) {
    return;
  }
  for (int64_t p = 0; p < x.world; ++p) {
    const int64_t bytes = p == x.me ? 0 : x.moves->send[p].bytes;
    x.rides_out[p] = bytes <= (x.via_hub ? x.slot_bytes : x.room_out[p]) ? 1 : 0;
    x.fits = x.fits && x.rides_out[p];
    x.out_degree += bytes > 0 ? 1 : 0;
    x.max_message = std::max(x.max_message, bytes);
  }
  if (x.via_hub) {
    std::fill(x.rides_out.begin(), x.rides_out.end(), x.fits ? 1 : 0);
  }
}

// Raises on every rank when a rank failed: a failed rank its own error, the others the same class
// naming the first failed rank and carrying its message (NOTE [ Reasons travel ]).
void raise_failures(Exchange& x) {
  int64_t first = -1, failures = 0;
  bool lost = false;
  for (int64_t r = 0; r < x.world; ++r) {
    const int64_t code = x.field(r, kError);
    if (code != 0) {
      first = first < 0 ? r : first;
      failures += 1;
      lost = lost || code == static_cast<int64_t>(ErrorCode::kLost);
    }
  }
  if (failures == 0) {
    return;
  }
  std::exception_ptr own = x.failed ? x.agreement.error : nullptr;
  ErrorCode own_code = x.error_code;
  if (!own && x.field(x.me, kError) != 0) {
    // Its input failed a check on its device: the op words its error now.
    own_code = static_cast<ErrorCode>(x.field(x.me, kError));
    try {
      raise_own_status(x.agreement, x.op, x.field(x.me, kError));
    } catch (...) {
      own = std::current_exception();
    }
  }
  std::vector<std::string> reasons;
  if (!lost) {
    reasons = exchange_reasons(x, own ? describe_failure(x.agreement, own, own_code) : std::string());
  }
  if (own) {
    std::rethrow_exception(own);
  }
  raise_peer_failure(x.op, static_cast<ErrorCode>(x.field(first, kError)), first,
                     reasons.empty() ? std::string() : reasons[first], failures - 1);
}

// Raises on every rank unless every rank agreed (the same table everywhere: the same verdict).
void verdict(Exchange& x, Outcome& outcome) {
  raise_failures(x);
  for (int64_t r = 0; r < x.world; ++r) {
    TORCH_CHECK(x.field(r, kOp) == static_cast<int64_t>(x.op), "torch_shard.", op_name(x.op), ": rank ", r,
                " is running torch_shard.", op_name(static_cast<OpKind>(x.field(r, kOp))),
                " while this rank runs torch_shard.", op_name(x.op),
                "; every rank of the group must call the same collective");
  }
  x.agreement.check(agreed_values(x.table.data(), x.world), x.me);
  outcome.notes.assign(x.world, Notes{});
  outcome.words_in.assign(x.world, 0);
  for (int64_t r = 0; r < x.world; ++r) {
    std::copy_n(x.table.data() + r * kHeaderWords + kNote0, kNotes, outcome.notes[r].begin());
    outcome.words_in[r] = x.field(r, kWord);
  }
  outcome.words_out = x.words_out;
}

// What each peer sends here, and where the payloads that came in round 1 start: in recv1 (a slot, or
// the hub's appended payload after the others), or, on the hub, in the sender's round-1 message (right
// after its headers: a rank that appends has no slot payloads). See NOTE [ Hub messages ].
void locate_payloads(Exchange& x) {
  const int64_t world = x.world;
  x.declared.assign(world, 0);
  x.appended_in.assign(world, 0);
  x.round_one_at.assign(world, -1);
  int64_t sent = 0, received = 0;
  for (int64_t p = 0; p < world; ++p) {
    if (p == x.me) {
      continue;
    }
    x.declared[p] = x.field(p, kBytes);
    const int64_t expected = x.moves->recv[p].bytes;
    if (expected != kDeclared && expected != x.declared[p]) {
      x.mismatch = true;
    }
    x.appended_in[p] = x.field(p, kAppended);
    if (x.appended_in[p] != 0) {
      // Never more than this rank made room for (NOTE [ Payloads riding the hub's messages ]).
      const int64_t limit = x.me == 0 ? x.hub_messages[p].numel() : (p == 0 ? x.room : 0);
      TORCH_CHECK(x.via_hub && x.appended_in[p] == x.declared[p] && x.appended_in[p] <= limit, "torch_shard.",
                  op_name(x.op), ": internal error: rank ", p, " appended ", x.appended_in[p],
                  " bytes to its round-1 message, which this rank cannot take; please report this");
    }
    sent += x.moves->send[p].bytes;
    received += x.declared[p];
  }
  auto& stats = comm_stats();
  stats.bytes_sent_to_peers += sent;
  stats.bytes_received_from_peers += received;
  int64_t at = world * kHeaderBytes;
  for (int64_t p = 0; p < world; ++p) {
    if (p != x.me && x.declared[p] > 0 && x.rides_in(p)) {
      x.round_one_at[p] = x.via_hub ? at : x.block_at[p] + (x.split ? 0 : kHeaderBytes);
      at += padded16(x.declared[p]);
    }
  }
  for (int64_t p = 0; p < world; ++p) {
    if (x.appended_in[p] > 0) {
      x.round_one_at[p] = x.me == 0 ? world * kHeaderBytes : at;
    }
  }
  for (int64_t p = 0; p < world; ++p) {
    const int64_t limit = x.me == 0 && x.appended_in[p] > 0 ? x.hub_messages[p].numel() : x.recv1.numel();
    TORCH_CHECK(x.round_one_at[p] < 0 || x.round_one_at[p] + x.declared[p] <= limit, "torch_shard.",
                op_name(x.op), ": internal error: the round-1 message from rank ", p,
                " is shorter than its headers say; please report this");
  }
}

} // namespace

Outcome exchange(c10d::ProcessGroup& pg, c10::Device device, const Agreement& agreement, Moves* moves) {
  Exchange x(pg, device, agreement, moves);
  if (x.world == 1) {
    return single_rank(x);
  }
  hook_point(x.op, x.me, /*before_agreement=*/true);
  plan_round_one(x);
  describe_moves(x);
  if (x.via_hub) {
    prepare_hub_payloads(x);
  }
  fill_headers(x);
  if (x.via_hub) {
    hub_round_one(x);
  } else if (x.split) {
    split_round_one(x);
  } else {
    all_to_all_round_one(x);
  }
  remember_round_one(x);
  Outcome outcome;
  verdict(x, outcome);
  hook_point(x.op, x.me, /*before_agreement=*/false);
  locate_payloads(x);
  round_two(x);
  TORCH_CHECK(!x.mismatch, "torch_shard.", op_name(x.op),
              ": internal error: a peer sent a different number of bytes than this rank's plan "
              "expects although every rank agreed on the layouts; please report this");
  outcome.declared = std::move(x.declared);
  return outcome;
}

} // namespace comm
} // namespace torch_shard
