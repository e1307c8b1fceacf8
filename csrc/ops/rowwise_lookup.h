// A row-wise sharded lookup in one call per forward and one per backward: the kernels of the ops
// _rowwise_lookup and _rowwise_lookup_backward (schemas in csrc/torch_shard.cpp), and what their
// max mode shares with ops/rowwise_max.cpp.
#pragma once

#include <cstdint>
#include <tuple>
#include <vector>

#include <ATen/core/Tensor.h>
#include <c10/util/ArrayRef.h>
#include <c10/util/string_view.h>

#include "ops/lookup_checks.h"

namespace torch_shard {
namespace ops {

// What the forward saves for the backward (its second output), by position.
enum RowwiseSaved : size_t {
  kRowIds = 0,    // the ids this rank owns, every requester's, less its first row (index dtype)
  kRowOffsets,    // sum and mean: their bags' offsets into kRowIds; max: the requester's own offsets
  kRowOffset2bag, // sum, mean, max: _embedding_bag's, for its backward (empty when no kernel ran)
  kRowBagSize,    //   "
  kRowMaxIndices, //   "
  kRowWeights,    // the per-sample weights of kRowIds (empty without)
  kRowPerm,       // requester: its ids in owner order (positions in its ids); max: the inverse, each
                  // id's row among the rows sent back (NOTE [ Max pools on the requester ])
  kRowDivisors,   // mean: each bag's divisor (in the result's dtype)
  kRowCounts,     // CPU int64: [rows, first row, bags, counts_in (W), counts_out (W), bags_in (W)]
  kRowNumSaved
};

LookupResult rowwise_lookup(const LookupCall& call);

at::Tensor rowwise_lookup_backward(const at::Tensor& grad, at::TensorList saved, int64_t padding_idx,
                                   c10::string_view mode, c10::string_view group_name);

} // namespace ops
} // namespace torch_shard
