// Round 1 of the agreed exchange for a group: its slot size, whether it runs through the hub
// (comm/hub.cpp) or as one all-to-all (here), and what it costs as the group grows.

#include <algorithm>
#include <iterator>
#include <mutex>
#include <unordered_map>

#include <ATen/ops/from_blob.h>
#include <c10/util/Exception.h>

#include "comm/exchange_state.h"
#include "comm/process_group.h"

namespace torch_shard {
namespace comm {

// NOTE [ Slot size from the group's history ]
// Round 1's size per peer must be the same on every rank and must not depend on the arguments (they
// may disagree), so it cannot be taken from the op at hand. It can be taken from the group's PAST:
// every header carries its sender's largest message to a peer, so after round 1 every rank of the
// group holds the same table and derives the same slot size for the group's NEXT op. A dense op (an
// all-to-all-like reshard: more messages than a one-to-many or many-to-one pattern has) sets the
// next slot to its largest message, rounded up, between kMinSlotBytes and kMaxSlotBytes; any other
// op, or one that failed, sets it back to kMinSlotBytes. So a training loop that reshards the same
// medium-sized tensor every step moves it in ONE round from the second step on, and a sparse op (a
// gather) never pays for a big slot twice. The state is kept per process-group object (SlotHistory)
// and updated before any verdict can raise. Whatever the history says, the slot stays within round
// 1's budget: see NOTE [ Round 1's cost as the group grows ].
constexpr int64_t kMinSlotBytes = 16384;
constexpr int64_t kMaxSlotBytes = int64_t{256} << 10;

// NOTE [ Round 1's cost as the group grows ]
// Round 1 runs before anything is known about the op, so its size per peer is fixed for the group:
// a header (kHeaderBytes) plus the slot. Every rank sends W - 1 of them (all-to-all), or, through the
// hub, every rank sends the hub W headers plus its riding payloads and the hub sends each rank W
// headers plus theirs. To keep a rank's round-1 bytes O(W x header) as W grows, the payload a rank
// can put into round 1 is bounded for the whole round, not per peer: the slot is at most
// kRoundOneBudget / W (rounded down to 16 bytes), and none below kMinUsefulSlot. So an op among 4 or
// 16 ranks rides in round 1 when each message fits 16 KiB, one among 1024 ranks sends 1024 headers
// and at most 256 bytes per peer (256 KiB), never 1024 slots of 16 KiB. The hub's own bytes grow with
// W^2 headers, which is why it serves small groups only (NOTE [ Round 1 through a hub ]).
// torch.ops.torch_shard_testing._round_one_cost computes these figures from the functions below.
constexpr int64_t kRoundOneBudget = int64_t{256} << 10;
constexpr int64_t kMinUsefulSlot = 256;

// NOTE [ Round 1 through a hub ]
// What a gloo collective costs on a CPU group is mostly per-message work (socket calls and thread
// hand-offs, each paid by every process), not bytes: an all-to-all is W(W-1) messages, while the same
// blocks sent to one rank and sent back from it are 2(W-1). So on CPU groups of at most kHubMaxWorld
// ranks, round 1 goes through a hub, group rank 0: every other rank sends it its round-1 blocks (a
// header, and a payload that fits its slot, for each destination); the hub then sends each rank
// exactly what an all-to-all would have delivered to it (block p: what rank p addressed to it).
// Every rank ends with the same headers as after the all-to-all, so the verdict, the slots and round
// 2 are unchanged; small payloads between two non-hub ranks are relayed by the hub. The mode depends
// only on the group (its backend and size) and the slot size every rank agreed on, never on
// arguments, so all ranks pick the same one. Larger groups (the hub handles W^2 headers and relays
// their payloads), CUDA (NCCL's all-to-all is one kernel), groups without point-to-point messages
// (a backend written in Python) and slots above kHubMaxSlotBytes (relaying doubles the bytes between
// non-hub ranks) keep the all-to-all. README's benchmark section has the measurements that set
// kHubMaxWorld. A peer whose round-1 message fails to arrive (its process ended, its connection broke)
// is reported by the hub to everyone as lost (kLost), so no rank waits on it. A timeout is different:
// gloo closes every connection of the process whose wait timed out (the hub's, for a rank that stalls
// past the group's timeout), so the others raise gloo's own error (connection closed, or their own
// timeout) at once, and the late rank fails on the closed connection: no rank hangs, no late message
// can be taken for a later op's, and, as after any timeout in c10d, the group cannot be used again.
constexpr int64_t kHubMaxWorld = 8;
constexpr int64_t kHubMaxSlotBytes = int64_t{64} << 10;

namespace {

std::mutex options_mutex;
ExchangeOptions current_options; // guarded by options_mutex

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
int64_t next_slot_size(const Exchange& x) {
  int64_t messages = 0, largest = 0;
  for (int64_t r = 0; r < x.world; ++r) {
    if (x.field(r, kError) != 0 || x.field(r, kOp) != x.field(0, kOp)) {
      return kMinSlotBytes;
    }
    messages += x.field(r, kPeers);
    largest = std::max(largest, x.field(r, kMaxMessage));
  }
  if (messages <= 2 * (x.world - 1) || largest <= kMinSlotBytes || largest > kMaxSlotBytes) {
    return kMinSlotBytes;
  }
  constexpr int64_t kAlign = 4096;
  return std::min((largest + kAlign - 1) / kAlign * kAlign, kMaxSlotBytes);
}

} // namespace

ExchangeOptions exchange_options() {
  std::lock_guard<std::mutex> lock(options_mutex);
  return current_options;
}

void set_exchange_options(const ExchangeOptions& options) {
  std::lock_guard<std::mutex> lock(options_mutex);
  current_options = options;
}

int64_t round_one_slot(int64_t world, int64_t history_slot) {
  const int64_t bound = kRoundOneBudget / std::max<int64_t>(world, 1) / 16 * 16;
  const int64_t slot = std::min(history_slot, bound);
  return slot < kMinUsefulSlot ? 0 : slot;
}

bool round_one_via_hub(bool cpu, bool p2p, int64_t world, int64_t slot_bytes, int64_t hub_max_world) {
  const int64_t largest = hub_max_world > 0 ? hub_max_world : kHubMaxWorld;
  return cpu && p2p && world >= 2 && world <= largest && slot_bytes <= kHubMaxSlotBytes;
}

void plan_round_one(Exchange& x) {
  const ExchangeOptions options = exchange_options();
  const int64_t history = options.slot_history ? slot_history().slot_for(x.pg) : kMinSlotBytes;
  x.slot_bytes = round_one_slot(x.world, history);
  x.block_bytes = kHeaderBytes + x.slot_bytes;
  x.via_hub = options.hub &&
              round_one_via_hub(x.device.is_cpu(), x.p2p, x.world, x.slot_bytes, options.hub_max_world);
}

void record_next_slot(const Exchange& x) {
  slot_history().record(x.pg, next_slot_size(x));
}

void all_to_all_round_one(Exchange& x) {
  const int64_t world = x.world;
  x.send1 = workspace(world * x.block_bytes, x.device, 0);
  x.recv1 = workspace(world * x.block_bytes, x.device, 1);
  at::Tensor blocks = x.send1.view({world, x.block_bytes});
  // Headers are written on the host and copied once (a device copy when the buffers live on a GPU);
  // device-computed words join them on the device (NOTE [ One host read per exchange ]).
  at::Tensor header_words = blocks.narrow(1, 0, kHeaderBytes).view(at::kLong); // [world, kHeaderWords]
  header_words.copy_(
      at::from_blob(x.headers.data(), {world, kHeaderWords}, at::TensorOptions().dtype(at::kLong)));
  if (x.device_words && x.agreement.status.defined()) {
    header_words.select(1, kError).copy_(x.agreement.status.reshape({1}).expand({world}));
  }
  if (x.device_words && x.agreement.words.defined()) {
    header_words.select(1, kWord).copy_(x.agreement.words);
  }
  for (int64_t p = 0; p < world && x.fits; ++p) {
    if (p != x.me && x.moves->send[p].bytes > 0) {
      x.write_payload(p, blocks.select(0, p).narrow(0, kHeaderBytes, x.moves->send[p].bytes));
    }
  }
  std::vector<int64_t> splits(world, x.block_bytes);
  std::vector<int64_t> recv_splits = splits;
  all_to_all_bytes(x.pg, x.recv1, x.send1, recv_splits, splits);
  // The one copy to the host of this exchange.
  const at::Tensor rows = x.recv1.view({world, x.block_bytes}).narrow(1, 0, kHeaderBytes).view(at::kLong);
  Agreement words_only;
  if (x.device_words) {
    words_only.words = x.agreement.words;
  }
  x.table.assign(world * kHeaderWords, 0);
  x.words_out = read_to_host(words_only, rows, world, x.table.data()).words;
}

// [through the hub (0/1), slot bytes, messages of the busiest rank, its bytes with headers only, its
// bytes with every slot full, messages of any other rank] of one round 1 in a group of `world`.
std::vector<int64_t> round_one_cost(int64_t world, bool cpu, bool p2p) {
  TORCH_CHECK_VALUE(world >= 1, "torch_shard: world must be at least 1, got ", world);
  const int64_t slot = round_one_slot(world, kMinSlotBytes);
  const bool hub = round_one_via_hub(cpu, p2p, world, slot, exchange_options().hub_max_world);
  const int64_t headers = world * kHeaderBytes;
  if (world == 1) {
    return {0, slot, 0, 0, 0, 0};
  }
  if (hub) {
    // The hub receives W - 1 messages and sends W - 1; each carries W headers and up to W - 1 payloads.
    const int64_t message = headers + (world - 1) * slot;
    return {1, slot, 2 * (world - 1), 2 * (world - 1) * headers, 2 * (world - 1) * message, 2};
  }
  // All-to-all: W - 1 blocks out and W - 1 in per rank (the rank's own block stays local).
  return {0,
          slot,
          2 * (world - 1),
          2 * (world - 1) * kHeaderBytes,
          2 * (world - 1) * (kHeaderBytes + slot),
          2 * (world - 1)};
}

} // namespace comm
} // namespace torch_shard
