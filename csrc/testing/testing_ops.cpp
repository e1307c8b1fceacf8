// torch_shard._testing_C: the test-only ops, torch.ops.torch_shard_testing.*, in a library of their own
// that only tests and benchmarks load (torch_shard.testing imports it). The development build has it;
// wheels do not carry it (setup.py). The product library torch_shard._C holds no test-only code and
// cannot inject a fault or end the process: it hands this library its seams (csrc/seams.h) as a
// capsule, which this library takes when Python imports it, and everything a test does with them is
// here.

#include <Python.h>

#include <cstdlib>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <c10/util/Exception.h>
#include <torch/library.h>

#include "seams.h"

namespace torch_shard {
namespace testing {
namespace {

const Seams* seams = nullptr; // set once, when the module is imported

const Seams& product() {
  TORCH_CHECK(seams != nullptr, "torch_shard._testing_C: import the module before using its ops");
  return *seams;
}

// NOTE [ Fault injection ]
// The fault tests need a rank that fails where no bad argument can make it fail (that is what the
// agreement is for): a bug, a lost device, a killed process. _inject_fault(op, action) arms one such
// failure for this process's next exchange of data op `op` ("" for any), through the product's exchange
// hook (comm/exchange_options.h), which calls on_exchange at its two points. Right after the verdict,
// when its peers have agreed and go on to move data without it: "raise" throws a RuntimeError and
// "exit" ends the process at once (std::_Exit(kInjectedExitCode): no unwinding, no goodbye to the
// peers, like a crash). "exit_before" ends the process as it enters the exchange, before round 1, so
// its peers run the agreement without it. It fires once; "none" disarms.
constexpr int kInjectedExitCode = 43;
const char* const kDataOps[] = {"shard", "gather", "reshard", "share_inputs", "compare"};

std::mutex fault_mutex;
std::string fault_op;     // guarded by fault_mutex
std::string fault_action; // guarded by fault_mutex

void on_exchange(const char* op, int64_t me, bool before_agreement) {
  std::string action;
  {
    std::lock_guard<std::mutex> lock(fault_mutex);
    if (fault_action.empty() || (!fault_op.empty() && fault_op != op) ||
        before_agreement != (fault_action == "exit_before")) {
      return;
    }
    action = fault_action;
    fault_action.clear();
  }
  product().set_exchange_hook(nullptr);
  if (action == "exit" || action == "exit_before") {
    std::_Exit(kInjectedExitCode);
  }
  TORCH_CHECK(false, "torch_shard.", op, ": injected fault on rank ", me,
              " after the agreement round (test-only, see torch_shard_testing._inject_fault)");
}

void inject_fault(c10::string_view op, c10::string_view action) {
  TORCH_CHECK_VALUE(
      action == "raise" || action == "exit" || action == "exit_before" || action == "none",
      "torch_shard_testing._inject_fault: action must be 'raise', 'exit', 'exit_before' or 'none', got '",
      action, "'");
  bool known = op.empty();
  for (const char* name : kDataOps) {
    known = known || op == name;
  }
  TORCH_CHECK_VALUE(known, "torch_shard_testing._inject_fault: unknown data op '", op, "'");
  std::lock_guard<std::mutex> lock(fault_mutex);
  fault_op = std::string(op);
  fault_action = action == "none" ? std::string() : std::string(action);
  product().set_exchange_hook(fault_action.empty() ? nullptr : &on_exchange);
}

// Round 1's mechanisms, for tests of their paths and for benchmarks that measure each against its
// absence. Set alike on every rank of a group.
void set_exchange(bool hub, bool ride, int64_t hub_max_world, bool rooms, bool split) {
  TORCH_CHECK_VALUE(hub_max_world >= 0,
                    "torch_shard_testing._set_exchange: hub_max_world must be >= 0 "
                    "(0: the product's), got ",
                    hub_max_world);
  comm::ExchangeOptions options;
  options.hub = hub;
  options.ride = ride;
  options.hub_max_world = hub_max_world;
  options.rooms = rooms;
  options.split = split;
  product().set_exchange_options(options);
}

std::vector<int64_t> exchange_settings() {
  const comm::ExchangeOptions options = product().exchange_options();
  return {options.hub, options.ride, options.hub_max_world, options.rooms, options.split};
}

void clear_plan_cache() {
  product().clear_plan_cache();
}

// [through the hub (0/1), slot bytes, messages of the busiest rank, its bytes with headers only, its
// bytes with every slot full, messages of any other rank] of one round 1 in a group of `world`, as the
// product plans it for a group without history (comm/exchange_options.h, round_one_plan).
std::vector<int64_t> round_one_cost(int64_t world, bool cpu, bool p2p) {
  const comm::RoundOnePlan plan = product().round_one_plan(world, cpu, p2p); // checks world >= 1
  const int64_t slot = plan.slot_bytes;
  const int64_t header = plan.header_bytes;
  if (world == 1) {
    return {0, slot, 0, 0, 0, 0};
  }
  if (plan.hub) {
    // The hub receives W - 1 messages and sends W - 1; each carries W headers and up to W - 1 payloads.
    const int64_t message = world * header + (world - 1) * slot;
    return {1, slot, 2 * (world - 1), 2 * (world - 1) * world * header, 2 * (world - 1) * message, 2};
  }
  // All-to-all: W - 1 blocks out and W - 1 in per rank (the rank's own block stays local). An
  // all-to-all of used bytes (gloo, CPU) sends headers and used payload bytes only: its "every slot
  // full" is the most it can carry.
  return {
      0, slot, 2 * (world - 1), 2 * (world - 1) * header, 2 * (world - 1) * (header + slot), 2 * (world - 1)};
}

std::string comm_device(c10::string_view group_name, c10::string_view tensors_device) {
  return product().comm_device(std::string(group_name), std::string(tensors_device));
}

// The one switch between the CPU's fused loops and the ATen composition other devices take, so the
// tests run both paths on the CPU (set alike on every rank of a group).
void set_cpu_loops(bool on) {
  product().set_cpu_loops(on);
}

bool cpu_loops() {
  return product().cpu_loops();
}

// The row-wise requester's bucketing (ops/routing.h) of `ids` over each rank's rows (`offsets`: bags,
// or none), by the path cpu_loops() picks: [what it sends (each owner of some ids: its ids, then its
// per-bag lengths), its ids' positions in owner order, its words, mean's divisors], the send buffer
// assembled as the lookups assemble it once the words are known.
std::vector<at::Tensor> bucket_ids(const at::Tensor& ids, const std::optional<at::Tensor>& offsets,
                                   c10::IntArrayRef block_starts, c10::IntArrayRef block_sizes,
                                   int64_t num_embeddings, int64_t padding_idx) {
  const char* op = "torch_shard_testing._bucket_ids";
  TORCH_CHECK_TYPE(ids.scalar_type() == at::kLong && ids.dim() == 1, op, ": ids must be 1-D int64");
  const bool bags = offsets.has_value();
  TORCH_CHECK_TYPE(!bags || (offsets->scalar_type() == at::kLong && offsets->dim() == 1), op,
                   ": offsets must be 1-D int64");
  const Seams& p = product();
  const ops::Blocks rows = p.checked_blocks(op, block_starts, block_sizes,
                                            static_cast<int64_t>(block_starts.size()), num_embeddings);
  const ops::RoutedBags routed = bags ? ops::RoutedBags{*offsets, offsets->numel(), -1} : ops::RoutedBags{};
  const ops::Bucketed bucketed = p.bucket_ids(ids, routed, rows, p.index_dtype(num_embeddings), padding_idx,
                                              /*mean=*/true, num_embeddings);
  const at::Tensor words = bucketed.words.to(at::kCPU).contiguous();
  const std::vector<int64_t> words_out(words.const_data_ptr<int64_t>(),
                                       words.const_data_ptr<int64_t>() + words.numel());
  const ops::Routes routes = p.routes_from(words_out, words_out, bags, bags ? offsets->numel() : 0);
  return {p.send_buffer(bucketed, routes), bucketed.perm, bucketed.words,
          bucketed.divisors.defined() ? bucketed.divisors : at::empty({0}, ids.options())};
}

// The owner's unpacking of what its requesters sent (ops/routing.h): [ids less row_start, bags'
// offsets], by the path cpu_loops() picks.
std::vector<at::Tensor> unpack_received(const at::Tensor& received, c10::IntArrayRef counts_in,
                                        c10::IntArrayRef bags_in, bool bags, int64_t row_start) {
  const char* op = "torch_shard_testing._unpack_received";
  TORCH_CHECK_VALUE(counts_in.size() == bags_in.size(), op, ": one count and one bag count per rank");
  TORCH_CHECK_TYPE((received.scalar_type() == at::kLong || received.scalar_type() == at::kInt) &&
                       received.dim() == 1,
                   op, ": received must be 1-D int32 or int64");
  const Seams& p = product();
  TORCH_CHECK_VALUE(received.numel() == p.checked_total(counts_in) + p.checked_total(bags_in), op,
                    ": received holds ", received.numel(), " values, the counts say otherwise");
  ops::Routes routes;
  routes.bags = bags;
  routes.counts_in = counts_in.vec();
  routes.counts_out.assign(counts_in.size(), 0);
  routes.bags_in = bags_in.vec();
  // ops::loops_for, through the seam: this library links none of the product's symbols.
  const bool loops = received.is_cpu() && p.cpu_loops();
  auto [ids, offsets] = p.unpack_received(received, routes, row_start, loops);
  return {ids, offsets.defined() ? offsets : at::empty({0}, received.options())};
}

} // namespace
} // namespace testing
} // namespace torch_shard

TORCH_LIBRARY(torch_shard_testing, m) {
  // This process's next exchange of data op `op` fails: see NOTE [ Fault injection ].
  m.def("_inject_fault(str op, str action) -> ()");
  // Round 1's mechanisms on (the product's default) or off, in this process.
  m.def("_set_exchange(bool hub=True, bool ride=True, int hub_max_world=0, bool rooms=True, bool "
        "split=False) -> ()");
  // [hub, ride (1: on), hub_max_world, rooms (1: on), split (1: on)] as set now.
  m.def("_exchange_settings() -> int[]");
  m.def("_clear_plan_cache() -> ()");
  // What one round 1 costs among `world` ranks (round_one_cost above).
  m.def("_round_one_cost(int world, bool cpu=True, bool p2p=True) -> int[]");
  // The device the product's collectives on group `group_name` use for tensors on `tensors_device`
  // ("" for none), as a device string: NOTE [ Communication device ].
  m.def("_comm_device(str group_name, str tensors_device=\"\") -> str");
  // CPU tensors take the fused loops written for them (True, the product's) or the ATen composition
  // every other device takes (False), in this process: csrc/ops/lookup_common.h, cpu_loops().
  m.def("_set_cpu_loops(bool on) -> ()");
  m.def("_cpu_loops() -> bool");
  // The row-wise requester's bucketing and the owner's unpacking (ops/routing.h), by the path
  // _cpu_loops() picks.
  m.def("_bucket_ids(Tensor ids, Tensor? offsets, int[] block_starts, int[] block_sizes, int num_embeddings, "
        "int padding_idx=-1) -> Tensor[]");
  m.def("_unpack_received(Tensor received, int[] counts_in, int[] bags_in, bool bags, int row_start) -> "
        "Tensor[]");
}

TORCH_LIBRARY_IMPL(torch_shard_testing, CompositeImplicitAutograd, m) {
  using namespace torch_shard::testing;
  m.impl("_inject_fault", TORCH_FN(inject_fault));
  m.impl("_set_exchange", TORCH_FN(set_exchange));
  m.impl("_exchange_settings", TORCH_FN(exchange_settings));
  m.impl("_clear_plan_cache", TORCH_FN(clear_plan_cache));
  m.impl("_round_one_cost", TORCH_FN(round_one_cost));
  m.impl("_comm_device", TORCH_FN(comm_device));
  m.impl("_set_cpu_loops", TORCH_FN(set_cpu_loops));
  m.impl("_cpu_loops", TORCH_FN(cpu_loops));
  m.impl("_bucket_ids", TORCH_FN(bucket_ids));
  m.impl("_unpack_received", TORCH_FN(unpack_received));
}

// Importing the module registers the ops (above) and takes the product's seams.
extern "C" PyObject* PyInit__testing_C(void) {
  static struct PyModuleDef module_def = {
      PyModuleDef_HEAD_INIT,
      "_testing_C",
      "torch_shard's test-only ops: torch.ops.torch_shard_testing.*",
      -1,
      nullptr,
  };
  PyObject* product_module = PyImport_ImportModule("torch_shard._C");
  if (product_module == nullptr) {
    return nullptr;
  }
  PyObject* capsule = PyObject_GetAttrString(product_module, "_seams");
  Py_DECREF(product_module);
  if (capsule == nullptr) {
    return nullptr;
  }
  auto* found =
      static_cast<const torch_shard::Seams*>(PyCapsule_GetPointer(capsule, "torch_shard._C._seams"));
  Py_DECREF(capsule);
  if (found == nullptr) {
    return nullptr;
  }
  if (found->version != torch_shard::kSeamsVersion) {
    PyErr_Format(PyExc_ImportError,
                 "torch_shard._testing_C was built against the product's seams version %lld, but "
                 "torch_shard._C has version %lld: rebuild both",
                 static_cast<long long>(torch_shard::kSeamsVersion), static_cast<long long>(found->version));
    return nullptr;
  }
  torch_shard::testing::seams = found;
  return PyModule_Create(&module_def);
}
