// What the test-only library torch_shard._testing_C may change in the product. The product hands it
// these hooks as a capsule (torch_shard._C._testing_hooks) and never changes them itself: it injects
// no faults and cannot end the process; only the testing library, which tests load, can.
//
// Shared by two extension modules built against the same torch: plain types and at::Tensor only.
// csrc/testing_hooks.cpp fills them from the product.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

namespace torch_shard {

// How round 1 of the agreed exchange may run. The defaults are the product's; tests and benchmarks
// switch a mechanism off to drive other paths or to measure it against its absence.
struct ExchangeOptions {
  // Round 1 through the hub where the group allows (NOTE [ Round 1 through a hub ]).
  bool hub = true;
  // Payloads riding the hub's messages (NOTE [ Payloads riding the hub's messages ]).
  bool ride = true;
  // The largest group round 1 goes through the hub in (0: the product's).
  int64_t hub_max_world = 0;
  // Round 1 follows the group's history (NOTE [ Round 1 follows the group's history ]): its mode, and
  // an all-to-all's rooms (NOTE [ Rooms ]). Off, round 1 goes through the hub wherever the group has it
  // and every room is the base slot.
  bool rooms = true;
  // Round 1 with its headers on the host and its payloads as a second collective, as it runs on CUDA
  // groups that have a CPU backend (NOTE [ Headers on the host ]), on any group: the suite runs that
  // protocol on CPU groups with it.
  bool split = false;
};

// Called by every exchange of a data op (`op`: "shard", "gather", ...) as it starts (before_agreement)
// and right after the verdict. Unset (the product's state), it costs one relaxed atomic load.
using FaultHook = void (*)(const char* op, int64_t me, bool before_agreement);

struct TestingHooks {
  int64_t abi_version; // kTestingHooksVersion of the product that filled it
  void (*set_fault_hook)(FaultHook hook);
  ExchangeOptions (*exchange_options)();
  void (*set_exchange_options)(const ExchangeOptions& options);
  void (*clear_plan_cache)();
  // [through the hub (0/1), slot bytes, messages of the busiest rank, its bytes with headers only, its
  // bytes with every slot full, messages of any other rank] of one round 1 among `world` ranks.
  std::vector<int64_t> (*round_one_cost)(int64_t world, bool cpu, bool p2p);
  // The communication device (as a string) of the group registered under `group_name` for an op whose
  // tensors live on `tensors_device` ("" for none): NOTE [ Communication device ].
  std::string (*comm_device)(const std::string& group_name, const std::string& tensors_device);
  // Whether CPU tensors take the fused loops written for them (the product's) or the ATen composition
  // every other device takes (csrc/ops/lookup_common.h, cpu_loops()).
  void (*set_cpu_loops)(bool on);
  bool (*cpu_loops)();
  // The row-wise requester's bucketing (csrc/ops/routing.h): [what it sends (each owner of some ids:
  // its ids, then its per-bag lengths), its ids' positions in owner order, its words, mean's divisors]
  // of `ids` over each rank's rows (`offsets` undefined: no bags), by the path cpu_loops() picks.
  std::vector<at::Tensor> (*bucket_ids)(const at::Tensor& ids, const at::Tensor& offsets,
                                        const std::vector<int64_t>& block_starts,
                                        const std::vector<int64_t>& block_sizes, int64_t num_embeddings,
                                        int64_t padding_idx);
  // The owner's unpacking of what its requesters sent: [ids less row_start, bags' offsets].
  std::vector<at::Tensor> (*unpack_received)(const at::Tensor& received,
                                             const std::vector<int64_t>& counts_in,
                                             const std::vector<int64_t>& bags_in, bool bags,
                                             int64_t row_start);
};

// Bumped whenever TestingHooks changes; the testing library refuses a product of another version.
constexpr int64_t kTestingHooksVersion = 6;

// The product's hooks (csrc/testing_hooks.cpp).
const TestingHooks& testing_hooks();

} // namespace torch_shard
