// Every rank's input on every rank, as one agreed exchange: the op _share_inputs, and the C++ entry the
// sharded lookups agree through.
//
// NOTE [ Shared inputs ]
// Sharded compute (the embedding lookups, init_from_local_shards) needs every rank's input, or facts
// about it, on every rank. share_inputs is that exchange as one agreed data op: each rank's `parts`
// (1-D tensors, the same count (at most comm::kNotes) and dtypes on every rank, any lengths) form one
// message, sent to every peer: the parts one after the other, each padded to 8 bytes so every part
// starts aligned for its dtype. The byte count of each part travels in the agreement round
// (Agreement::notes) and receivers take the message sizes the senders declare there (NOTE [ Agreed
// exchange ]), so inputs of different lengths per rank are safe and nothing is read back from the
// message itself: on CUDA the parts go from the caller's device to the communication device and back
// by device copies, and the host reads device memory once per call, in the exchange (NOTE [ One host
// read per exchange ]).
// `fingerprint` is an op-specific value every rank must agree on (the weight's layout), `flags` a small
// op-specific value that must agree too, and `arguments` the scalars with which each rank computes the
// OTHER ranks' results (the lookups: mode, padding_idx, max_norm, norm_type, and which op it is). Ranks
// that differ there would hand back silently different results, or run a collective the others do not:
// all raise.
// A caller may also bring this rank's device-side values (Agreement::status / words): the validity of
// its input checked on its device, with the function that raises the detailed error when it failed,
// and a word for each peer (the row-wise lookups: how many of this rank's ids each peer owns); and
// this rank's failure before the agreement (`error`). Any failure anywhere raises on every rank.
#pragma once

#include <cstdint>
#include <exception>
#include <functional>
#include <optional>
#include <vector>

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>
#include <c10/util/ArrayRef.h>
#include <c10/util/string_view.h>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>

#include "comm/exchange.h"

namespace torch_shard {
namespace ops {

struct ShareRequest {
  at::TensorList parts;            // shared with every rank (may be empty)
  int64_t fingerprint = 0;         // agreed
  int64_t flags = 0;               // agreed
  c10::ArrayRef<double> arguments; // agreed (bit patterns; -0.0 is 0.0, every NaN one value)
  // Where this rank's tensors live (the parts' device; its shard's when a failure left no parts): the
  // communication device follows it (NOTE [ Communication device ]), and received parts go there.
  std::optional<c10::Device> device;
  at::Tensor status;                                 // optional: 0-dim int64, 0 when the input passed
  std::function<void(comm::ErrorCode)> raise_status; // with status: throws this rank's error
  at::Tensor words;                                  // optional: [world] int64, words[p] told to rank p
  std::exception_ptr error;                          // this rank failed before the agreement
  // The caller copies the other ranks' parts out before its next exchange on the group: they may then
  // stay views of the exchange's buffer (which that exchange reuses), saving a copy per peer.
  bool borrow = false;
};

struct Shared {
  std::vector<at::Tensor> parts;  // every rank's parts, rank-major: parts[r * nparts + k]
  std::vector<int64_t> words_in;  // the word each rank told this rank (0 without words)
  std::vector<int64_t> words_out; // this rank's words, as sent (empty without words)
};

// Raises on every rank when any rank failed (its own error there, the same class carrying its message
// elsewhere) or the agreed values differ; otherwise every rank's parts on every rank.
Shared share_inputs(c10d::ProcessGroup& pg, const ShareRequest& request);

// The op _share_inputs: share_inputs with parts, fingerprint, flags and arguments only; every rank's
// parts, rank-major.
std::vector<at::Tensor> share_inputs_op(at::TensorList parts, int64_t fingerprint, int64_t flags,
                                        c10::string_view group_name, c10::ArrayRef<double> arguments);

} // namespace ops
} // namespace torch_shard
