// The failed ranks' messages, to every rank of the group (NOTE [ Reasons travel ]).

#include <algorithm>
#include <cstring>
#include <sstream>

#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>
#include <c10/util/Exception.h>

#include "comm/exchange_state.h"
#include "comm/process_group.h"

namespace torch_shard {
namespace comm {

// NOTE [ Reasons travel ]
// A rank whose arguments fail raises its own exception; its peers raise the same class naming it. The
// name alone tells a user reading rank 0's log where, not what ("see the ValueError raised on rank
// 3"), so the failing ranks' messages travel too. Round 1's table already tells every rank which ranks
// failed: when some did, and none was lost (a lost rank can take part in nothing), every rank runs one
// more all-to-all in which each failed rank sends each peer its message in kReasonBytes bytes
// (longer ones are cut, marked "..."). The pattern comes from the table, the same on every rank, so
// its sizes always match; only a failed op pays for it, and nothing has been written yet.
// A rank that failed on the host knows its message before round 1 (`Agreement::error`, or
// `Agreement::reason` for a rank whose failure was Python's: _abort); a rank whose input failed a
// device-side check learns it from its status, in the host read, and its op's raise_status words it
// then (reading device memory if it must: the op failed). Round 1 itself stays the same fixed size.
constexpr int64_t kReasonBytes = 2048;

std::string describe_failure(const Agreement& agreement, std::exception_ptr error, ErrorCode code) {
  if (!agreement.reason.empty()) {
    return agreement.reason;
  }
  if (!error) {
    return "";
  }
  try {
    std::rethrow_exception(error);
  } catch (const c10::Error& e) {
    return std::string(error_class_name(code)) + ": " + e.what_without_backtrace();
  } catch (const std::exception& e) {
    return std::string(error_class_name(code)) + ": " + e.what();
  } catch (...) {
    return std::string(error_class_name(code)) + ": (no message)";
  }
}

std::vector<std::string> exchange_reasons(Exchange& x, const std::string& mine) {
  const int64_t world = x.world;
  const bool failed_here = x.field(x.me, kError) != 0;
  std::vector<int64_t> send_splits(world, 0), recv_splits(world, 0);
  int64_t sent = 0, received = 0;
  for (int64_t p = 0; p < world; ++p) {
    if (p == x.me) {
      continue;
    }
    if (failed_here) {
      send_splits[p] = kReasonBytes;
      sent += kReasonBytes;
    }
    if (x.field(p, kError) != 0) {
      recv_splits[p] = kReasonBytes;
      received += kReasonBytes;
    }
  }
  // One block, cut to fit and NUL-terminated, the same for every peer.
  std::string block = mine;
  if (static_cast<int64_t>(block.size()) >= kReasonBytes) {
    block = block.substr(0, kReasonBytes - 4) + "...";
  }
  const auto cpu_bytes = at::TensorOptions().dtype(at::kByte);
  at::Tensor send = at::zeros({sent}, cpu_bytes);
  for (int64_t k = 0; k < sent / kReasonBytes; ++k) {
    std::memcpy(send.mutable_data_ptr<uint8_t>() + k * kReasonBytes, block.data(), block.size());
  }
  at::Tensor on_device = send.to(x.device);
  at::Tensor recv = at::empty({received}, on_device.options());
  all_to_all_bytes(x.pg, recv, on_device, recv_splits, send_splits);
  // A failed op: reading what arrived on the host is allowed here (NOTE [ One host read per exchange ]).
  const at::Tensor host = recv.to(at::kCPU).contiguous();
  const auto* bytes = reinterpret_cast<const char*>(host.const_data_ptr<uint8_t>());
  std::vector<std::string> reasons(world);
  reasons[x.me] = mine;
  int64_t at = 0;
  for (int64_t p = 0; p < world; ++p) {
    if (recv_splits[p] == 0) {
      continue;
    }
    const char* start = bytes + at;
    reasons[p] = std::string(start, strnlen(start, static_cast<size_t>(kReasonBytes)));
    at += kReasonBytes;
  }
  return reasons;
}

[[noreturn]] void raise_peer_failure(OpKind op, ErrorCode code, int64_t rank, const std::string& reason,
                                     int64_t others) {
  std::ostringstream msg;
  if (code == ErrorCode::kLost) {
    msg << "torch_shard." << op_name(op) << ": rank " << rank
        << " of the process group did not take part in the agreement round (its message to the hub, "
           "group rank 0, failed: the process ended, its connection broke or the group's timeout "
           "passed); every rank stops here instead of waiting for it";
    C10_THROW_ERROR(DistBackendError, msg.str());
  }
  msg << "torch_shard." << op_name(op) << ": rank " << rank
      << " of the process group rejected its arguments ("
      << (reason.empty() ? std::string("the ") + error_class_name(code) + " raised there" : reason) << ")";
  if (others > 0) {
    msg << ", and " << others << (others == 1 ? " other rank" : " other ranks") << " too";
  }
  msg << "; every rank stops here instead of waiting for it";
  switch (code) {
    case ErrorCode::kValueError:
      C10_THROW_ERROR(ValueError, msg.str());
    case ErrorCode::kTypeError:
      C10_THROW_ERROR(TypeError, msg.str());
    case ErrorCode::kIndexError:
      C10_THROW_ERROR(IndexError, msg.str());
    case ErrorCode::kNotImplementedError:
      C10_THROW_ERROR(NotImplementedError, msg.str());
    default:
      C10_THROW_ERROR(Error, msg.str());
  }
}

} // namespace comm
} // namespace torch_shard
