// Round 1 of the agreed exchange (NOTE [ Agreed exchange ] in comm/exchange.cpp) for a group: its slot
// size, whether it runs through the hub (comm/hub.cpp) or as one all-to-all (here, of fixed blocks or of
// used bytes), how the group's history decides that, and what round 1 costs as the group grows.

#include <algorithm>
#include <cstring>
#include <deque>
#include <iterator>
#include <mutex>
#include <unordered_map>
#include <utility>

#include <ATen/ops/empty.h>
#include <ATen/ops/from_blob.h>
#include <c10/util/Exception.h>
#include <c10/util/intrusive_ptr.h>

#include "comm/exchange_state.h"
#include "comm/process_group.h"
#include "layout/layout.h"

namespace torch_shard {
namespace comm {

// Round 1's slot: a payload of at most this many bytes per peer rides in round 1 (an op whose payloads
// all fit is done in one round), within the budget below.
constexpr int64_t kSlotBytes = 16384;

// NOTE [ Round 1's cost as the group grows ]
// Round 1 runs before anything is known about the op, so its block per peer is fixed for the group: a
// header (kHeaderBytes) plus the slot. So that a rank's round-1 bytes stay O(W x header) as W grows,
// the payload it can put into round 1 is bounded for the whole round, not per peer: the slot is
// kSlotBytes, at most kRoundOneBudget / W (rounded down to 16 bytes), and 0 below kMinUsefulSlot; among
// 1024 ranks a rank sends 1024 headers and at most 256 bytes per peer, never 1024 slots of 16 KiB. The
// hub's own bytes grow with W^2 headers and the payloads it relays (at most W budgets in and out), which
// is why it serves small groups only (NOTE [ Round 1 through a hub ]). This budget bounds rounds whose
// blocks are padded to the slot (through the hub; on NCCL); an all-to-all of used bytes on gloo sends
// no padding and has its own slot and budget (NOTE [ Round 1 of used bytes ]).
// The test library computes these figures (torch.ops.torch_shard_testing._round_one_cost) from
// round_one_plan, which plans with the functions below.
constexpr int64_t kRoundOneBudget = int64_t{256} << 10;
constexpr int64_t kMinUsefulSlot = 256;

// NOTE [ Round 1 through a hub ]
// On a CPU group a gloo collective costs mostly per-message work (socket calls, thread hand-offs), not
// bytes: an all-to-all is W(W-1) messages, the same blocks sent to one rank and back 2(W-1). So on CPU
// groups of at most kHubMaxWorld ranks round 1 can go through a hub, group rank 0: every rank sends it
// its round-1 blocks (a header, and a payload that fits its slot, per destination), and the hub sends
// each rank exactly what an all-to-all would have delivered (block p: what rank p addressed to it).
// Every rank ends with the same headers, so the verdict, the slots and round 2 are unchanged. The mode
// depends only on the group and its history, never on arguments, so all ranks pick the same one
// (NOTE [ Round 1 follows the group's history ]). kHubMaxWorld is the largest group where the hub beat
// the all-to-all, on one host and across two (docs/performance.md, "Figures behind design choices"):
// its W^2 headers erode the advantage as W grows. CUDA groups (NCCL's all-to-all is one kernel) and groups
// without point-to-point messages (a backend written in Python) keep the all-to-all.
// Faults: the hub reports a peer whose round-1 message fails to arrive (process ended, connection
// broken) to everyone as lost (kLost), so no rank waits on it. On a timeout gloo closes every
// connection of the process whose wait timed out (the hub's, when a rank stalls past the group's
// timeout), so the others raise at once and the late rank fails on the closed connection: no rank
// hangs, no late message is taken for a later op's, and, as after any c10d timeout, the group cannot
// be used again.
constexpr int64_t kHubMaxWorld = 16;

// NOTE [ Round 1 of used bytes ]
// gloo accepts a message shorter than the receive posted for it, never a longer one (its transport
// checks the length before it writes; NOTE [ Hub messages ] relies on this too). So an all-to-all
// round 1 on a gloo CPU group receives W - 1 blocks of header + slot at fixed places, but sends each
// peer only the header and the payload it has for that peer. The slot then costs receive memory, not
// bytes on the wire, and can be a medium message: kDirectSlotBytes per peer within kDirectBudgetBytes
// per round, so a dense op whose messages all fit moves in one all-to-all, headers and data together.
// Backends that need matching sizes (NCCL, a backend written in Python) keep fixed blocks and the
// small slot of NOTE [ Round 1's cost as the group grows ].
constexpr int64_t kDirectSlotBytes = int64_t{256} << 10;
constexpr int64_t kDirectBudgetBytes = int64_t{4} << 20;

// NOTE [ Round 1 follows the group's history ]
// How round 1 runs is settled before anyone reads the op's arguments (they may differ between ranks),
// from what every rank knows alike: the group (backend, size) and the ops it ran, as all ranks saw them
// in the same header tables. Programs repeat (a training step's reshards, redistributes and lookups; a
// forward move and its backward's reverse), so every rank predicts the op to come as the one that
// followed the last op the previous time the group ran it, else the last op again. An op is known by
// its kind and agreed values (layout fingerprints, roots, sizes); an op that failed or ran differently
// on different ranks predicts nothing. The prediction sets:
//   * the mode, on groups that have the hub: an all-to-all when the predicted op is dense (more than
//     W - 1 messages) with messages that do not fit the hub's slot, which through the hub would need
//     round 2 after it (kPeers and kMaxMessage are in every header); the hub otherwise, and without a
//     prediction. A scatter or a gather stays on the hub at any size: payloads up to
//     kHubAppendMaxBytes ride its messages (NOTE [ Payloads riding the hub's messages ]), and bigger
//     ones go point to point in round 2, straight into the destination, which beats an all-to-all
//     whose copies out of its receive buffers follow the transfer (docs/performance.md, "Figures
//     behind design choices");
//   * the rooms of an all-to-all round 1 (NOTE [ Rooms ]).
// Every rank records the op (History, per group object) right after round 1, before the verdict can
// raise, so every rank of a group always plans the same round 1.

// NOTE [ Rooms ]
// An all-to-all round 1 gives each pair of ranks a block: a header, then room for a payload, which
// rides in round 1 if it fits (the rest waits for round 2, sized by the headers). A room must be the
// SAME number at both ends whatever either is doing (the receiver posts it; gloo ends a process that
// receives a longer message, NCCL needs equal sizes), so it cannot come from the op's arguments. It is
// the pair's payload, sender to receiver, in the predicted op, which both ends know (the sender sent
// it, the receiver read it in the sender's header, kBytes), at least the base slot and at most a
// budget / W. So a loop of ops the group has run twice moves everything in round 1, one collective at
// any size; an op the history does not predict costs round 1 and round 2.
// Where gloo takes shorter messages (NOTE [ Round 1 of used bytes ]) a room costs receive memory, not
// bytes on the wire, so it is also at least the pair's largest payload of the last kPeakWindow ops (a
// mispredicted op of a recent size still rides), within kRoomBudget per rank. With fixed blocks (NCCL,
// a backend written in Python) room beyond the payload is padding on the wire, so a room is the
// predicted payload alone, within kPaddedRoomBudget per rank: that bounds what a misprediction wastes.
constexpr int64_t kRoomBudget = int64_t{1} << 30;
constexpr int64_t kPaddedRoomBudget = int64_t{64} << 20;
constexpr int64_t kPeakWindow = 64;
// The ops the prediction looks back over.
constexpr size_t kRemembered = 32;

// NOTE [ Headers on the host ]
// On a CUDA group round 1's blocks live in device memory, and reading their headers for the verdict
// would cost a host sync per op. Where the group also has a CPU backend (init_process_group with
// "cpu:gloo,cuda:nccl", torch's default when no backend is named), round 1 is two collectives issued
// back to back: the payload blocks (each pair's room, NOTE [ Rooms ]) on the device, which the host
// only enqueues, then the headers, built and read on the host, over the CPU backend. The verdict needs
// no device memory; payloads are unpacked only once it passed, and round 2 is sized by the headers. So
// a steady-state reshard, redistribute, gather or scatter there never reads device memory on the host;
// device-computed words (a lookup's counts and input checks) are read once, before round 1: the one
// read of NOTE [ One host read per exchange ]. A CUDA group without a CPU backend reads its headers
// from the device. The split never depends on the op and both collectives run on every rank whatever
// its arguments (the rooms agree at both ends), so round 1's guarantees hold and ranks that run
// different ops reach the verdict that names the mismatch. ExchangeOptions::split runs the split
// on CPU groups, where the suite checks it.

namespace {

std::mutex options_mutex;
ExchangeOptions current_options; // guarded by options_mutex

} // namespace

ExchangeOptions exchange_options() {
  std::lock_guard<std::mutex> lock(options_mutex);
  return current_options;
}

void set_exchange_options(const ExchangeOptions& options) {
  std::lock_guard<std::mutex> lock(options_mutex);
  current_options = options;
}

// The slot of a round 1 through the hub or of fixed blocks (NOTE [ Round 1's cost as the group grows ]).
int64_t round_one_slot(int64_t world) {
  const int64_t bound = kRoundOneBudget / std::max<int64_t>(world, 1) / 16 * 16;
  const int64_t slot = std::min(kSlotBytes, bound);
  return slot < kMinUsefulSlot ? 0 : slot;
}

// The slot of an all-to-all round 1 of used bytes (NOTE [ Round 1 of used bytes ]).
int64_t direct_slot(int64_t world) {
  const int64_t bound = kDirectBudgetBytes / std::max<int64_t>(world, 1) / 16 * 16;
  return std::max(std::min(kDirectSlotBytes, bound), round_one_slot(world));
}

// See NOTE [ Round 1 follows the group's history ]. Entries are per group OBJECT, each holding a weak
// reference, which keeps the object's memory reserved (not the group alive), so no other group can
// appear at that address while its entry exists; entries of destroyed groups are dropped. A group
// created again under an old name starts without history on every member.
class History {
public:
  // The largest payload a pair carried within the window, and the op (counted on the group) that last
  // carried at least that much.
  struct Peak {
    int64_t bytes = 0;
    int64_t at = 0;
  };
  // One op as every rank saw it.
  struct Op {
    uint64_t key = 0;                    // its kind and agreed values (meaningful when clean)
    bool clean = false;                  // no rank failed and every rank ran it
    bool big = false;                    // its largest message did not fit the hub's slot
    bool dense = false;                  // it had more than W - 1 messages (not a scatter or a gather)
    std::vector<int64_t> sent, received; // payload bytes by peer: to it, from it
  };
  // What round 1 of the next op on a group plans with.
  struct Forecast {
    const Op* op = nullptr; // the predicted op (none: no prediction)
    const std::vector<Peak>* peak_sent = nullptr;
    const std::vector<Peak>* peak_received = nullptr;
  };

  // Calls `plan` with the forecast of `group`'s next op, under the lock (the forecast points into it).
  template <typename Plan>
  void forecast(c10d::ProcessGroup& group, Plan&& plan) {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = entries_.find(&group);
    if (it == entries_.end() || it->second.group.lock().get() != &group) {
      plan(Forecast{});
      return;
    }
    const Past& past = it->second.past;
    Forecast f{nullptr, &past.peak_sent, &past.peak_received};
    if (!past.ops.empty() && past.ops.back().clean) {
      const Op& last = past.ops.back();
      f.op = &last;
      for (size_t j = past.ops.size() - 1; j-- > 0;) {
        if (past.ops[j].clean && past.ops[j].key == last.key) {
          f.op = &past.ops[j + 1];
          break;
        }
      }
    }
    plan(f);
  }

  void record(c10d::ProcessGroup& group, Op op) {
    std::lock_guard<std::mutex> lock(mutex_);
    for (auto it = entries_.begin(); it != entries_.end();) {
      it = it->second.group.expired() ? entries_.erase(it) : std::next(it);
    }
    auto it = entries_.find(&group);
    if (it == entries_.end() || it->second.group.lock().get() != &group) {
      auto strong = c10::intrusive_ptr<c10d::ProcessGroup>::reclaim_copy(&group);
      it = entries_
               .insert_or_assign(&group, Entry{c10::weak_intrusive_ptr<c10d::ProcessGroup>(strong), Past{}})
               .first;
    }
    Past& past = it->second.past;
    const int64_t now = past.count++;
    // A peak older than the window gives way to the pair's current payload.
    auto update = [&](std::vector<Peak>& peaks, const std::vector<int64_t>& bytes) {
      peaks.resize(bytes.size());
      for (size_t p = 0; p < bytes.size(); ++p) {
        if (bytes[p] >= peaks[p].bytes || now - peaks[p].at >= kPeakWindow) {
          peaks[p] = Peak{bytes[p], now};
        }
      }
    };
    update(past.peak_sent, op.sent);
    update(past.peak_received, op.received);
    past.ops.push_back(std::move(op));
    if (past.ops.size() > kRemembered) {
      past.ops.pop_front();
    }
  }

private:
  struct Past {
    int64_t count = 0;  // exchanges the group ran
    std::deque<Op> ops; // the last kRemembered of them, oldest first
    std::vector<Peak> peak_sent, peak_received;
  };
  struct Entry {
    c10::weak_intrusive_ptr<c10d::ProcessGroup> group;
    Past past;
  };
  std::mutex mutex_;
  std::unordered_map<const c10d::ProcessGroup*, Entry> entries_;
};

History& history() {
  static History* ops = new History(); // never destroyed: exchanges may run during interpreter exit
  return *ops;
}

bool round_one_via_hub(bool cpu, bool p2p, int64_t world, int64_t hub_max_world) {
  const int64_t largest = hub_max_world > 0 ? hub_max_world : kHubMaxWorld;
  return cpu && p2p && world >= 2 && world <= largest;
}

namespace {

// The int64 word index of every header word of blocks starting at byte offsets `at` (multiples of 16),
// on `device`: [W * kHeaderWords], block by block.
at::Tensor header_words_at(const std::vector<int64_t>& at, c10::Device device) {
  std::vector<int64_t> words;
  words.reserve(at.size() * kHeaderWords);
  for (const int64_t start : at) {
    for (int64_t k = 0; k < kHeaderWords; ++k) {
      words.push_back(start / static_cast<int64_t>(sizeof(int64_t)) + k);
    }
  }
  const at::Tensor host =
      at::from_blob(words.data(), {static_cast<int64_t>(words.size())}, at::TensorOptions().dtype(at::kLong));
  return device.is_cuda() ? host.pin_memory().to(device, /*non_blocking=*/true) : host.clone();
}

// The payload of a pair (peer p, `bytes` by peer) in a recorded op: 0 where it has none.
int64_t pair_bytes(const std::vector<int64_t>& bytes, int64_t p) {
  return p < static_cast<int64_t>(bytes.size()) ? bytes[p] : 0;
}

int64_t peak_bytes(const std::vector<History::Peak>* peaks, int64_t p) {
  return peaks != nullptr && p < static_cast<int64_t>(peaks->size()) ? (*peaks)[p].bytes : 0;
}

} // namespace

void plan_round_one(Exchange& x) {
  const ExchangeOptions options = exchange_options();
  x.hub_group = options.hub && !options.split &&
                round_one_via_hub(x.device.is_cpu(), x.p2p, x.world, options.hub_max_world);
  x.room_in.assign(x.world, 0);
  x.room_out.assign(x.world, 0);
  history().forecast(x.pg, [&](const History::Forecast& f) {
    const History::Op* next = options.rooms ? f.op : nullptr;
    x.via_hub = x.hub_group && !(next != nullptr && next->big && next->dense);
    // Never from this rank's own state (a failed rank has no device words): every rank must run the
    // same round 1.
    x.split = !x.via_hub && x.p2p && (x.device.is_cuda() || options.split);
    x.unpadded = !x.via_hub && !x.split && x.p2p && x.device.is_cpu();
    x.slot_bytes = x.unpadded ? direct_slot(x.world) : round_one_slot(x.world);
    if (x.via_hub) {
      return;
    }
    const int64_t budget = x.unpadded ? kRoomBudget : kPaddedRoomBudget;
    const int64_t limit = std::max(budget / x.world / 16 * 16, x.slot_bytes);
    for (int64_t p = 0; p < x.world; ++p) {
      if (p == x.me) {
        continue;
      }
      int64_t in = x.slot_bytes, out = x.slot_bytes;
      if (next != nullptr) {
        in = std::max(in, pair_bytes(next->received, p));
        out = std::max(out, pair_bytes(next->sent, p));
      }
      if (x.unpadded && options.rooms) {
        in = std::max(in, peak_bytes(f.peak_received, p));
        out = std::max(out, peak_bytes(f.peak_sent, p));
      }
      x.room_in[p] = std::min(padded16(in), limit);
      x.room_out[p] = std::min(padded16(out), limit);
    }
  });
}

void remember_round_one(Exchange& x) {
  History::Op op;
  op.clean = true;
  op.sent.assign(x.world, 0);
  op.received.assign(x.world, 0);
  int64_t largest = 0, messages = 0;
  for (int64_t r = 0; r < x.world; ++r) {
    op.clean = op.clean && x.field(r, kError) == 0 && x.field(r, kOp) == static_cast<int64_t>(x.op);
    largest = std::max(largest, x.field(r, kMaxMessage));
    messages += x.field(r, kPeers);
    if (r != x.me) {
      // What the pair's headers said, as both ends read it: the sender's kBytes (0 from a failed rank).
      op.sent[r] = x.headers[r * kHeaderWords + kBytes];
      op.received[r] = x.field(r, kBytes);
    }
  }
  op.big = largest > round_one_slot(x.world);
  op.dense = messages > x.world - 1;
  // Rank 0's row: every rank holds it, and once the op was clean its agreed values are everyone's.
  layout::Fingerprint key;
  key.add(static_cast<int64_t>(x.op));
  for (int k = 0; k < kAgreedValues; ++k) {
    key.add(x.field(0, kValue0 + k));
  }
  op.key = key.value();
  history().record(x.pg, std::move(op));
}

namespace {

// Round 1's buffers for blocks of these sizes: x.send1, x.recv1 and where each received block starts
// (x.block_at); returns where each sent block starts.
std::vector<int64_t> place_blocks(Exchange& x, const std::vector<int64_t>& send_splits,
                                  const std::vector<int64_t>& recv_splits) {
  const int64_t world = x.world;
  std::vector<int64_t> send_at(world, 0);
  x.block_at.assign(world, 0);
  for (int64_t p = 1; p < world; ++p) {
    send_at[p] = send_at[p - 1] + send_splits[p - 1];
    x.block_at[p] = x.block_at[p - 1] + recv_splits[p - 1];
  }
  x.send1 = workspace(send_at[world - 1] + send_splits[world - 1], x.device, 0);
  x.recv1 = workspace(x.block_at[world - 1] + recv_splits[world - 1], x.device, 1);
  return send_at;
}

// Each payload that rides, into its block, `skip` bytes (its header) after the block's start.
void write_riding_payloads(const Exchange& x, const std::vector<int64_t>& send_at, int64_t skip) {
  std::vector<PayloadAt> payloads;
  for (int64_t p = 0; p < x.world; ++p) {
    if (p != x.me && x.rides_out[p] && x.moves->send[p].bytes > 0) {
      payloads.push_back({&x.moves->send[p], send_at[p] + skip});
    }
  }
  write_payloads(x.send1, payloads);
}

} // namespace

void all_to_all_round_one(Exchange& x) {
  const int64_t world = x.world;
  // Every rank receives from each peer a block of header + room; it sends each peer the same (fixed
  // blocks) or only its header and the payload that rides (NOTE [ Round 1 of used bytes ]); its own
  // block is a header.
  std::vector<int64_t> send_splits(world, kHeaderBytes), recv_splits(world, kHeaderBytes);
  for (int64_t p = 0; p < world; ++p) {
    if (p == x.me) {
      continue;
    }
    recv_splits[p] += x.room_in[p];
    send_splits[p] += x.unpadded ? (x.rides_out[p] ? padded16(x.moves->send[p].bytes) : 0) : x.room_out[p];
  }
  const std::vector<int64_t> send_at = place_blocks(x, send_splits, recv_splits);
  if (x.unpadded) {
    // Built on the host (a CPU group): the headers are copied in, as the hub does.
    device_words_into_headers(x);
    auto* out = static_cast<uint8_t*>(x.send1.data_ptr());
    for (int64_t p = 0; p < world; ++p) {
      std::memcpy(out + send_at[p], x.headers.data() + p * kHeaderWords, kHeaderBytes);
    }
  } else {
    // Headers are written on the host and copied once (a device copy when the buffers live on a GPU);
    // device-computed words join them on the device (NOTE [ One host read per exchange ]). Blocks
    // differ in size, so each header goes to its block's word offset.
    const at::Tensor host_headers =
        at::from_blob(x.headers.data(), {world, kHeaderWords}, at::TensorOptions().dtype(at::kLong));
    at::Tensor headers = x.device.is_cuda()
                             // From pageable memory a copy to the GPU waits for the stream (a host sync);
                             // from pinned memory it does not, and the caching host allocator keeps the
                             // pinned block until the copy has run.
                             ? host_headers.pin_memory().to(x.device, /*non_blocking=*/true)
                             : host_headers.clone();
    if (x.device_words && x.agreement.status.defined()) {
      headers.select(1, kError).copy_(x.agreement.status.reshape({1}).expand({world}));
    }
    if (x.device_words && x.agreement.words.defined()) {
      headers.select(1, kWord).copy_(x.agreement.words);
    }
    x.send1.view(at::kLong).index_copy_(0, header_words_at(send_at, x.device), headers.reshape({-1}));
  }
  write_riding_payloads(x, send_at, kHeaderBytes);
  all_to_all_bytes(x.pg, x.recv1, x.send1, recv_splits, send_splits);
  x.table.assign(world * kHeaderWords, 0);
  if (x.unpadded) {
    TORCH_INTERNAL_ASSERT(x.recv1.is_cpu());
    const auto* in = static_cast<const uint8_t*>(x.recv1.const_data_ptr());
    for (int64_t p = 0; p < world; ++p) {
      std::memcpy(x.table.data() + p * kHeaderWords, in + x.block_at[p], kHeaderBytes);
    }
    return;
  }
  // The one copy to the host of this exchange.
  comm_stats().header_reads += 1;
  const at::Tensor rows = x.recv1.view(at::kLong).index_select(0, header_words_at(x.block_at, x.device));
  Agreement words_only;
  if (x.device_words) {
    words_only.words = x.agreement.words;
  }
  x.words_out = read_to_host(words_only, rows, world, x.table.data()).words;
}

void split_round_one(Exchange& x) {
  const int64_t world = x.world;
  // Device-computed words (a lookup's) join the host's headers: the lookup's one read of device memory.
  device_words_into_headers(x);
  // The payload blocks: each pair's room, sent whole (the receiver posts exactly that).
  std::vector<int64_t> send_splits(world, 0), recv_splits(world, 0);
  for (int64_t p = 0; p < world; ++p) {
    if (p != x.me) {
      send_splits[p] = x.room_out[p];
      recv_splits[p] = x.room_in[p];
    }
  }
  write_riding_payloads(x, place_blocks(x, send_splits, recv_splits), 0);
  all_to_all_bytes(x.pg, x.recv1, x.send1, recv_splits, send_splits);
  // The headers, on the host (the group's CPU backend takes CPU tensors).
  std::vector<int64_t> header_splits(world, kHeaderBytes);
  at::Tensor out =
      at::from_blob(x.headers.data(), {world * kHeaderBytes}, at::TensorOptions().dtype(at::kByte));
  at::Tensor in = at::empty({world * kHeaderBytes}, at::TensorOptions().dtype(at::kByte));
  all_to_all_bytes(x.pg, in, out, header_splits, header_splits);
  x.table.assign(world * kHeaderWords, 0);
  std::memcpy(x.table.data(), in.const_data_ptr(), static_cast<size_t>(world * kHeaderBytes));
}

RoundOnePlan round_one_plan(int64_t world, bool cpu, bool p2p) {
  TORCH_CHECK_VALUE(world >= 1, "torch_shard: world must be at least 1, got ", world);
  RoundOnePlan plan;
  plan.hub = round_one_via_hub(cpu, p2p, world, exchange_options().hub_max_world);
  // plan_round_one's choice without a forecast: an all-to-all of used bytes where gloo carries the CPU
  // group's messages, else the base slot.
  plan.slot_bytes = !plan.hub && cpu && p2p ? direct_slot(world) : round_one_slot(world);
  plan.header_bytes = kHeaderBytes;
  return plan;
}

} // namespace comm
} // namespace torch_shard
