#include "comm/exchange.h"

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <mutex>
#include <sstream>
#include <string>
#include <unordered_map>

#include <ATen/ops/as_strided.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/from_blob.h>
#include <c10/macros/Macros.h>
#include <c10/util/Exception.h>
#include <torch/library.h>

#include "comm/process_group.h"

namespace torch_shard {
namespace comm {

// NOTE [ Agreed exchange ]
// A data op must never let ranks disagree on what crosses the wire: a gloo all-to-all whose sizes
// differ between sender and receiver aborts the process, and a rank that raises while its peers wait
// in a collective hangs them. So every op starts with an agreement round, and the same round carries
// the data when it is small:
//
//   Round 1 (always): one all-to-all with a FIXED size per peer, kHeaderBytes + the slot, which
//   every rank computes without looking at its arguments, so the round is safe whatever they are.
//   The header tells the peer: the op being run, this rank's error code (0: its local checks
//   passed), whether this rank's payloads fit their slots, how many payload bytes it sends to THAT
//   peer, and kAgreedValues op-specific values (src/dst ranks, layout fingerprints). When a payload
//   fits, it rides in the slot.
//
//   Verdict: every rank now holds every rank's header, the same table everywhere, so all reach the
//   same verdict: an error anywhere raises on every rank (the failing rank its own exception, the
//   others the same class naming it); a different op or different agreed values raise on every rank.
//   No data has been written yet (slots are read only after the verdict), so a failed op leaves its
//   inputs and outputs untouched and the group usable.
//
//   Round 2 (only if some rank's payload did not fit): the senders that did not fit send their
//   messages with the sizes they declared in round 1; receivers size their buffers from those
//   declarations, so the sizes on the wire always match. Each header also says to how many peers
//   its sender will send in round 2 and its largest message, so every rank knows the pattern and
//   picks the same collective: on the CPU (gloo), point-to-point between the pairs that exchange
//   data when the pattern is sparse (a scatter is one-to-many, a gather many-to-one: measured on 4
//   ranks this beat gloo's all-to-all, scatter and gather) or when some message reaches
//   kPointToPointFromBytes (each message is packed while the previous ones travel: a 2048^2 / 4096^2
//   rows->columns reshard took 0.8-0.95x the time of the all-to-all), one all-to-all otherwise (a
//   dense pattern of medium messages: there gloo's all-to-all won). On CUDA (NCCL) it is always one
//   all-to-all.
//
// Measured here (4 gloo ranks, 2 cores): an all-to-all costs the same up to ~16 KiB per peer, about
// 3x less than an all-gather of the same header, so the slot makes small ops single-round for free.
// The slot grows for dense patterns that repeat: see NOTE [ Slot size from the group's history ].
// On small CPU groups round 1 does not run as an all-to-all at all: see NOTE [ Round 1 through a hub ].
constexpr int64_t kHeaderWords = 16;
constexpr int64_t kPointToPointFromBytes = int64_t{256} << 10;
constexpr int64_t kHeaderBytes = kHeaderWords * static_cast<int64_t>(sizeof(int64_t));

// NOTE [ Slot size from the group's history ]
// Round 1's size per peer must be the same on every rank and must not depend on the arguments (they
// may disagree), so it cannot be taken from the op at hand. It can be taken from the group's PAST:
// every header carries its sender's largest message to a peer, so after round 1 every rank of the
// group holds the same table and derives the same slot size for the group's NEXT op. A dense op (an
// all-to-all-like reshard: more messages than a one-to-many or many-to-one pattern has) sets the
// next slot to its largest message, rounded up, between kMinSlotBytes and kMaxSlotBytes; any other
// op, or one that failed, sets it back to kMinSlotBytes. So a training loop that reshards the same
// medium-sized tensor every step moves it in ONE all-to-all from the second step on, and a sparse op
// (a gather) never pays for a big slot twice. The state is kept per process-group object (see
// SlotHistory) and updated before any verdict can raise. The cap stays where packing into the slot
// still beats a second round (above it the whole-buffer all-to-all of round 2 sends from and into the
// shards without copies).
constexpr int64_t kMinSlotBytes = 16384;
constexpr int64_t kMaxSlotBytes = int64_t{256} << 10;

// NOTE [ Round 1 through a hub ]
// What a gloo collective costs on a small CPU group is mostly per-message work (socket calls and
// thread hand-offs, each paid by every process), not bytes: measured here with 4 ranks, an all-to-all
// of 1-64 KiB per peer (12 messages) took 1.6-2.1 ms, while the same blocks sent to one rank and sent
// back from it (6 point-to-point messages, two hops) took 0.55-0.8 ms. So on CPU groups of at most
// kHubMaxWorld ranks, round 1 goes through a hub, group rank 0: every other rank sends it its whole
// round-1 send buffer (all W blocks: header + slot for each destination); the hub then sends each
// rank exactly the W blocks an all-to-all would have delivered to it (block p: what rank p addressed
// to it). Every rank ends with the same receive buffer as after the all-to-all, so the verdict, the
// slots and round 2 are unchanged; small payloads between two non-hub ranks are relayed by the hub.
// The mode depends only on the group (device, size) and the agreed slot size, never on arguments, so
// all ranks pick the same one. Larger groups (the hub's bytes grow with W^2), CUDA (NCCL's
// all-to-all is one kernel) and slots above kHubMaxSlotBytes keep the all-to-all: a repeated dense
// reshard whose 64 KiB messages ride in round 1 was 0.87-0.93x as fast through the hub as by the
// all-to-all, one of 256 KiB messages 1.1x slower (relaying doubles the bytes between non-hub ranks).
// A peer whose round-1 message fails to arrive (its process ended, its connection broke) is reported by
// the hub to everyone as lost (kLost), so no rank waits on it. A timeout is different: gloo closes every
// connection of the process whose wait timed out (the hub's, for a rank that stalls past the group's
// timeout), so the others raise gloo's own error (connection closed, or their own timeout) at once, and
// the late rank fails on the closed connection: no rank hangs, no late message can be taken for a later
// op's, and, as after any timeout in c10d, the group cannot be used again.
constexpr int64_t kHubMaxWorld = 8;
constexpr int64_t kHubMaxSlotBytes = int64_t{64} << 10;
constexpr int64_t kHub = 0;

// NOTE [ Hub messages ]
// Through the hub, round-1 messages carry only what is used, not W fixed blocks: gloo accepts a
// message shorter than the receive posted for it, so receivers post the largest possible size and
// senders send what they have. Measured here, the fixed blocks (16 KiB of mostly unused slot per
// peer) made every hub message ~66 KB and cost the hub a 264 KB transposition on the critical path.
//   rank -> hub:  W headers (row d: the header addressed to rank d), then its payloads that fit their
//                 slots in rank order, each at a multiple of 16 bytes, then a payload appended for the
//                 hub (NOTE [ Payloads riding the hub's messages ]).
//   hub -> rank d: the W headers addressed to d (row p: rank p's), then the payloads that fit from
//                 every rank p to d in rank order (16-byte aligned), then the hub's appended payload.
// Every size in it is in a header, so the receiver finds each payload without another message; the
// hub checks the sizes a peer's headers claim against what it posted before using them as offsets.

// NOTE [ Payloads riding the hub's messages ]
// A message of round 2 is one more hop, and on gloo a hop whose receive is posted late costs a
// rendezvous on top (the sender waits for the receiver's "ready" notice). A scatter from the hub or a
// gather to it (the usual root, group rank 0) can skip that hop: the payload travels IN the round-1
// message that already goes between the rank and the hub. gloo accepts a message shorter than the
// receive posted for it (never a longer one), which makes this safe with arguments nobody has checked:
//   * to the hub: a rank whose only message is for the hub, of at most kHubAppendMaxBytes, appends it
//     to its round-1 message and says so in its header (kAppended). The hub posts every round-1
//     receive kHubAppendMaxBytes larger than the largest message without it, so no sender can overrun
//     it. The payload is read only after the verdict, like a slot.
//   * from the hub: a rank that expects a payload from the hub of at most kHubAppendMaxBytes (and more
//     than the slot) posts its round-1 receive that much larger and says so (kRoom). The hub already
//     holds every header when it replies, so it reaches the verdict first; it appends a payload only
//     when that verdict passes, the payload is exactly the room the receiver made, and the pattern is
//     sparse (a dense reshard keeps its pipelined round 2 instead of packing before the replies). It
//     tells the receiver in its own header (kAppended).
//   * from the hub, above the cap: a rank whose new shard (memory nobody sees before the op returns,
//     Moves::fresh_destinations) takes the hub's payload in one piece posts that receive BEFORE
//     round 1, straight into the shard, and says so (kRoom above the cap). The hub then owes it
//     exactly one message before its reply, sent as soon as that rank's header arrives, before the
//     verdict: the payload when the hub has no local error and it is exactly the size posted, else
//     0 bytes (the payload then takes round 2). A failed verdict just drops the shard; the big
//     transfer of a scatter from the hub overlaps the agreement instead of following it.
// Both ends then skip that pair in round 2. The cap keeps the copies in and out of the round-1
// buffers (a direct round-2 message needs none) cheaper than the hop they save.
constexpr int64_t kHubAppendMaxBytes = int64_t{1} << 20;

namespace {

// kPeers: how many peers the sender has a message for; kMaxMessage: its largest message to a peer.
// kRoom / kAppended: see NOTE [ Payloads riding the hub's messages ] (meaningful in the blocks between
// a rank and the hub only).
enum HeaderField : int64_t {
  kOp = 0,
  kError = 1,
  kFits = 2,
  kBytes = 3,
  kPeers = 4,
  kMaxMessage = 5,
  kRoom = 6,
  kAppended = 7,
  kValue0 = 8,                      // kAgreedValues agreed values
  kNote0 = kValue0 + kAgreedValues, // kNotes notes (Agreement::notes)
  kWord = kNote0 + kNotes,          // the word addressed to this peer (Agreement::words)
};
static_assert(kWord + 1 == kHeaderWords, "header layout");
static_assert(kHeaderBytes % 16 == 0, "slots must stay aligned for every dtype");

// See NOTE [ Slot size from the group's history ].
// Entries are per group OBJECT: a group destroyed and created again under the same name (in a process
// that lives on, beside processes that start fresh) starts from the minimum on every member. An entry
// holds a weak reference, which keeps the object's memory (not the group) reserved, so no other group
// can appear at that address while the entry exists; entries of destroyed groups are dropped.
class SlotHistory {
public:
  int64_t slot_for(c10d::ProcessGroup& group) {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = next_.find(&group);
    if (it == next_.end() || it->second.group.lock().get() != &group) {
      return kMinSlotBytes;
    }
    return it->second.slot;
  }
  void record(c10d::ProcessGroup& group, int64_t slot) {
    std::lock_guard<std::mutex> lock(mutex_);
    for (auto it = next_.begin(); it != next_.end();) {
      it = it->second.group.expired() ? next_.erase(it) : std::next(it);
    }
    auto strong = c10::intrusive_ptr<c10d::ProcessGroup>::reclaim_copy(&group);
    next_.insert_or_assign(&group, Entry{c10::weak_intrusive_ptr<c10d::ProcessGroup>(strong), slot});
  }

private:
  struct Entry {
    c10::weak_intrusive_ptr<c10d::ProcessGroup> group;
    int64_t slot;
  };
  std::mutex mutex_;
  std::unordered_map<const c10d::ProcessGroup*, Entry> next_;
};

SlotHistory& slot_history() {
  static SlotHistory history;
  return history;
}

// The slot size of the group's next op, from the header table every rank of the group received.
template <typename Field>
int64_t next_slot_size(const Field& field, int64_t world) {
  int64_t messages = 0, largest = 0;
  for (int64_t r = 0; r < world; ++r) {
    if (field(r, kError) != 0 || field(r, kOp) != field(0, kOp)) {
      return kMinSlotBytes;
    }
    messages += field(r, kPeers);
    largest = std::max(largest, field(r, kMaxMessage));
  }
  if (messages <= 2 * (world - 1) || largest <= kMinSlotBytes || largest > kMaxSlotBytes) {
    return kMinSlotBytes;
  }
  constexpr int64_t kAlign = 4096;
  return std::min((largest + kAlign - 1) / kAlign * kAlign, kMaxSlotBytes);
}

const char* error_class_name(ErrorCode code) {
  switch (code) {
    case ErrorCode::kValueError:
      return "ValueError";
    case ErrorCode::kTypeError:
      return "TypeError";
    case ErrorCode::kIndexError:
      return "IndexError";
    case ErrorCode::kNotImplementedError:
      return "NotImplementedError";
    case ErrorCode::kRuntimeError:
      return "RuntimeError";
    case ErrorCode::kLost:
      return "DistBackendError";
    default:
      return "error";
  }
}

[[noreturn]] void raise_peer_failure(OpKind op, ErrorCode code, int64_t rank) {
  std::ostringstream msg;
  if (code == ErrorCode::kLost) {
    msg << "torch_shard." << op_name(op) << ": rank " << rank
        << " of the process group did not take part in the agreement round (its message to the hub, "
           "group rank 0, failed: the process ended, its connection broke or the group's timeout "
           "passed); every rank stops here instead of waiting for it";
    C10_THROW_ERROR(DistBackendError, msg.str());
  }
  msg << "torch_shard." << op_name(op) << ": rank " << rank
      << " of the process group rejected its arguments; every rank stops here instead of waiting "
         "for it (see the "
      << error_class_name(code) << " raised on rank " << rank << ")";
  switch (code) {
    case ErrorCode::kValueError:
      C10_THROW_ERROR(ValueError, msg.str());
    case ErrorCode::kTypeError:
      C10_THROW_ERROR(TypeError, msg.str());
    case ErrorCode::kIndexError:
      C10_THROW_ERROR(IndexError, msg.str());
    case ErrorCode::kNotImplementedError:
      C10_THROW_ERROR(NotImplementedError, msg.str());
    default:
      C10_THROW_ERROR(Error, msg.str());
  }
}

// NOTE [ Whole buffers ]
// An all-to-all takes one flat send buffer (the messages to each rank, in rank order) and one flat
// receive buffer. Building them costs a pack copy and an unpack copy, unless the messages, in rank
// order, are already consecutive in ONE tensor's memory: then that tensor is the buffer. This is the
// common case on one side of most dense moves: the sender of row chunks (each peer's part of a row
// shard is a run of rows, in rank order) and the receiver of a column->row or row->column reshard
// (each peer's part of its new shard is a run). A rank's own part must then travel through the
// collective too (the backends copy it locally; it never touches the network) instead of being
// copied shard to shard. Returns that tensor's bytes, or an undefined tensor.
at::Tensor whole_buffer(const std::vector<int64_t>& splits,
                        const std::function<const at::Tensor&(int64_t)>& direct_of) {
  at::Tensor first;
  const uint8_t* next = nullptr;
  int64_t total = 0;
  for (size_t p = 0; p < splits.size(); ++p) {
    if (splits[p] == 0) {
      continue;
    }
    const at::Tensor& t = direct_of(static_cast<int64_t>(p));
    if (!t.defined() || t.numel() != splits[p]) {
      return at::Tensor();
    }
    const auto* start = static_cast<const uint8_t*>(t.const_data_ptr());
    if (!first.defined()) {
      first = t;
    } else if (start != next || !t.storage().is_alias_of(first.storage())) {
      return at::Tensor();
    }
    next = start + splits[p];
    total += splits[p];
  }
  if (!first.defined()) {
    return at::Tensor();
  }
  return first.as_strided({total}, {1}, first.storage_offset());
}

// TEST-ONLY (benchmarks, tests): false makes round 1 an all-to-all everywhere. Set alike on every rank.
std::atomic<bool> hub_allowed{true};

// True when round 1 goes through the hub. See NOTE [ Round 1 through a hub ].
bool hub_round_one(c10::Device device, int64_t world, int64_t slot_bytes) {
  return hub_allowed.load(std::memory_order_relaxed) && device.is_cpu() && world >= 2 &&
         world <= kHubMaxWorld && slot_bytes <= kHubMaxSlotBytes;
}

void set_round_one(c10::string_view mode) {
  TORCH_CHECK_VALUE(mode == "auto" || mode == "all_to_all",
                    "torch_shard._set_round_one: mode must be 'auto' or 'all_to_all', got '", mode, "'");
  hub_allowed = mode == "auto";
}

// The agreed values of every rank in a header table (row r: rank r's header).
std::vector<Values> agreed_values(const int64_t* table, int64_t world) {
  std::vector<Values> all(world);
  for (int64_t r = 0; r < world; ++r) {
    std::copy_n(table + r * kHeaderWords + kValue0, kAgreedValues, all[r].begin());
  }
  return all;
}

// Round-2 messages in the whole group (those of the senders whose payloads did not fit their slots),
// from a header table: every rank derives the same number, and so the same pattern.
int64_t round_two_messages(const int64_t* table, int64_t world) {
  int64_t messages = 0;
  for (int64_t r = 0; r < world; ++r) {
    const int64_t* row = table + r * kHeaderWords;
    messages += row[kFits] == 0 ? row[kPeers] : 0;
  }
  return messages;
}

// The verdict every rank reaches from a header table, without raising: no rank failed, every rank
// runs `op`, and `check` accepts the agreed values. The hub needs it before it replies (NOTE
// [ Payloads riding the hub's messages ]).
bool agreed(const int64_t* table, int64_t world, OpKind op, const Check& check, int64_t me) {
  for (int64_t r = 0; r < world; ++r) {
    const int64_t* row = table + r * kHeaderWords;
    if (row[kError] != 0 || row[kOp] != static_cast<int64_t>(op)) {
      return false;
    }
  }
  try {
    check(agreed_values(table, world), me);
  } catch (const std::exception&) {
    return false;
  }
  return true;
}

// NOTE [ One host read per exchange ]
// On CUDA (NCCL) every buffer of the exchange lives in device memory, and the host reads device memory
// only through a copy that waits for the device (a host sync). An exchange needs exactly one such
// read: the headers the peers sent this rank, which decide everything after round 1 (the verdict, the
// sizes and pattern of round 2). Values an op computes on the device and needs on the host (Agreement::
// status, a check of its inputs, and Agreement::words, e.g. per-peer counts) ride in that same copy:
// they go out in the header blocks without the host reading them first (a device-to-device copy), and
// this rank's own words come back together with the received headers. Byte counts come from shapes
// and headers, packing and unpacking are device copies, so nothing else in an exchange reads device
// memory on the host. Through the hub (CPU groups only) headers are built on the host, and the words
// are read there instead (a copy to the host only for tensors on a GPU, i.e. CUDA shards on gloo).

struct HostRead {
  std::vector<int64_t> words; // Agreement::words (empty when there are none)
  int64_t status = 0;         // Agreement::status (0 when there is none)
};

// Reads, in one copy to the host: `rows` (an int64 [world, kHeaderWords] view of received headers, on
// the communication device, into `rows_out`; may be undefined), then the agreement's words and status.
HostRead read_to_host(const Agreement& agreement, const at::Tensor& rows, int64_t world, int64_t* rows_out) {
  std::vector<at::Tensor> parts;
  if (rows.defined()) {
    parts.push_back(rows.reshape({-1}));
  }
  if (agreement.words.defined()) {
    parts.push_back(agreement.words.reshape({-1}));
  }
  if (agreement.status.defined()) {
    parts.push_back(agreement.status.reshape({-1}));
  }
  if (parts.empty()) {
    return {};
  }
  const c10::Device where = parts.front().device();
  for (auto& part : parts) {
    part = part.to(where);
  }
  // One device-to-host copy (none at all on the CPU).
  const at::Tensor host = (parts.size() == 1 ? parts.front() : at::cat(parts)).to(at::kCPU).contiguous();
  const int64_t* values = host.const_data_ptr<int64_t>();
  HostRead out;
  if (rows.defined()) {
    std::memcpy(rows_out, values, static_cast<size_t>(world * kHeaderBytes));
    values += world * kHeaderWords;
  }
  if (agreement.words.defined()) {
    out.words.assign(values, values + world);
    values += world;
  }
  if (agreement.status.defined()) {
    out.status = *values;
  }
  return out;
}

// This rank's input failed a check on its device: its own error, from the op.
[[noreturn]] void raise_own_status(const Agreement& agreement, OpKind op, int64_t code) {
  agreement.raise_status(static_cast<ErrorCode>(code));
  TORCH_CHECK(false, "torch_shard.", op_name(op),
              ": internal error: this rank's input failed a device-side check, but the op named no "
              "error; please report this");
}

// Sends still travelling (the hub's payloads sent ahead of its replies), waited for when the exchange
// ends, however it ends: the local moves run while they travel, and no send outlives the exchange.
// A failed send (a lost peer) is ignored here; the verdict names that peer.
struct PendingSends {
  std::vector<c10::intrusive_ptr<c10d::Work>> works;
  void wait_all() {
    for (auto& work : works) {
      try {
        work->wait();
      } catch (const std::exception&) {
      }
    }
    works.clear();
  }
  ~PendingSends() { wait_all(); }
};

// What the hub appends to its replies (see NOTE [ Payloads riding the hub's messages ]).
struct HubReplies {
  // Given the headers of the blocks addressed to the hub (row p: rank p's), the payload bytes the hub
  // appends to its reply to each rank (0: none).
  std::function<std::vector<int64_t>(const int64_t* table)> payload_bytes;
  // Writes the payload for `rank` into `into`.
  std::function<void(int64_t rank, const at::Tensor& into)> pack;
  // The message the hub owes `rank`, which posted a receive of `bytes` before round 1: its payload,
  // or an empty tensor.
  std::function<at::Tensor(int64_t rank, int64_t bytes)> ahead_payload;
};

// Payloads in a hub message start at multiples of 16 bytes (every dtype's alignment).
int64_t padded16(int64_t bytes) {
  return (bytes + 15) / 16 * 16;
}

// The largest round-1 message of a hub exchange before any appended payload: W headers and a
// payload of at most the slot (a multiple of 16) for each peer.
int64_t hub_message_bound(int64_t world, int64_t slot_bytes) {
  return world * kHeaderBytes + (world - 1) * slot_bytes;
}

// Round 1 through the hub. See NOTE [ Round 1 through a hub ] for what it achieves and NOTE [ Hub
// messages ] for the layout of `send1` and of what arrives in `recv1` (posted by the caller on a
// non-hub; set here, to the hub's own share, on the hub). On the hub, returns each rank's whole
// round-1 message (appended payloads sit right after its headers), and `appended_out` receives the
// payload bytes the hub appended to each reply.
std::vector<at::Tensor> hub_exchange(c10d::ProcessGroup& pg, OpKind op, at::Tensor& recv1,
                                     const at::Tensor& send1, int64_t slot_bytes, const HubReplies& replies,
                                     std::vector<int64_t>& appended_out, PendingSends& sent_ahead) {
  const int64_t world = pg.getSize();
  const int64_t me = pg.getRank();
  comm_stats().collectives += 1;
  if (me != kHub) {
    auto sent = send_bytes(pg, send1, kHub);
    auto received = recv_bytes(pg, recv1, kHub);
    sent->wait();
    received->wait();
    return {};
  }
  const int64_t headers_bytes = world * kHeaderBytes;
  const int64_t longest = hub_message_bound(world, slot_bytes) + kHubAppendMaxBytes;
  at::Tensor posted = workspace(world * longest, send1.device(), 3).view({world, longest});
  std::vector<at::Tensor> message(world);
  std::vector<c10::intrusive_ptr<c10d::Work>> incoming(world);
  for (int64_t p = 0; p < world; ++p) {
    if (p != me) {
      message[p] = posted.select(0, p);
      incoming[p] = recv_bytes(pg, message[p], p);
    }
  }
  message[me] = send1;
  // head[(p * world + d) * kHeaderWords + f]: field f of rank p's header addressed to rank d.
  std::vector<int64_t> head(world * world * kHeaderWords, 0);
  auto hdr = [&](int64_t p, int64_t d, int64_t f) -> int64_t& {
    return head[(p * world + d) * kHeaderWords + f];
  };
  // Where rank p's payload for rank d starts in p's message (-1: none there).
  std::vector<int64_t> source(world * world, -1);
  // Payload bytes sent to each rank ahead of its reply (see NOTE [ Payloads riding the hub's messages ]).
  std::vector<int64_t> ahead_out(world, 0);
  for (int64_t p = 0; p < world; ++p) {
    bool arrived = true;
    if (p != me) {
      try {
        incoming[p]->wait();
      } catch (const std::exception&) {
        arrived = false;
      }
    }
    if (arrived) {
      std::memcpy(&hdr(p, 0, 0), message[p].const_data_ptr(), headers_bytes);
      // The sizes come from another process: check them before they become offsets.
      int64_t end = headers_bytes;
      for (int64_t d = 0; d < world && arrived; ++d) {
        const int64_t bytes = hdr(p, d, kBytes);
        const int64_t appended = hdr(p, d, kAppended);
        // Only a rank whose payloads did not fit appends one, and only for the hub.
        arrived = bytes >= 0 && hdr(p, d, kRoom) >= 0 && appended >= 0 && appended <= kHubAppendMaxBytes &&
                  (appended == 0 || (d == me && hdr(p, d, kFits) == 0 && appended == bytes));
        if (arrived && hdr(p, d, kFits) != 0 && d != p && bytes > 0) {
          arrived = bytes <= slot_bytes;
          source[p * world + d] = end;
          end += padded16(bytes);
        }
      }
      arrived = arrived && end <= hub_message_bound(world, slot_bytes);
    }
    if (arrived && p != me && hdr(p, me, kRoom) > kHubAppendMaxBytes) {
      // p posted a receive for its payload before round 1: it goes now, ahead of the reply.
      const at::Tensor payload = replies.ahead_payload(p, hdr(p, me, kRoom));
      TORCH_INTERNAL_ASSERT(payload.numel() == 0 || payload.numel() == hdr(p, me, kRoom));
      try {
        sent_ahead.works.push_back(send_bytes(pg, payload, p));
        ahead_out[p] = payload.numel();
      } catch (const std::exception&) {
        // A lost peer: the verdict names it.
      }
    }
    if (!arrived) {
      // The peer is gone (or sent what no torch_shard rank sends): every rank hears it from its header,
      // so none waits on it.
      for (int64_t d = 0; d < world; ++d) {
        std::fill_n(&hdr(p, d, 0), kHeaderWords, 0);
        hdr(p, d, kOp) = static_cast<int64_t>(op);
        hdr(p, d, kError) = static_cast<int64_t>(ErrorCode::kLost);
        source[p * world + d] = -1;
      }
    }
  }
  // The headers addressed to the hub decide what it appends for each rank.
  std::vector<int64_t> table(world * kHeaderWords);
  for (int64_t p = 0; p < world; ++p) {
    std::memcpy(table.data() + p * kHeaderWords, &hdr(p, me, 0), kHeaderBytes);
  }
  appended_out = replies.payload_bytes(table.data());
  TORCH_INTERNAL_ASSERT(static_cast<int64_t>(appended_out.size()) == world);
  for (int64_t d = 0; d < world; ++d) {
    TORCH_INTERNAL_ASSERT(ahead_out[d] == 0 || appended_out[d] == 0);
    appended_out[d] += ahead_out[d];
  }
  std::vector<int64_t> reply_at(world + 1, 0);
  for (int64_t d = 0; d < world; ++d) {
    int64_t size = headers_bytes + (ahead_out[d] > 0 ? 0 : appended_out[d]);
    for (int64_t p = 0; p < world; ++p) {
      size += source[p * world + d] >= 0 ? padded16(hdr(p, d, kBytes)) : 0;
    }
    reply_at[d + 1] = reply_at[d] + size;
  }
  at::Tensor reply = workspace(reply_at[world], send1.device(), 4);
  std::vector<c10::intrusive_ptr<c10d::Work>> outgoing;
  // Each reply goes out as soon as it is built; the hub's own share last.
  for (int64_t k = 1; k <= world; ++k) {
    const int64_t d = (me + k) % world;
    char* base = static_cast<char*>(reply.data_ptr()) + reply_at[d];
    int64_t at = headers_bytes;
    for (int64_t p = 0; p < world; ++p) {
      std::memcpy(base + p * kHeaderBytes, &hdr(p, d, 0), kHeaderBytes);
      if (const int64_t from = source[p * world + d]; from >= 0) {
        std::memcpy(base + at, static_cast<const char*>(message[p].const_data_ptr()) + from,
                    static_cast<size_t>(hdr(p, d, kBytes)));
        at += padded16(hdr(p, d, kBytes));
      }
    }
    at::Tensor whole = reply.narrow(0, reply_at[d], reply_at[d + 1] - reply_at[d]);
    if (appended_out[d] > 0) {
      // The hub's own header to d says how much it sent outside the slots (ahead, or after the rest).
      reinterpret_cast<int64_t*>(base + me * kHeaderBytes)[kAppended] = appended_out[d];
      if (ahead_out[d] == 0) {
        replies.pack(d, whole.narrow(0, at, appended_out[d]));
      }
    }
    if (d == me) {
      recv1 = whole;
      continue;
    }
    try {
      outgoing.push_back(send_bytes(pg, whole, d));
    } catch (const std::exception&) {
      // A lost peer; the others still get their replies (and the verdict names it).
    }
  }
  for (auto& work : outgoing) {
    try {
      work->wait();
    } catch (const std::exception&) {
    }
  }
  return message;
}

// NOTE [ Fault injection ]
// TEST-ONLY. The fault tests need a rank that fails where no bad argument can make it fail (that is
// what the agreement is for): a bug, a lost device, a killed process.
// torch.ops.torch_shard._inject_fault(op, action) arms one such failure for this process's next
// exchange of data op `op`. Right after the verdict, when its peers have agreed and go on to move data
// without it: "raise" throws a RuntimeError and "exit" ends the process at once
// (std::_Exit(kInjectedExitCode): no unwinding, no goodbye to the peers, like a crash).
// "exit_before" ends the process as it enters the exchange, before round 1, so its peers run the
// agreement without it. It fires once. Unarmed, it costs one relaxed atomic load per data op.
std::atomic<bool> fault_armed{false};
std::mutex fault_mutex;
std::string fault_op;     // guarded by fault_mutex
std::string fault_action; // guarded by fault_mutex

// `before_agreement`: the point at the start of the exchange (only "exit_before" fires there).
void fault_point(OpKind op, int64_t me, bool before_agreement) {
  if (C10_LIKELY(!fault_armed.load(std::memory_order_relaxed))) {
    return;
  }
  std::string action;
  {
    std::lock_guard<std::mutex> lock(fault_mutex);
    if (!fault_armed.load() || (!fault_op.empty() && fault_op != op_name(op)) ||
        before_agreement != (fault_action == "exit_before")) {
      return;
    }
    action = fault_action;
    fault_armed = false;
  }
  if (action == "exit" || action == "exit_before") {
    std::_Exit(kInjectedExitCode);
  }
  TORCH_CHECK(false, "torch_shard.", op_name(op), ": injected fault on rank ", me,
              " after the agreement round (test-only, see torch_shard._inject_fault)");
}

void inject_fault_op(c10::string_view op, c10::string_view action) {
  inject_fault(std::string(op), std::string(action));
}

} // namespace

void inject_fault(const std::string& op, const std::string& action) {
  TORCH_CHECK_VALUE(
      action == "raise" || action == "exit" || action == "exit_before" || action == "none",
      "torch_shard._inject_fault: action must be 'raise', 'exit', 'exit_before' or 'none', got '", action,
      "'");
  bool known = op.empty();
  for (OpKind kind :
       {OpKind::kShard, OpKind::kGather, OpKind::kReshard, OpKind::kShareInputs, OpKind::kCompare}) {
    known = known || op == op_name(kind);
  }
  TORCH_CHECK_VALUE(known, "torch_shard._inject_fault: unknown data op '", op, "'");
  std::lock_guard<std::mutex> lock(fault_mutex);
  fault_op = op;
  fault_action = action;
  fault_armed = action != "none";
}

const char* op_name(OpKind op) {
  switch (op) {
    case OpKind::kShard:
      return "shard";
    case OpKind::kGather:
      return "gather";
    case OpKind::kReshard:
      return "reshard";
    case OpKind::kShareInputs:
      return "share_inputs";
    case OpKind::kCompare:
      return "compare";
  }
  return "unknown op";
}

std::vector<std::string> error_class_names() {
  std::vector<std::string> names;
  for (int64_t code = 1; code <= static_cast<int64_t>(ErrorCode::kLost); ++code) {
    const auto c = static_cast<ErrorCode>(code);
    names.push_back(c == ErrorCode::kOther ? "RuntimeError" : error_class_name(c));
  }
  return names;
}

ErrorCode classify(std::exception_ptr error) {
  if (!error) {
    return ErrorCode::kNone;
  }
  try {
    std::rethrow_exception(error);
  } catch (const c10::ValueError&) {
    return ErrorCode::kValueError;
  } catch (const c10::TypeError&) {
    return ErrorCode::kTypeError;
  } catch (const c10::IndexError&) {
    return ErrorCode::kIndexError;
  } catch (const c10::NotImplementedError&) {
    return ErrorCode::kNotImplementedError;
  } catch (const c10::Error&) {
    return ErrorCode::kRuntimeError;
  } catch (...) {
    return ErrorCode::kOther;
  }
}

Outcome exchange(c10d::ProcessGroup& pg, c10::Device device, const Agreement& agreement, Moves* moves) {
  const int64_t world = pg.getSize();
  const int64_t me = pg.getRank();
  const OpKind op = agreement.op;
  const Values& mine = agreement.values;
  const Check& check = agreement.check;
  const std::exception_ptr error = agreement.error;
  TORCH_INTERNAL_ASSERT(error || (moves != nullptr && static_cast<int64_t>(moves->send.size()) == world &&
                                  static_cast<int64_t>(moves->recv.size()) == world));
  TORCH_INTERNAL_ASSERT(!agreement.words.defined() ||
                        (agreement.words.dim() == 1 && agreement.words.numel() == world &&
                         agreement.words.scalar_type() == at::kLong));
  TORCH_INTERNAL_ASSERT(!agreement.status.defined() ||
                        (agreement.status.numel() == 1 && agreement.status.scalar_type() == at::kLong &&
                         agreement.raise_status));
  ErrorCode error_code = agreement.error_code;
  if (error && error_code == ErrorCode::kNone) {
    error_code = classify(error);
  }
  auto& stats = comm_stats();
  Outcome outcome;
  outcome.notes.assign(world, Notes{});
  outcome.words_in.assign(world, 0);

  if (world == 1) {
    if (error) {
      std::rethrow_exception(error);
    }
    const HostRead read = read_to_host(agreement, at::Tensor(), 1, nullptr);
    if (read.status != 0) {
      raise_own_status(agreement, op, read.status);
    }
    check({mine}, 0);
    if (moves->local) {
      moves->local();
    }
    outcome.declared = {0};
    outcome.notes[0] = agreement.notes;
    outcome.words_in = read.words.empty() ? std::vector<int64_t>{0} : read.words;
    outcome.words_out = read.words;
    return outcome;
  }

  // ---- Round 1: header + slot to every peer --------------------------------------------------------
  fault_point(op, me, /*before_agreement=*/true); // test-only; see NOTE [ Fault injection ]
  const int64_t slot_bytes = slot_history().slot_for(pg);
  const int64_t block_bytes = kHeaderBytes + slot_bytes;
  bool fits = !error;
  int64_t out_degree = 0;  // peers this rank has a message for
  int64_t max_message = 0; // this rank's largest message to a peer
  if (!error) {
    for (int64_t p = 0; p < world; ++p) {
      const int64_t bytes = p == me ? 0 : moves->send[p].bytes;
      fits = fits && bytes <= slot_bytes;
      out_degree += bytes > 0 ? 1 : 0;
      max_message = std::max(max_message, bytes);
    }
  }
  // See NOTE [ Payloads riding the hub's messages ].
  const bool via_hub = hub_round_one(device, world, slot_bytes);
  int64_t room = 0;   // a non-hub: the hub's payload it can take in round 1 (after the reply, or ahead)
  int64_t to_hub = 0; // a non-hub: the payload it appends to its message to the hub
  c10::intrusive_ptr<c10d::Work> ahead; // a non-hub: the receive of the hub's payload sent ahead
  if (via_hub && me != kHub && !error) {
    const int64_t expected = moves->recv[kHub].bytes; // kDeclared (< 0) never makes room
    if (expected > slot_bytes && expected <= kHubAppendMaxBytes) {
      room = expected;
    } else if (expected > kHubAppendMaxBytes && moves->fresh_destinations &&
               moves->recv[kHub].direct.defined()) {
      room = expected;
      ahead = recv_bytes(pg, moves->recv[kHub].direct, kHub); // before the reply's receive
    }
    const int64_t bytes = moves->send[kHub].bytes;
    if (!fits && out_degree == 1 && bytes > 0 && bytes <= kHubAppendMaxBytes) {
      to_hub = bytes;
    }
  }
  auto write_payload = [&](int64_t p, const at::Tensor& into) {
    const Outgoing& out = moves->send[p];
    if (out.direct.defined()) {
      into.copy_(out.direct);
    } else {
      out.pack(into);
    }
  };
  // Headers are written on the host (and copied once when the buffers live on a GPU).
  std::vector<int64_t> headers(world * kHeaderWords);
  for (int64_t p = 0; p < world; ++p) {
    int64_t* row = headers.data() + p * kHeaderWords;
    row[kOp] = static_cast<int64_t>(op);
    row[kError] = static_cast<int64_t>(error_code);
    row[kFits] = fits ? 1 : 0;
    row[kBytes] = (error || p == me) ? 0 : moves->send[p].bytes;
    row[kPeers] = out_degree;
    row[kMaxMessage] = max_message;
    row[kRoom] = p == kHub ? room : 0;
    row[kAppended] = p == kHub ? to_hub : 0;
    for (int k = 0; k < kAgreedValues; ++k) {
      row[kValue0 + k] = error ? 0 : mine[k];
    }
    for (int k = 0; k < kNotes; ++k) {
      row[kNote0 + k] = error ? 0 : agreement.notes[k];
    }
  }
  // Device-computed words (NOTE [ One host read per exchange ]): the hub's messages are built on the
  // host, so there they are read now; otherwise they are copied into the header blocks on the device.
  const bool device_words = !error && (agreement.words.defined() || agreement.status.defined());
  const int64_t headers_bytes = world * kHeaderBytes;
  at::Tensor send1, recv1;
  std::vector<int64_t> appended_out(world, 0); // payload bytes this rank appended to its message to p
  PendingSends sent_ahead;                     // the hub: payloads sent ahead of its replies
  std::vector<at::Tensor> hub_messages;        // the hub: every rank's whole round-1 message
  if (via_hub && device_words) {
    const HostRead read = read_to_host(agreement, at::Tensor(), world, nullptr);
    for (int64_t p = 0; p < world; ++p) {
      headers[p * kHeaderWords + kWord] = read.words.empty() ? 0 : read.words[p];
      headers[p * kHeaderWords + kError] = read.status;
    }
    outcome.words_out = read.words;
  }
  if (via_hub) {
    // See NOTE [ Hub messages ].
    int64_t size = headers_bytes + to_hub;
    for (int64_t p = 0; p < world && fits; ++p) {
      size += p != me ? padded16(moves->send[p].bytes) : 0;
    }
    send1 = workspace(size, device, 0);
    std::memcpy(send1.data_ptr(), headers.data(), headers_bytes);
    int64_t at = headers_bytes;
    for (int64_t p = 0; p < world && fits; ++p) {
      if (p != me && moves->send[p].bytes > 0) {
        write_payload(p, send1.narrow(0, at, moves->send[p].bytes));
        at += padded16(moves->send[p].bytes);
      }
    }
    if (to_hub > 0) {
      write_payload(kHub, send1.narrow(0, at, to_hub));
    }
    if (me != kHub) {
      recv1 = workspace(hub_message_bound(world, slot_bytes) + (ahead ? 0 : room), device, 1);
    }
    HubReplies replies;
    replies.payload_bytes = [&](const int64_t* h) {
      std::vector<int64_t> bytes(world, 0);
      auto at = [h](int64_t r, int64_t f) { return h[r * kHeaderWords + f]; };
      if (error || fits) {
        return bytes;
      }
      bool any = false;
      // Appended after the reply: room up to the cap (above it, the payload went ahead).
      auto fits_room = [&](int64_t r) {
        return r != me && moves->send[r].bytes > 0 && moves->send[r].bytes == at(r, kRoom) &&
               at(r, kRoom) <= kHubAppendMaxBytes;
      };
      for (int64_t r = 0; r < world; ++r) {
        any = any || fits_room(r);
      }
      if (!any || round_two_messages(h, world) > 2 * (world - 1) || !agreed(h, world, op, check, me)) {
        return bytes;
      }
      for (int64_t r = 0; r < world; ++r) {
        bytes[r] = fits_room(r) ? moves->send[r].bytes : 0;
      }
      return bytes;
    };
    replies.pack = write_payload;
    replies.ahead_payload = [&](int64_t r, int64_t bytes) {
      if (!error && moves->send[r].bytes == bytes && moves->send[r].direct.defined()) {
        return moves->send[r].direct;
      }
      return at::empty({0}, at::TensorOptions().dtype(at::kByte).device(device));
    };
    try {
      hub_messages = hub_exchange(pg, op, recv1, send1, slot_bytes, replies, appended_out, sent_ahead);
      if (ahead) {
        ahead->wait(); // the hub sends it before the reply: already here
      }
    } catch (...) {
      if (ahead) {
        // Never leave a receive into the shard posted (the hub is gone: it fails too).
        try {
          ahead->wait();
        } catch (const std::exception&) {
        }
      }
      throw;
    }
    if (me != kHub) {
      appended_out[kHub] = to_hub;
    }
  } else {
    send1 = workspace(world * block_bytes, device, 0);
    recv1 = workspace(world * block_bytes, device, 1);
    at::Tensor blocks = send1.view({world, block_bytes});
    at::Tensor header_words = blocks.narrow(1, 0, kHeaderBytes).view(at::kLong); // [world, kHeaderWords]
    header_words.copy_(
        at::from_blob(headers.data(), {world, kHeaderWords}, at::TensorOptions().dtype(at::kLong)));
    if (device_words && agreement.status.defined()) {
      header_words.select(1, kError).copy_(agreement.status.reshape({1}).expand({world}));
    }
    if (device_words && agreement.words.defined()) {
      header_words.select(1, kWord).copy_(agreement.words);
    }
    for (int64_t p = 0; p < world && fits; ++p) {
      if (p != me && moves->send[p].bytes > 0) {
        write_payload(p, blocks.select(0, p).narrow(0, kHeaderBytes, moves->send[p].bytes));
      }
    }
    std::vector<int64_t> splits(world, block_bytes);
    std::vector<int64_t> recv_splits = splits;
    all_to_all_bytes(pg, recv1, send1, recv_splits, splits);
  }

  // ---- Verdict ---------------------------------------------------------------------------------------
  // The headers addressed to this rank (row p: rank p's), and where each payload that rode in round 1
  // starts in recv1.
  std::vector<int64_t> received_headers(world * kHeaderWords);
  if (via_hub) {
    // Built on the host (the hub is a CPU-only mode): no device memory to read.
    TORCH_INTERNAL_ASSERT(recv1.is_cpu());
    std::memcpy(received_headers.data(), recv1.const_data_ptr(), headers_bytes);
  } else {
    // The one copy to the host of this exchange (NOTE [ One host read per exchange ]).
    const at::Tensor rows = recv1.view({world, block_bytes}).narrow(1, 0, kHeaderBytes).view(at::kLong);
    Agreement words_only;
    if (device_words) {
      words_only.words = agreement.words;
    }
    outcome.words_out = read_to_host(words_only, rows, world, received_headers.data()).words;
  }
  const int64_t* t = received_headers.data();
  auto field = [&](int64_t rank, int64_t f) { return t[rank * kHeaderWords + f]; };
  // Before anything can raise: every rank of the group records the same next slot size.
  slot_history().record(pg, next_slot_size(field, world));
  if (error) {
    std::rethrow_exception(error);
  }
  if (field(me, kError) != 0) {
    raise_own_status(agreement, op, field(me, kError)); // this rank's input failed a check on its device
  }
  for (int64_t r = 0; r < world; ++r) {
    if (field(r, kError) != 0) {
      raise_peer_failure(op, static_cast<ErrorCode>(field(r, kError)), r);
    }
  }
  for (int64_t r = 0; r < world; ++r) {
    std::copy_n(t + r * kHeaderWords + kNote0, kNotes, outcome.notes[r].begin());
    outcome.words_in[r] = field(r, kWord);
  }
  for (int64_t r = 0; r < world; ++r) {
    TORCH_CHECK(field(r, kOp) == static_cast<int64_t>(op), "torch_shard.", op_name(op), ": rank ", r,
                " is running torch_shard.", op_name(static_cast<OpKind>(field(r, kOp))),
                " while this rank runs torch_shard.", op_name(op),
                "; every rank of the group must call the same collective");
  }
  check(agreed_values(t, world), me);
  fault_point(op, me, /*before_agreement=*/false); // test-only; see NOTE [ Fault injection ]

  // ---- Moves -----------------------------------------------------------------------------------------
  std::vector<int64_t> declared(world, 0);
  // Payload bytes p appended to its round-1 message to this rank (NOTE [ Payloads riding the hub's
  // messages ]): all of its message, never more than this rank made room for.
  std::vector<int64_t> appended_in(world, 0);
  bool mismatch = false;
  bool round2 = false;
  int64_t sent = 0, received = 0;
  for (int64_t p = 0; p < world; ++p) {
    if (p == me) {
      continue;
    }
    declared[p] = field(p, kBytes);
    const int64_t expected = moves->recv[p].bytes;
    if (expected != kDeclared && expected != declared[p]) {
      mismatch = true;
    }
    appended_in[p] = field(p, kAppended);
    if (appended_in[p] != 0) {
      const int64_t limit = me == kHub ? kHubAppendMaxBytes : (p == kHub ? room : 0);
      TORCH_CHECK(via_hub && appended_in[p] == declared[p] && appended_in[p] <= limit, "torch_shard.",
                  op_name(op), ": internal error: rank ", p, " appended ", appended_in[p],
                  " bytes to its round-1 message, which this rank cannot take; please report this");
    }
    round2 = round2 || field(p, kFits) == 0;
    sent += moves->send[p].bytes;
    received += declared[p];
  }
  round2 = round2 || !fits;
  const int64_t messages = round_two_messages(t, world);
  int64_t largest = 0; // the group's largest message: the same on every rank
  for (int64_t r = 0; r < world; ++r) {
    largest = std::max(largest, field(r, kMaxMessage));
  }
  const bool point_to_point =
      device.is_cpu() && (messages <= 2 * (world - 1) || largest >= kPointToPointFromBytes);
  stats.bytes_sent_to_peers += sent;
  stats.bytes_received_from_peers += received;

  // Where each payload that did not wait for round 2 starts: in recv1 (a slot, or the hub's appended
  // payload after the others), or, on the hub, in the sender's round-1 message (right after its
  // headers: a rank that appends has no slot payloads). See NOTE [ Hub messages ].
  std::vector<int64_t> round_one_at(world, -1);
  {
    int64_t at = headers_bytes;
    for (int64_t p = 0; p < world; ++p) {
      if (p == me || declared[p] <= 0) {
        continue;
      }
      if (field(p, kFits) != 0) {
        round_one_at[p] = via_hub ? at : p * block_bytes + kHeaderBytes;
        at += padded16(declared[p]);
      }
    }
    for (int64_t p = 0; p < world; ++p) {
      if (appended_in[p] > 0 && !ahead) {
        round_one_at[p] = me == kHub ? headers_bytes : at;
      }
    }
    // (A payload the hub sent ahead is already in place, straight in the shard: it has no offset.)
    for (int64_t p = 0; p < world; ++p) {
      const int64_t limit = me == kHub && appended_in[p] > 0 ? hub_messages[p].numel() : recv1.numel();
      TORCH_CHECK(round_one_at[p] < 0 || round_one_at[p] + declared[p] <= limit, "torch_shard.", op_name(op),
                  ": internal error: the round-1 message from rank ", p,
                  " is shorter than its headers say; please report this");
    }
  }
  // The payload from p that came with round 1: in a slot, appended, or sent ahead into the shard.
  auto round_one_payload = [&](int64_t p) -> at::Tensor {
    if (appended_in[p] > 0 && ahead) {
      return moves->recv[p].direct;
    }
    const at::Tensor& message = me == kHub && appended_in[p] > 0 ? hub_messages[p] : recv1;
    return message.narrow(0, round_one_at[p], declared[p]);
  };
  auto deliver = [&](int64_t p, const at::Tensor& bytes) {
    const Incoming& in = moves->recv[p];
    if (mismatch || declared[p] == 0) {
      return;
    }
    if (in.direct.defined()) {
      if (in.direct.data_ptr() != bytes.data_ptr()) {
        in.direct.copy_(bytes);
      }
    } else {
      in.unpack(bytes);
    }
  };

  if (!round2) {
    stats.single_round_ops += 1;
    if (moves->local) {
      moves->local();
    }
    for (int64_t p = 0; p < world; ++p) {
      if (p != me && declared[p] > 0) {
        deliver(p, round_one_payload(p));
      }
    }
  } else if (point_to_point) {
    // Point-to-point between the pairs that still have data to move.
    auto sends_here = [&](int64_t p) {
      return field(p, kFits) == 0 && declared[p] > 0 && appended_in[p] == 0;
    };
    auto sends_there = [&](int64_t p) { return !fits && moves->send[p].bytes > 0 && appended_out[p] == 0; };
    int64_t pack_bytes = 0, stage_bytes = 0;
    for (int64_t p = 0; p < world; ++p) {
      if (p == me) {
        continue;
      }
      if (sends_there(p) && !moves->send[p].direct.defined()) {
        pack_bytes += moves->send[p].bytes;
      }
      const bool direct = !mismatch && moves->recv[p].direct.defined();
      if (sends_here(p) && !direct) {
        stage_bytes += declared[p];
      }
    }
    at::Tensor pack_buffer = pack_bytes ? workspace(pack_bytes, device, 0) : at::Tensor();
    at::Tensor stage_buffer = stage_bytes ? workspace(stage_bytes, device, 2) : at::Tensor();
    std::vector<c10::intrusive_ptr<c10d::Work>> recv_work(world), send_work(world);
    std::vector<at::Tensor> landed(world);
    int64_t stage_pos = 0;
    bool posted = false;
    for (int64_t k = 1; k < world; ++k) {
      const int64_t p = (me - k + world) % world;
      if (!sends_here(p)) {
        continue;
      }
      const bool direct = !mismatch && moves->recv[p].direct.defined();
      landed[p] = direct ? moves->recv[p].direct : stage_buffer.narrow(0, stage_pos, declared[p]);
      if (!direct) {
        stage_pos += declared[p];
      }
      recv_work[p] = recv_bytes(pg, landed[p], p);
      posted = true;
    }
    int64_t pack_pos = 0;
    for (int64_t k = 1; k < world; ++k) {
      const int64_t p = (me + k) % world;
      if (!sends_there(p)) {
        continue;
      }
      const Outgoing& out = moves->send[p];
      at::Tensor message = out.direct;
      if (!message.defined()) {
        message = pack_buffer.narrow(0, pack_pos, out.bytes);
        pack_pos += out.bytes;
        out.pack(message);
      }
      send_work[p] = send_bytes(pg, message, p);
      posted = true;
    }
    // A rank whose payloads all rode in round 1 took no part in a second round.
    if (posted) {
      stats.collectives += 1;
    } else {
      stats.single_round_ops += 1;
    }
    // What stays on this rank moves while the network works.
    if (moves->local) {
      moves->local();
    }
    for (int64_t p = 0; p < world; ++p) {
      if (p != me && declared[p] > 0 && !sends_here(p)) {
        deliver(p, round_one_payload(p));
      }
    }
    for (int64_t p = 0; p < world; ++p) {
      if (recv_work[p]) {
        recv_work[p]->wait();
        deliver(p, landed[p]);
      }
    }
    for (int64_t p = 0; p < world; ++p) {
      if (send_work[p]) {
        send_work[p]->wait();
      }
    }
  } else {
    // One all-to-all of the messages that did not ride in round 1 (dense patterns, and CUDA).
    std::vector<int64_t> out_splits(world, 0), in_splits(world, 0);
    for (int64_t p = 0; p < world; ++p) {
      if (p == me) {
        continue;
      }
      out_splits[p] = fits || appended_out[p] > 0 ? 0 : moves->send[p].bytes;
      in_splits[p] = field(p, kFits) != 0 || appended_in[p] > 0 ? 0 : declared[p];
    }
    // See NOTE [ Whole buffers ].
    auto outgoing = [&](int64_t p) -> const at::Tensor& {
      return p == me ? moves->self_send.direct : moves->send[p].direct;
    };
    auto incoming = [&](int64_t p) -> const at::Tensor& {
      return p == me ? moves->self_recv.direct : moves->recv[p].direct;
    };
    const int64_t self_bytes = moves->self_send.bytes;
    const bool self_describable = self_bytes > 0 && moves->self_recv.bytes == self_bytes &&
                                  (moves->self_send.direct.defined() || moves->self_send.pack) &&
                                  (moves->self_recv.direct.defined() || moves->self_recv.unpack);
    auto splits_with_self = [&](std::vector<int64_t> splits, bool with_self) {
      splits[me] = with_self ? self_bytes : 0;
      return splits;
    };
    at::Tensor whole_send, whole_recv;
    bool include_self = false;
    for (bool with_self : {true, false}) {
      if (with_self && !self_describable) {
        continue;
      }
      at::Tensor s = whole_buffer(splits_with_self(out_splits, with_self), outgoing);
      at::Tensor r = mismatch ? at::Tensor() : whole_buffer(splits_with_self(in_splits, with_self), incoming);
      if (s.defined() || r.defined()) {
        whole_send = s;
        whole_recv = r;
        include_self = with_self;
        break;
      }
    }
    out_splits = splits_with_self(out_splits, include_self);
    in_splits = splits_with_self(in_splits, include_self);
    int64_t out_total = 0, in_total = 0;
    for (int64_t p = 0; p < world; ++p) {
      out_total += out_splits[p];
      in_total += in_splits[p];
    }
    at::Tensor out_buffer = whole_send.defined() ? whole_send : workspace(out_total, device, 0);
    at::Tensor in_buffer = whole_recv.defined() ? whole_recv : workspace(in_total, device, 2);
    if (!whole_send.defined()) {
      int64_t pos = 0;
      for (int64_t p = 0; p < world; ++p) {
        if (out_splits[p] > 0) {
          at::Tensor into = out_buffer.narrow(0, pos, out_splits[p]);
          const Outgoing& out = p == me ? moves->self_send : moves->send[p];
          if (out.direct.defined()) {
            into.copy_(out.direct);
          } else {
            out.pack(into);
          }
          pos += out_splits[p];
        }
      }
    }
    all_to_all_bytes(pg, in_buffer, out_buffer, in_splits, out_splits);
    if (!include_self && moves->local) {
      moves->local();
    }
    int64_t pos = 0;
    for (int64_t p = 0; p < world; ++p) {
      if (p == me) {
        if (include_self) {
          const at::Tensor mine_back = in_buffer.narrow(0, pos, self_bytes);
          const Incoming& in = moves->self_recv;
          if (!in.direct.defined()) {
            in.unpack(mine_back);
          } else if (in.direct.data_ptr() != mine_back.data_ptr()) {
            in.direct.copy_(mine_back);
          }
          pos += self_bytes;
        }
        continue;
      }
      if (declared[p] == 0) {
        continue;
      }
      if (field(p, kFits) != 0 || appended_in[p] > 0) {
        deliver(p, round_one_payload(p));
      } else {
        deliver(p, in_buffer.narrow(0, pos, declared[p]));
        pos += declared[p];
      }
    }
  }
  sent_ahead.wait_all();
  TORCH_CHECK(!mismatch, "torch_shard.", op_name(op),
              ": internal error: a peer sent a different number of bytes than this rank's plan "
              "expects although every rank agreed on the layouts; please report this");
  outcome.declared = std::move(declared);
  return outcome;
}

} // namespace comm

TORCH_LIBRARY_IMPL(torch_shard, CompositeImplicitAutograd, m) {
  m.impl("_inject_fault", TORCH_FN(comm::inject_fault_op));
  m.impl("_set_round_one", TORCH_FN(comm::set_round_one));
}

} // namespace torch_shard
