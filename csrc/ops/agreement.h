// How the ops fill the agreement of the exchange engine (comm/exchange.h): one Agreement per op call,
// and the helpers its checks use. Shared by the data ops, the shared-input exchange and the
// collectives.
#pragma once

#include <exception>
#include <utility>
#include <vector>

#include "comm/exchange.h"

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

} // namespace ops
} // namespace torch_shard
