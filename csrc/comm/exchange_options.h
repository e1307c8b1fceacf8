// What the agreed exchange (comm/exchange.h) reads on every exchange besides its arguments: how round 1
// may run, and one hook called at two points of each exchange. Both belong to the process; the product
// keeps the defaults below and sets no hook. They are set from outside the data ops only, through the
// product's seams (csrc/seams.h): tests drive other round-1 paths and inject faults, benchmarks measure
// a mechanism against its absence.
#pragma once

#include <cstdint>

namespace torch_shard {
namespace comm {

// How round 1 of the agreed exchange may run. The defaults are the product's; a rank reads them as its
// exchange starts, so they must be set alike on every rank of a group between its exchanges.
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

ExchangeOptions exchange_options();
void set_exchange_options(const ExchangeOptions& options);

// Called by every exchange of a data op (`op`: "shard", "gather", ...) on a group of two or more ranks,
// as it starts (before_agreement) and right after the verdict, on the thread running the exchange. An
// exception it throws leaves the exchange there, as a failure of this rank's would. Unset (the product's
// state), the two points cost one relaxed atomic load each.
using ExchangeHook = void (*)(const char* op, int64_t me, bool before_agreement);
void set_exchange_hook(ExchangeHook hook);

// How round 1 runs on a group of `world` ranks whose communication device is the CPU (`cpu`) and whose
// CPU backend carries point-to-point messages (`p2p`), as the group alone decides it: with no history
// (NOTE [ Round 1 follows the group's history ]) and the current options' hub_max_world.
struct RoundOnePlan {
  bool hub = false;         // through the hub
  int64_t slot_bytes = 0;   // the payload bytes per peer that ride in round 1
  int64_t header_bytes = 0; // one header, sent to every peer
};
RoundOnePlan round_one_plan(int64_t world, bool cpu, bool p2p);

} // namespace comm
} // namespace torch_shard
