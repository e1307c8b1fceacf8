// The product's side of csrc/testing_hooks.h: what the test-only library may switch or call.

#include "testing_hooks.h"

#include <ATen/ops/empty.h>
#include <c10/util/Exception.h>

#include "comm/exchange.h"
#include "comm/process_group.h"
#include "comm/transfer.h"
#include "ops/lookup_common.h"
#include "ops/routing.h"

namespace torch_shard {
namespace {

std::vector<at::Tensor> bucket_ids(const at::Tensor& ids, const at::Tensor& offsets,
                                   const std::vector<int64_t>& block_starts,
                                   const std::vector<int64_t>& block_sizes, int64_t num_embeddings,
                                   int64_t padding_idx) {
  const char* op = "torch_shard_testing._bucket_ids";
  TORCH_CHECK_TYPE(ids.scalar_type() == at::kLong && ids.dim() == 1, op, ": ids must be 1-D int64");
  const bool bags = offsets.defined();
  TORCH_CHECK_TYPE(!bags || (offsets.scalar_type() == at::kLong && offsets.dim() == 1), op,
                   ": offsets must be 1-D int64");
  const auto rows = ops::checked_blocks(op, block_starts, block_sizes,
                                        static_cast<int64_t>(block_starts.size()), num_embeddings);
  const auto bucketed =
      ops::bucket_ids(ids, bags ? ops::RoutedBags{offsets, offsets.numel(), -1} : ops::RoutedBags{}, rows,
                      ops::index_dtype(num_embeddings), padding_idx, /*mean=*/true, num_embeddings);
  // The send buffer as the lookups assemble it once the words are known (a test may read them).
  const at::Tensor words = bucketed.words.to(at::kCPU).contiguous();
  const std::vector<int64_t> words_out(words.const_data_ptr<int64_t>(),
                                       words.const_data_ptr<int64_t>() + words.numel());
  const ops::Routes routes = ops::routes_from(words_out, words_out, bags, bags ? offsets.numel() : 0);
  return {ops::send_buffer(bucketed, routes), bucketed.perm, bucketed.words,
          bucketed.divisors.defined() ? bucketed.divisors : at::empty({0}, ids.options())};
}

std::vector<at::Tensor> unpack_received(const at::Tensor& received, const std::vector<int64_t>& counts_in,
                                        const std::vector<int64_t>& bags_in, bool bags, int64_t row_start) {
  const char* op = "torch_shard_testing._unpack_received";
  TORCH_CHECK_VALUE(counts_in.size() == bags_in.size(), op, ": one count and one bag count per rank");
  TORCH_CHECK_TYPE((received.scalar_type() == at::kLong || received.scalar_type() == at::kInt) &&
                       received.dim() == 1,
                   op, ": received must be 1-D int32 or int64");
  TORCH_CHECK_VALUE(received.numel() == ops::checked_total(counts_in) + ops::checked_total(bags_in), op,
                    ": received holds ", received.numel(), " values, the counts say otherwise");
  ops::Routes routes;
  routes.bags = bags;
  routes.counts_in = counts_in;
  routes.counts_out.assign(counts_in.size(), 0);
  routes.bags_in = bags_in;
  auto [ids, offsets] = ops::unpack_received(received, routes, row_start, ops::loops_for(received));
  return {ids, offsets.defined() ? offsets : at::empty({0}, received.options())};
}

} // namespace

const TestingHooks& testing_hooks() {
  static const TestingHooks hooks{
      kTestingHooksVersion,    &comm::set_fault_hook, &comm::exchange_options, &comm::set_exchange_options,
      &comm::clear_plan_cache, &comm::round_one_cost, &comm::comm_device_name, &ops::set_cpu_loops,
      &ops::cpu_loops,         &bucket_ids,           &unpack_received,
  };
  return hooks;
}

} // namespace torch_shard
