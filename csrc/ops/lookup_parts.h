// The parts a row-wise sharded lookup (csrc/ops/rowwise_lookup.cpp) composes in C++, each also an op of
// its own: the agreed input exchange and the all-to-all (csrc/ops/data_ops.cpp), the requester's
// bucketing and the owner's unpacking (csrc/ops/embedding_ops.cpp). Declared here so one C++ call can
// run a whole lookup without going back through Python or the dispatcher.
#pragma once

#include <initializer_list>
#include <optional>
#include <tuple>
#include <vector>

#include <ATen/core/Tensor.h>
#include <c10/util/ArrayRef.h>
#include <c10/util/string_view.h>

#include "layout/box.h"

namespace torch_shard {
namespace ops {

// torch_shard._share_inputs.with_words (NOTE [ Shared inputs ]).
std::tuple<std::vector<at::Tensor>, std::vector<int64_t>>
share_inputs_agreed(at::TensorList parts, int64_t fingerprint, int64_t flags, c10::string_view group_name,
                    c10::ArrayRef<double> arguments, const std::optional<at::Tensor>& status,
                    const std::optional<at::Tensor>& words);

// torch_shard._all_to_all (counts in elements, staged through the communication device).
at::Tensor all_to_all_counts(const at::Tensor& input, c10::IntArrayRef send_counts,
                             c10::IntArrayRef recv_counts, c10::string_view group_name);

// torch_shard._bucket_ids (NOTE [ Requester-side routing in one op ]); with `lengths_for_idle` false,
// an owner that holds none of the ids gets no per-bag lengths either (NOTE [ Idle owners ] in
// csrc/ops/rowwise_lookup.cpp).
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor>
bucket_ids(const at::Tensor& ids, const std::optional<at::Tensor>& offsets, c10::IntArrayRef row_ranges,
           int64_t num_embeddings, bool int32, int64_t range_code, const std::optional<at::Tensor>& status,
           int64_t padding_idx, bool lengths_for_idle);

// torch_shard._unpack_routed.
std::tuple<at::Tensor, at::Tensor> unpack_routed(const at::Tensor& received, c10::IntArrayRef counts_in,
                                                 c10::IntArrayRef bags_in, int64_t row_start);

// torch_shard._embedding_bag_partial and its backward (NOTE [ Max ties ]).
std::tuple<at::Tensor, at::Tensor>
embedding_bag_partial(const at::Tensor& weight, const at::Tensor& ids, const at::Tensor& offsets,
                      const std::optional<at::Tensor>& per_sample_weights, int64_t row_start,
                      c10::string_view mode, int64_t padding_idx, bool fused, std::optional<int64_t> owned);
at::Tensor embedding_bag_partial_backward(const at::Tensor& grad, const at::Tensor& ids,
                                          const at::Tensor& offsets,
                                          const std::optional<at::Tensor>& per_sample_weights,
                                          const at::Tensor& argmax, int64_t row_start, int64_t rows,
                                          c10::string_view mode, int64_t padding_idx,
                                          std::optional<int64_t> owned, bool fused);

// Outputs of an op must not alias its inputs (the dispatcher's contract for functional ops; autograd
// and functionalization rely on it). The lookups hand back some tensors they were given, reshaped (a
// one-rank group's own per-sample weights, ids that needed no conversion): those are copied.
inline void copy_aliases(std::vector<at::Tensor>& outputs, std::initializer_list<at::Tensor> inputs) {
  for (at::Tensor& out : outputs) {
    for (const at::Tensor& in : inputs) {
      if (out.defined() && in.defined() && out.is_alias_of(in)) {
        out = out.clone();
        break;
      }
    }
  }
}

// The sum of non-negative counts, checked against int64 overflow.
inline int64_t checked_total(c10::IntArrayRef values) {
  int64_t sum = 0;
  for (int64_t v : values) {
    TORCH_CHECK_VALUE(v >= 0, "torch_shard: a negative count (", v, ")");
    sum = layout::checked_add(sum, v, "torch_shard: a sum of counts");
  }
  return sum;
}

// An all-to-all of whole rows of a 2-D (or 1-D) tensor: send_rows[r] rows to rank r, in rank order;
// returns the rows received, by rank. One rank: the tensor itself (nothing to move, nothing copied).
inline at::Tensor move_rows(const at::Tensor& values, c10::IntArrayRef send_rows, c10::IntArrayRef recv_rows,
                            c10::string_view group) {
  if (send_rows.size() == 1) {
    TORCH_CHECK_VALUE(send_rows[0] == recv_rows[0] && send_rows[0] == (values.dim() ? values.size(0) : 1),
                      "torch_shard: one rank sends itself what it receives");
    return values;
  }
  const int64_t width = values.dim() > 1 ? values.size(1) : 1;
  std::vector<int64_t> send(send_rows.size()), recv(recv_rows.size());
  for (size_t r = 0; r < send.size(); ++r) {
    send[r] = layout::checked_mul(send_rows[r], width, "torch_shard: elements to send");
    recv[r] = layout::checked_mul(recv_rows[r], width, "torch_shard: elements to receive");
  }
  const at::Tensor moved = all_to_all_counts(values.reshape({-1}), send, recv, group);
  return values.dim() > 1 ? moved.view({-1, width}) : moved;
}

} // namespace ops
} // namespace torch_shard
