// The product's seams: the one way code outside torch_shard._C reaches into it. The test library
// (csrc/testing/, torch_shard._testing_C) takes this table from the capsule torch_shard._C._seams when
// Python imports it; the product never calls through it, and no Python caller can call a capsule.
//
// Every entry is either a product function the data ops themselves run, or the setter of process-wide
// state the product reads (the options and hook of comm/exchange_options.h, the CPU loops switch, the
// plan cache). Nothing here is test-only: what tests and benchmarks do with these (fault injection,
// round 1's cost figures, the test ops' argument checks) is compiled into the test library alone,
// which wheels do not carry.
//
// Shared by two extension modules built together by one setup.py against the same torch: plain
// structs, std containers and at::Tensor, laid out alike in both. A library built against another
// table refuses to load (kSeamsVersion).
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>
#include <c10/core/ScalarType.h>
#include <c10/util/ArrayRef.h>

#include "comm/exchange_options.h"
#include "ops/lookup_common.h"
#include "ops/routing.h"

namespace torch_shard {

struct Seams {
  int64_t version; // kSeamsVersion of the product that filled it

  // Round 1's options, the exchange hook and round 1's plan (comm/exchange_options.h).
  comm::ExchangeOptions (*exchange_options)();
  void (*set_exchange_options)(const comm::ExchangeOptions& options);
  void (*set_exchange_hook)(comm::ExchangeHook hook);
  comm::RoundOnePlan (*round_one_plan)(int64_t world, bool cpu, bool p2p);
  // Forgets every cached transfer plan (comm/transfer.h).
  void (*clear_plan_cache)();
  // The communication device (as a string) of the group registered under `group_name` for an op whose
  // tensors live on `tensors_device` ("" for none): NOTE [ Communication device ].
  std::string (*comm_device)(const std::string& group_name, const std::string& tensors_device);
  // Whether CPU tensors take the fused loops written for them (ops/lookup_common.h, cpu_loops()).
  bool (*cpu_loops)();
  void (*set_cpu_loops)(bool on);

  // The row-wise requester's bucketing and the owner's unpacking (ops/routing.h), and what they take
  // (ops/lookup_common.h).
  ops::Blocks (*checked_blocks)(const char* op, c10::IntArrayRef starts, c10::IntArrayRef sizes,
                                int64_t world, int64_t dim_size);
  c10::ScalarType (*index_dtype)(int64_t num_embeddings);
  int64_t (*checked_total)(c10::IntArrayRef values);
  ops::Bucketed (*bucket_ids)(const at::Tensor& ids, const ops::RoutedBags& bags, const ops::Blocks& rows,
                              c10::ScalarType index, int64_t padding_idx, bool mean, int64_t num_embeddings);
  ops::Routes (*routes_from)(const std::vector<int64_t>& words_in, const std::vector<int64_t>& words_out,
                             bool bags, int64_t num_bags);
  at::Tensor (*send_buffer)(const ops::Bucketed& bucketed, const ops::Routes& routes);
  std::pair<at::Tensor, at::Tensor> (*unpack_received)(const at::Tensor& received, const ops::Routes& routes,
                                                       int64_t row_start, bool loops);
};

// Bumped whenever Seams or a type it carries changes.
constexpr int64_t kSeamsVersion = 1;

// The product's table (csrc/seams.cpp), filled once.
const Seams& seams();

} // namespace torch_shard
