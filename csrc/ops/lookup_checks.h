// The checks of a lookup's input that need its values: ids in range, offsets well formed.
//
// NOTE [ Input checks on the device ]
// Whether a rank's ids and offsets are valid is a question about their values, which on a GPU live in
// device memory: asking the host costs a sync. So a lookup computes the answer on the input's device,
// as one int64 status (0, or the error code of the first check that failed, in the dense op's order),
// and the status travels with the agreement, in the one host read of the exchange (NOTE [ One host read
// per exchange ]). Only a rank whose status is not 0 reads its input on the host, to raise the dense
// op's exception with its message; the other ranks raise the same class carrying that message (NOTE
// [ Reasons travel ]). On the CPU the same checks are one loop over the ids and offsets (no ATen op);
// elsewhere, and on the CPU with cpu_loops() off, a composition of ATen ops.
//
// The checks, in order (each with the dense op's or upstream's exception and message):
//   every id in [0, num_embeddings)        ValueError  "Index out of range in Input <min> <max> <rows>"
//   include_last_offset: last offset = n   ValueError  (upstream's sharded op's message)
//   offsets[0] = 0                         RuntimeError
//   offsets[-1] <= n                       RuntimeError
//   offsets non-decreasing                 RuntimeError
// where n is the number of ids. What the host knows (types, shapes, devices, an empty offsets tensor
// with include_last_offset) the Python caller checks before the op.
#pragma once

#include <cstdint>
#include <exception>
#include <optional>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>
#include <c10/util/string_view.h>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>

#include "ops/lookup_common.h"
#include "ops/shared_inputs.h"

namespace torch_shard {
namespace ops {

struct LookupInput {
  at::Tensor ids;                    // 1-D int64: every id of this rank's input (a 2-D one flattened)
  std::optional<at::Tensor> offsets; // bags given by their starts: 1-D int64 as the caller gave them
  bool include_last_offset = false;  // offsets end with the number of ids (the last is no bag)
  int64_t num_embeddings = 0;
  int64_t bag_length = -1; // a 2-D input's bags, one per row: their length (-1: offsets, or none)
  int64_t fixed_bags = 0;  // ... and their number
  bool fixed() const { return bag_length >= 0; }
};

// 0-dim int64 on the ids' device: 0, or the comm::ErrorCode of the first failed check. `outside`
// (optional, 0-dim): how many of the ids lie outside the table, when the caller counted them already.
at::Tensor input_status(const LookupInput& input, const at::Tensor& outside = at::Tensor());

// This rank's input failed a check (its status was not 0): raises the first failed check's exception,
// reading the input on the host (only a failed op does).
[[noreturn]] void raise_input_error(const LookupInput& input);

// The offsets that start bags: without the last one under include_last_offset; for a 2-D input, one
// every bag_length ids (built on its device: well formed, so never checked).
at::Tensor bag_offsets(const LookupInput& input);
// How many bags there are (without reading device memory).
int64_t bag_count(const LookupInput& input);

// What every lookup (and max_norm) checks alike on this rank before its agreement (a failure is this
// rank's, which the caller reports in the agreement): `mode` a LookupMode name; `local` a 2-D floating
// point shard; ids int64 on its device, 1-D, or 2-D for bags without offsets (one bag per row, as
// F.embedding_bag takes them); offsets only for bags, 1-D int64 there (not empty under
// include_last_offset); per-sample weights only with "sum", one per id, of the shard's dtype;
// padding_idx a row or -1. Returns the mode and the input; the caller sets its device-side status
// (input_status).
struct LookupCall { // a lookup op's arguments, as its kernel received them (lookup_kernel)
  const at::Tensor& local;
  const at::Tensor& ids;
  const std::optional<at::Tensor>& offsets;
  const std::optional<at::Tensor>& per_sample_weights;
  c10::IntArrayRef block_starts;
  c10::IntArrayRef block_sizes;
  int64_t num_embeddings;
  int64_t padding_idx;
  c10::string_view mode;
  bool include_last_offset;
  int64_t fingerprint;
  bool needs_grad = false;          // the lookup ops': save what the backward needs
  c10::ArrayRef<double> arguments;  //   ": the caller's scalars, agreed
  c10::string_view group_name = ""; //   ": the process group
};

// A lookup op's result and what its backward needs (the schema's two outputs).
using LookupResult = std::tuple<at::Tensor, std::vector<at::Tensor>>;

// The kernel of the schema _rowwise_lookup and _colwise_lookup share (csrc/torch_shard.cpp): its
// arguments, gathered into one LookupCall for `impl`, and `impl`'s outputs copied where they alias an
// input (copy_aliases).
template <LookupResult (*impl)(const LookupCall&)>
LookupResult
lookup_kernel(const at::Tensor& local, const at::Tensor& ids, const std::optional<at::Tensor>& offsets,
              const std::optional<at::Tensor>& per_sample_weights, c10::IntArrayRef block_starts,
              c10::IntArrayRef block_sizes, int64_t num_embeddings, int64_t padding_idx,
              c10::string_view mode, bool include_last_offset, bool needs_grad, int64_t fingerprint,
              c10::ArrayRef<double> arguments, c10::string_view group_name) {
  auto [out, saved] = impl(LookupCall{local, ids, offsets, per_sample_weights, block_starts, block_sizes,
                                      num_embeddings, padding_idx, mode, include_last_offset, fingerprint,
                                      needs_grad, arguments, group_name});
  std::vector<at::Tensor> outputs{out};
  const std::initializer_list<at::Tensor> inputs{local, ids, offsets.value_or(at::Tensor()),
                                                 per_sample_weights.value_or(at::Tensor())};
  copy_aliases(outputs, inputs);
  copy_aliases(saved, inputs);
  return {outputs[0], saved};
}

// The group of the lookup op `op` (its forward, backward or renorm), which communicates: it raises
// under a tracing mode first (NOTE [ Ops that cannot be traced ]).
c10::intrusive_ptr<c10d::ProcessGroup> lookup_group(c10::string_view group_name, const char* op);

struct CheckedInput {
  LookupMode mode = LookupMode::kEmbedding;
  LookupInput input;
  at::Tensor status;
};
CheckedInput check_input(const char* op, const LookupCall& call);

// Step 1 of a lookup op: `req = prepare()`. A failure there is this rank's; it is returned, for the
// agreement to raise on every rank.
template <typename Request, typename Prepare>
std::exception_ptr prepared(Request& req, Prepare&& prepare) {
  try {
    req = prepare();
  } catch (...) {
    return std::current_exception();
  }
  return nullptr;
}

// A lookup op's agreement (NOTE [ Shared inputs ]): `agreed` its scalars (agreed_arguments), `device`
// where its tensors live, and this rank's failure or, without one, its input's status with the error
// that words it. `checked` and `agreed` must outlive the request.
ShareRequest agreement_request(const CheckedInput& checked, int64_t fingerprint,
                               const std::vector<double>& agreed, c10::Device device,
                               std::exception_ptr error);

// A backward op's agreement: every rank's checks (`error`: this rank's failure) and the gradient's
// width and dtype (the bytes that move). Raises on every rank unless all agree.
void agree_backward(c10d::ProcessGroup& pg, LookupOp op, LookupMode mode, const at::Tensor& grad,
                    std::exception_ptr error);

// What a backward op reads first from what its forward saved, checked (a call made by hand gets a
// ValueError, not a read out of bounds): its mode, and the `words` counts at saved[counts_at], a CPU
// int64 tensor; `saved` must hold `num_saved` tensors and `grad` be 2-D.
struct BackwardHead {
  LookupMode mode;
  std::vector<int64_t> counts;
};
BackwardHead backward_head(const char* op, c10::string_view mode_name, const at::Tensor& grad,
                           at::TensorList saved, size_t num_saved, size_t counts_at, int64_t words);

} // namespace ops
} // namespace torch_shard
