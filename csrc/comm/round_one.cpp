// Round 1 of the agreed exchange for a group: its slot size, whether it runs through the hub
// (comm/hub.cpp) or as one all-to-all (here), and what it costs as the group grows.

#include <algorithm>
#include <mutex>

#include <ATen/ops/from_blob.h>
#include <c10/util/Exception.h>

#include "comm/exchange_state.h"
#include "comm/process_group.h"

namespace torch_shard {
namespace comm {

// Round 1's slot: a payload of at most this many bytes per peer rides in round 1 (an op whose payloads
// all fit is done in one round), within the budget below.
constexpr int64_t kSlotBytes = 16384;

// NOTE [ Round 1's cost as the group grows ]
// Round 1 runs before anything is known about the op, so its size per peer is fixed for the group:
// a header (kHeaderBytes) plus the slot. Every rank sends W - 1 of them (all-to-all), or, through the
// hub, every rank sends the hub W headers plus its riding payloads and the hub sends each rank W
// headers plus theirs. To keep a rank's round-1 bytes O(W x header) as W grows, the payload a rank
// can put into round 1 is bounded for the whole round, not per peer: the slot is at most
// kRoundOneBudget / W (rounded down to 16 bytes), and none below kMinUsefulSlot. So an op among 4 or
// 16 ranks rides in round 1 when each message fits 16 KiB, one among 1024 ranks sends 1024 headers
// and at most 256 bytes per peer (256 KiB), never 1024 slots of 16 KiB. The hub's own bytes grow with
// W^2 headers and the payloads it relays (at most W budgets in and out), which is why it serves small
// groups only (NOTE [ Round 1 through a hub ]). The slot
// depends on the group's size alone; growing it from the group's history (a repeated dense reshard of
// medium messages in one round) was measured and removed: it did not win on one host and on two.
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
// only on the group (its backend and size), never on arguments, so all ranks pick the same one.
// The hub handles W^2 headers and relays their payloads, so its advantage must shrink as W grows; it
// was measured to win up to kHubMaxWorld ranks, on one host and across two (docs/benchmarks.md
// has the table that set it), and larger groups, never measured, keep the all-to-all. So do
// CUDA groups (NCCL's all-to-all is one kernel) and groups without
// point-to-point messages (a backend written in Python). A peer whose round-1 message fails to arrive
// (its process ended, its connection broke) is reported by the hub to everyone as lost (kLost), so no
// rank waits on it. A timeout is different: gloo closes every connection of the process whose wait
// timed out (the hub's, for a rank that stalls past the group's timeout), so the others raise gloo's
// own error (connection closed, or their own timeout) at once, and the late rank fails on the closed
// connection: no rank hangs, no late message can be taken for a later op's, and, as after any timeout
// in c10d, the group cannot be used again.
constexpr int64_t kHubMaxWorld = 16;

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

int64_t round_one_slot(int64_t world) {
  const int64_t bound = kRoundOneBudget / std::max<int64_t>(world, 1) / 16 * 16;
  const int64_t slot = std::min(kSlotBytes, bound);
  return slot < kMinUsefulSlot ? 0 : slot;
}

bool round_one_via_hub(bool cpu, bool p2p, int64_t world, int64_t hub_max_world) {
  const int64_t largest = hub_max_world > 0 ? hub_max_world : kHubMaxWorld;
  return cpu && p2p && world >= 2 && world <= largest;
}

void plan_round_one(Exchange& x) {
  const ExchangeOptions options = exchange_options();
  x.slot_bytes = round_one_slot(x.world);
  x.block_bytes = kHeaderBytes + x.slot_bytes;
  x.via_hub = options.hub && round_one_via_hub(x.device.is_cpu(), x.p2p, x.world, options.hub_max_world);
}

void all_to_all_round_one(Exchange& x) {
  const int64_t world = x.world;
  x.send1 = workspace(world * x.block_bytes, x.device, 0);
  x.recv1 = workspace(world * x.block_bytes, x.device, 1);
  at::Tensor blocks = x.send1.view({world, x.block_bytes});
  // Headers are written on the host and copied once (a device copy when the buffers live on a GPU);
  // device-computed words join them on the device (NOTE [ One host read per exchange ]).
  at::Tensor header_words = blocks.narrow(1, 0, kHeaderBytes).view(at::kLong); // [world, kHeaderWords]
  const at::Tensor host_headers =
      at::from_blob(x.headers.data(), {world, kHeaderWords}, at::TensorOptions().dtype(at::kLong));
  if (x.device.is_cuda()) {
    // From pageable memory a copy to the GPU waits for the stream (a host sync); from pinned memory it
    // does not, and the caching host allocator keeps the pinned block until the copy has run.
    header_words.copy_(host_headers.pin_memory(), /*non_blocking=*/true);
  } else {
    header_words.copy_(host_headers);
  }
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
  const int64_t slot = round_one_slot(world);
  const bool hub = round_one_via_hub(cpu, p2p, world, exchange_options().hub_max_world);
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
