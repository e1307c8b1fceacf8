// The agreement's header and verdict: what each rank writes in its headers, how the host reads them
// (once per exchange), and the helpers with which every rank reaches the same verdict from the same
// table. See NOTE [ Agreed exchange ] in comm/exchange.cpp for the protocol.

#include <algorithm>
#include <cstring>
#include <utility>

#include <ATen/ops/cat.h>
#include <c10/util/Exception.h>

#include "comm/exchange_state.h"

namespace torch_shard {
namespace comm {

const char* error_class_name(ErrorCode code) {
  switch (code) {
    case ErrorCode::kValueError:
      return "ValueError";
    case ErrorCode::kTypeError:
      return "TypeError";
    case ErrorCode::kIndexError:
      return "IndexError";
    case ErrorCode::kNotImplementedError:
      return "NotImplementedError";
    case ErrorCode::kRuntimeError:
    case ErrorCode::kOther:
      return "RuntimeError";
    case ErrorCode::kLost:
      return "DistBackendError";
    case ErrorCode::kNone:
      break;
  }
  return "error";
}

namespace {

// Every op kind and its name (in messages, and as _abort's argument): the one table of both.
constexpr std::pair<OpKind, const char*> kOpNames[] = {
    {OpKind::kShard, "shard"},     {OpKind::kGather, "gather"},
    {OpKind::kReshard, "reshard"}, {OpKind::kShareInputs, "share_inputs"},
    {OpKind::kCompare, "compare"}, {OpKind::kRedistribute, "redistribute"},
};

} // namespace

const char* op_name(OpKind op) {
  for (const auto& [kind, name] : kOpNames) {
    if (kind == op) {
      return name;
    }
  }
  return "unknown op";
}

std::optional<OpKind> op_from_name(const std::string& name) {
  for (const auto& [kind, known] : kOpNames) {
    if (name == known) {
      return kind;
    }
  }
  return std::nullopt;
}

std::vector<std::string> error_class_names() {
  std::vector<std::string> names;
  for (int64_t code = 1; code <= static_cast<int64_t>(ErrorCode::kLost); ++code) {
    names.push_back(error_class_name(static_cast<ErrorCode>(code)));
  }
  return names;
}

ErrorCode classify(std::exception_ptr error) {
  if (!error) {
    return ErrorCode::kNone;
  }
  try {
    std::rethrow_exception(error);
  } catch (const c10::ValueError&) {
    return ErrorCode::kValueError;
  } catch (const c10::TypeError&) {
    return ErrorCode::kTypeError;
  } catch (const c10::IndexError&) {
    return ErrorCode::kIndexError;
  } catch (const c10::NotImplementedError&) {
    return ErrorCode::kNotImplementedError;
  } catch (const c10::Error&) {
    return ErrorCode::kRuntimeError;
  } catch (...) {
    return ErrorCode::kOther;
  }
}

// This rank's input failed a check on its device: its own error, from the op.
[[noreturn]] void raise_own_status(const Agreement& agreement, OpKind op, int64_t code) {
  agreement.raise_status(static_cast<ErrorCode>(code));
  TORCH_CHECK(false, "torch_shard.", op_name(op),
              ": internal error: this rank's input failed a device-side check, but the op named no "
              "error; please report this");
}

void fill_headers(Exchange& x) {
  x.headers.assign(x.world * kHeaderWords, 0);
  for (int64_t p = 0; p < x.world; ++p) {
    int64_t* row = x.headers.data() + p * kHeaderWords;
    row[kOp] = static_cast<int64_t>(x.op);
    row[kError] = static_cast<int64_t>(x.error_code);
    row[kFits] = x.fits ? 1 : 0;
    row[kBytes] = (x.failed || p == x.me) ? 0 : x.moves->send[p].bytes;
    row[kPeers] = x.out_degree;
    row[kMaxMessage] = x.max_message;
    row[kRoom] = p == 0 ? x.room : 0; // the hub is group rank 0
    row[kAppended] = p == 0 ? x.to_hub : 0;
    for (int k = 0; k < kAgreedValues; ++k) {
      row[kValue0 + k] = x.failed ? 0 : x.agreement.values[k];
    }
    for (int k = 0; k < kNotes; ++k) {
      row[kNote0 + k] = x.failed ? 0 : x.agreement.notes[k];
    }
  }
}

void device_words_into_headers(Exchange& x) {
  if (!x.device_words) {
    return;
  }
  const HostRead read = read_to_host(x.agreement, at::Tensor(), x.world, nullptr);
  for (int64_t p = 0; p < x.world; ++p) {
    x.headers[p * kHeaderWords + kWord] = read.words.empty() ? 0 : read.words[p];
    x.headers[p * kHeaderWords + kError] = read.status;
  }
  x.words_out = read.words;
}

std::vector<Values> agreed_values(const int64_t* table, int64_t world) {
  std::vector<Values> all(world);
  for (int64_t r = 0; r < world; ++r) {
    std::copy_n(table + r * kHeaderWords + kValue0, kAgreedValues, all[r].begin());
  }
  return all;
}

// Round-2 messages in the whole group (those of the senders whose payloads did not fit their slots),
// from a header table: every rank derives the same number, and so the same pattern.
int64_t round_two_messages(const int64_t* table, int64_t world) {
  int64_t messages = 0;
  for (int64_t r = 0; r < world; ++r) {
    const int64_t* row = table + r * kHeaderWords;
    messages += row[kFits] == 0 ? row[kPeers] : 0;
  }
  return messages;
}

// The verdict every rank reaches from a header table, without raising: no rank failed, every rank
// runs `op`, and `check` accepts the agreed values. The hub needs it before it replies (NOTE
// [ Payloads riding the hub's messages ]).
bool agreed(const int64_t* table, int64_t world, OpKind op, const Check& check, int64_t me) {
  for (int64_t r = 0; r < world; ++r) {
    const int64_t* row = table + r * kHeaderWords;
    if (row[kError] != 0 || row[kOp] != static_cast<int64_t>(op)) {
      return false;
    }
  }
  try {
    check(agreed_values(table, world), me);
  } catch (const std::exception&) {
    return false;
  }
  return true;
}

// NOTE [ One host read per exchange ]
// On CUDA (NCCL) every buffer of the exchange lives in device memory, and the host reads device memory
// only through a copy that waits for the device (a host sync). An exchange needs exactly one such
// read: the headers the peers sent this rank, which decide everything after round 1 (the verdict, the
// sizes and pattern of round 2). Values an op computes on the device and needs on the host (Agreement::
// status, a check of its inputs, and Agreement::words, e.g. per-peer counts) ride in that same copy:
// they go out in the header blocks without the host reading them first (a device-to-device copy), and
// this rank's own words come back together with the received headers. Byte counts come from shapes
// and headers, packing and unpacking are device copies, so nothing else in an exchange reads device
// memory on the host. Through the hub (CPU groups only) headers are built on the host, and the words
// are read there instead (a copy to the host only for tensors on a GPU, i.e. CUDA shards on gloo).
HostRead read_to_host(const Agreement& agreement, const at::Tensor& rows, int64_t world, int64_t* rows_out) {
  std::vector<at::Tensor> parts;
  if (rows.defined()) {
    parts.push_back(rows.reshape({-1}));
  }
  if (agreement.words.defined()) {
    parts.push_back(agreement.words.reshape({-1}));
  }
  if (agreement.status.defined()) {
    parts.push_back(agreement.status.reshape({-1}));
  }
  if (parts.empty()) {
    return {};
  }
  const c10::Device where = parts.front().device();
  for (auto& part : parts) {
    part = part.to(where);
  }
  // One device-to-host copy (none at all on the CPU).
  const at::Tensor host = (parts.size() == 1 ? parts.front() : at::cat(parts)).to(at::kCPU).contiguous();
  const int64_t* values = host.const_data_ptr<int64_t>();
  HostRead out;
  if (rows.defined()) {
    std::memcpy(rows_out, values, static_cast<size_t>(world * kHeaderBytes));
    values += world * kHeaderWords;
  }
  if (agreement.words.defined()) {
    out.words.assign(values, values + world);
    values += world;
  }
  if (agreement.status.defined()) {
    out.status = *values;
  }
  return out;
}

} // namespace comm
} // namespace torch_shard
