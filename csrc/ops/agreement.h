// How the ops fill the agreement of the exchange engine (comm/exchange.h): one Agreement per op call,
// the helpers its checks use, and the call of a data op that moves a tensor (DataOpCall). Shared by the
// data ops, the shared-input exchange, redistribute and the collectives.
#pragma once

#include <cstdint>
#include <exception>
#include <initializer_list>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <c10/core/Device.h>
#include <c10/core/ScalarType.h>
#include <c10/util/Exception.h>
#include <c10/util/intrusive_ptr.h>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>

#include "comm/exchange.h"
#include "comm/process_group.h"
#include "comm/transfer.h"
#include "layout/layout.h"
#include "layout/plan.h"
#include "sharded_tensor_impl.h"

namespace torch_shard {
namespace ops {

// Every op here that communicates raises this under a tracing mode (NOTE [ Ops that cannot be traced ]).
constexpr const char* kCommunicates = "communicates over its process group";

inline comm::Agreement agreement(comm::OpKind op, const comm::Values& values, std::exception_ptr error,
                                 comm::Check check) {
  comm::Agreement a;
  a.op = op;
  a.values = values;
  a.error = std::move(error);
  a.check = std::move(check);
  return a;
}

// First rank whose value k differs from this rank's, or -1.
inline int64_t first_mismatch(const std::vector<comm::Values>& all, int64_t me, int k) {
  for (size_t r = 0; r < all.size(); ++r) {
    if (all[r][k] != all[me][k]) {
      return static_cast<int64_t>(r);
    }
  }
  return -1;
}

// A value every rank must agree on (value `slot` of the agreement) and the ValueError of a rank whose
// value differs: <before><this rank><between><the first rank that differs><after>.
struct Mismatch {
  int slot;
  const char* before;
  const char* between;
  const char* after = "";
};

// Raises the error of the first of `mismatches`, in order, whose value differs between ranks. Every
// rank sees the same table, so every rank that raises raises for the same slot.
inline void raise_first_mismatch(const std::vector<comm::Values>& all, int64_t me,
                                 std::initializer_list<Mismatch> mismatches) {
  for (const Mismatch& m : mismatches) {
    if (const int64_t r = first_mismatch(all, me, m.slot); r >= 0) {
      TORCH_CHECK_VALUE(false, m.before, me, m.between, r, m.after);
    }
  }
}

// Upstream's ValueError for an argument every rank must pass alike (src_rank, dst):
// "<name>=<value> on rank: <me> does not match with <name>=<value> on rank: <r>".
inline void raise_if_argument_differs(const std::vector<comm::Values>& all, int64_t me, int slot,
                                      const char* name) {
  if (const int64_t r = first_mismatch(all, me, slot); r >= 0) {
    TORCH_CHECK_VALUE(false, name, "=", all[me][slot], " on rank: ", me, " does not match with ", name, "=",
                      all[r][slot], " on rank: ", r);
  }
}

// Where this rank's shards of `impl` live, if it holds any (the communication device follows them on
// CUDA).
inline std::optional<c10::Device> shards_device(const ShardedTensorImpl& impl) {
  if (impl.local_shards().empty() || !impl.local_shards().front().defined()) {
    return std::nullopt;
  }
  return impl.local_shards().front().device();
}

// One call of a data op on this rank (shard, gather, reshard, _redistribute; _agree_shard moves
// nothing): its group, its communication device, the move from `source` to `target`, and what this
// rank agrees on. Every data op runs the same three steps:
//   1. prepare(): this rank's checks, layouts and tensors; a failure there is kept, not raised;
//   2. plan_moves(), inside prepare(): the messages of the move (none without it: the agreement alone);
//   3. exchange(): the agreement, then the move, or the same error on every rank (NOTE [ Agreed
//      exchange ]).
class DataOpCall {
public:
  // `tensors`: where the tensors this rank moves live, which the communication device follows (NOTE
  // [ Communication device ]).
  DataOpCall(const std::string& group_name, const char* op, std::optional<c10::Device> tensors = std::nullopt)
      : pg(comm::resolve_group(group_name, op)), me(pg->getRank()), world(pg->getSize()),
        device(comm::comm_device(*pg, tensors)) {
    moves_.send.resize(world);
    moves_.recv.resize(world);
  }
  // A call that moves an existing ShardedTensor (gather, reshard): its group, its shards' device, and
  // its layout as the source.
  DataOpCall(const ShardedTensorImpl& impl, const char* op)
      : DataOpCall(impl.group_name(), op, shards_device(impl)) {
    source = impl.layout();
  }
  // The moves point into this object: it stays where it was made.
  DataOpCall(const DataOpCall&) = delete;
  DataOpCall& operator=(const DataOpCall&) = delete;

  const c10::intrusive_ptr<c10d::ProcessGroup> pg;
  const int64_t me;
  const int64_t world;
  c10::Device device;
  // The move. Its messages refer to these (and to the plan), so they live as long as the call.
  std::shared_ptr<const layout::Layout> source;
  std::shared_ptr<const layout::Layout> target;
  comm::LocalTensors src_local;
  comm::LocalTensors dst_local;

  // Runs `steps`, which return this rank's agreed values; a failure in them is this rank's, raised by
  // exchange() on every rank.
  template <typename Steps>
  void prepare(Steps&& steps) {
    try {
      mine_ = steps();
    } catch (...) {
      error_ = std::current_exception();
    }
  }

  // The messages that move `src_local` (in `source`) into `dst_local` (in `target`), from the cached
  // plan (NOTE [ Plan cache ]); `dtype` is the tensor's.
  void plan_moves(c10::ScalarType dtype) {
    plan_ = comm::cached_plan(source, target, me, world);
    moves_ = comm::transfer_moves(*plan_, *source, src_local, *target, dst_local, me, device, dtype);
  }

  // The agreement of `op` (`check` over every rank's values) and, when every rank agreed, the move.
  void exchange(comm::OpKind op, comm::Check check) {
    comm::exchange(*pg, device, agreement(op, mine_, error_, std::move(check)), &moves_);
  }

private:
  std::shared_ptr<const layout::TransferPlan> plan_;
  comm::Moves moves_;
  comm::Values mine_{};
  std::exception_ptr error_;
};

} // namespace ops
} // namespace torch_shard
