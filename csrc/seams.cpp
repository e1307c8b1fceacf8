// The product's side of csrc/seams.h: its table of entry points, filled from the product's own
// functions.

#include "seams.h"

#include "comm/exchange_options.h"
#include "comm/process_group.h"
#include "comm/transfer.h"
#include "ops/lookup_common.h"
#include "ops/routing.h"

namespace torch_shard {

const Seams& seams() {
  static const Seams table = [] {
    Seams s{};
    s.version = kSeamsVersion;
    s.exchange_options = &comm::exchange_options;
    s.set_exchange_options = &comm::set_exchange_options;
    s.set_exchange_hook = &comm::set_exchange_hook;
    s.round_one_plan = &comm::round_one_plan;
    s.clear_plan_cache = &comm::clear_plan_cache;
    s.comm_device = &comm::comm_device_name;
    s.cpu_loops = &ops::cpu_loops;
    s.set_cpu_loops = &ops::set_cpu_loops;
    s.checked_blocks = &ops::checked_blocks;
    s.index_dtype = &ops::index_dtype;
    s.checked_total = &ops::checked_total;
    s.bucket_ids = &ops::bucket_ids;
    s.routes_from = &ops::routes_from;
    s.send_buffer = &ops::send_buffer;
    s.unpack_received = &ops::unpack_received;
    return s;
  }();
  return table;
}

} // namespace torch_shard
