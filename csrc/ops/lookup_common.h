// What the sharded lookups share (csrc/ops/rowwise_lookup.cpp, colwise_lookup.cpp, renorm.cpp): the
// lookup mode, each rank's block of the table, the CPU loops switch, and small tensor helpers.
//
// NOTE [ Empty shards reach no embedding kernel ]
// An empty shard is a normal state (6 columns over 4 ranks leave one rank a 13 x 0 chunk; a ceil
// split can leave a 0-row one, even at an offset past the table's end), and PyTorch's CUDA embedding
// and embedding_bag backward kernels cannot take an empty weight (an illegal memory access that
// poisons the CUDA context). So the lookups never call an ATen embedding kernel (forward, backward or
// renorm) on an empty weight or with no ids at all: the host knows both (shapes, and the counts told
// with the agreement), and the shard's contribution is then zeros, allocated, not looked up.
// tests/test_embedding_kernels.py records what the kernels get on every rank.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <vector>

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>
#include <c10/util/ArrayRef.h>
#include <c10/util/string_view.h>

#include "layout/box.h"

namespace torch_shard {
namespace ops {

// What a lookup computes: F.embedding (one row per id), or F.embedding_bag's pooling. The bag modes
// are ATen's embedding_bag codes. The one table of these names and codes: the schemas take the name.
enum class LookupMode : int64_t { kEmbedding = -1, kSum = 0, kMean = 1, kMax = 2 };

// "embedding", "sum", "mean" or "max" (ValueError naming `op` otherwise).
LookupMode parse_mode(const char* op, c10::string_view name);
const char* mode_name(LookupMode mode);
inline bool is_bags(LookupMode mode) {
  return mode != LookupMode::kEmbedding;
}
// The `mode` argument of ATen's embedding_bag kernels.
inline int64_t aten_bag_mode(LookupMode mode) {
  return static_cast<int64_t>(mode);
}

// Each group rank's block of the table along the sharded dim (rows or columns): its first index and
// its size. An empty block's first index means nothing: ChunkShardingSpec puts an empty chunk at
// ceil(S / W) * i, which can lie past the end of the dim. Checked: within the dim (of size `dim_size`),
// and the non-empty blocks tile it.
struct Blocks {
  std::vector<int64_t> starts;
  std::vector<int64_t> sizes;
  int64_t world() const { return static_cast<int64_t>(starts.size()); }
  int64_t end(int64_t r) const { return starts[r] + sizes[r]; }
};
Blocks checked_blocks(const char* op, c10::IntArrayRef starts, c10::IntArrayRef sizes, int64_t world,
                      int64_t dim_size);

// What every rank agrees on about the table a lookup (or max_norm) runs on, the same for every op on
// it: its layout (`layout`, Python's fingerprint), size, dtype, width (rows only: column shards differ
// in width) and every rank's block.
int64_t table_fingerprint(int64_t layout, int64_t num_embeddings, int64_t dim, const at::Tensor& local,
                          const Blocks& blocks);

// Which lookup op an agreement is for: each op agrees on its own identity besides the caller's
// arguments (NOTE [ Shared inputs ]), so a rank in one op and a rank in another raise instead of
// exchanging messages of different shapes.
enum class LookupOp : int64_t { kRowwise = 1, kColwise, kRenorm, kRowwiseBackward, kColwiseBackward };
// The scalars a lookup op agrees on: the caller's `arguments`, the op, then the op's own values.
std::vector<double> agreed_arguments(LookupOp op, c10::ArrayRef<double> arguments,
                                     std::initializer_list<double> own);

// Whether CPU tensors take the fused loops written for them (bucketing, input checks, partial max
// pooling and its backward) or the ATen composition every other device takes (NOTE [ Requester-side
// routing in one op ]). The product's is true; the test library switches it, through the product's
// seams (csrc/seams.h), to run the composition on the CPU.
bool cpu_loops();
void set_cpu_loops(bool on);
inline bool loops_for(const at::Tensor& t) {
  return t.is_cpu() && cpu_loops();
}

// Ids travel (and reach the kernels) as int32 when the table has fewer than 2**31 rows: half the
// bytes; ATen's embedding kernels take int32 ids and offsets.
c10::ScalarType index_dtype(int64_t num_embeddings);

// A small host vector on `device` with no host sync: a copy to a GPU from pinned memory does not wait.
// `dtype`: int64, or int32 for values the caller knows fit.
at::Tensor to_device(const std::vector<int64_t>& values, c10::Device device,
                     c10::ScalarType dtype = at::kLong);

// Outputs of an op must not alias its inputs (the dispatcher's contract for functional ops; autograd
// and functionalization rely on it). The lookups hand back some tensors they were given, reshaped (a
// one-rank group's own per-sample weights, ids that needed no conversion): those are copied.
void copy_aliases(std::vector<at::Tensor>& outputs, std::initializer_list<at::Tensor> inputs);

// The sum of non-negative counts, checked against int64 overflow.
int64_t checked_total(c10::IntArrayRef values);

} // namespace ops
} // namespace torch_shard
