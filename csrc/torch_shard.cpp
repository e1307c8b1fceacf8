// The torch_shard operator library: every schema lives here, in the one TORCH_LIBRARY block.
// Kernels are registered next to their code under csrc/ops/ with TORCH_LIBRARY_IMPL.
//
// Importing torch_shard._C loads this shared object; the static initialisers below register the ops,
// which Python then reaches as torch.ops.torch_shard.*. There is no pybind11 module: the module's
// few helpers (csrc/bindings.cpp) use the raw CPython API.

#include <Python.h>

#include <torch/library.h>

TORCH_LIBRARY(torch_shard, m) {
  // --- layout math (pure; see csrc/layout/) ---
  // Offsets and lengths, along the sharded dim, of `num_chunks` torch.chunk-style chunks.
  m.def("chunk_layout(int dim_size, int num_chunks) -> (int[], int[])");
  // Shards are given as two int64 CPU tensors of shape (N, ndim): offsets and sizes (see
  // csrc/ops/box_args.h). Raises ValueError for overlap and, with global_size, for shards outside the
  // tensor and uncovered elements.
  m.def("validate_shards(Tensor shard_offsets, Tensor shard_sizes, int[]? global_size=None) -> ()");
  // [i, j] (i < j) for an overlapping pair of non-empty shards, or [] if none overlap.
  m.def("_find_overlap(Tensor shard_offsets, Tensor shard_sizes) -> int[]");

  // --- ShardedTensorImpl construction and accessors (see csrc/sharded_tensor_impl.h) ---
  m.def(
      "_make_sharded(Tensor[] local_shards, int[] local_shard_indices, int[] global_size, "
      "Tensor shard_offsets, Tensor shard_sizes, int[] shard_ranks, ScalarType dtype, "
      "Device device, bool pin_memory, str group_name) -> Tensor");
  m.def("is_sharded(Tensor self) -> bool");
  m.def("_local_shards(Tensor self) -> Tensor[]");
  m.def("_local_shard_indices(Tensor self) -> int[]");
  // (offsets, sizes, ranks) of every global shard; offsets and sizes as (N, ndim) int64 tensors.
  m.def("_shard_layout(Tensor self) -> (Tensor, Tensor, int[])");
  m.def("_group_name(Tensor self) -> str");
  // Replace the local shards (same global layout): keeps the impl in step when Python code swaps
  // the tensors of `local_shards()` in place.
  m.def("_set_local_shards(Tensor(a!) self, Tensor[] local_shards, int[] local_shard_indices) -> ()");

  // --- data movement over the process group `group_name` (see csrc/comm/) ---
  // Ranks are ranks of that group. Layouts are (N, ndim) offset/size tensors plus the owner of each
  // shard; `out_shards` are this rank's preallocated target shards, `out_indices` their positions.
  // Scatter `tensor` (read on rank `src` only) into the target layout.
  m.def(
      "shard(Tensor? tensor, int src, int[] global_size, Tensor(a!)[] out_shards, int[] out_indices, "
      "Tensor shard_offsets, Tensor shard_sizes, int[] shard_owners, ScalarType dtype, "
      "Device device, str group_name) -> ()");
  // Assemble the whole tensor into `out` on rank `dst` (None elsewhere); exact sizes on the wire.
  m.def("gather(Tensor self, int dst, Tensor(a!)? out, str group_name) -> ()");
  // Move `self` to a new layout in one all-to-all of the elements that change owner; `self` then
  // holds `out_shards` under the new layout.
  m.def(
      "reshard(Tensor(a!) self, Tensor(b!)[] out_shards, int[] out_indices, Tensor shard_offsets, "
      "Tensor shard_sizes, int[] shard_owners, str group_name) -> ()");
  // All ranks' `values` (same length everywhere), rank-major: agreement checks before data moves.
  m.def("_exchange_header(int[] values, str group_name, Device device) -> int[]");
  // Generic exchanges for sharded compute (embedding ops). Flat 1-D tensors; counts in elements.
  // Rank r receives send_counts[r] elements from this rank; recv_counts[p] must equal what rank p
  // sends here (both sides compute them from shared metadata).
  m.def("_all_to_all(Tensor input, int[] send_counts, int[] recv_counts, str group_name) -> Tensor");
  // Every rank's `input` (any length along dim 0, same trailing dims and dtype), in rank order.
  m.def("_all_gather_varlen(Tensor input, str group_name) -> Tensor[]");
  // Row-wise sharded embedding_bag (csrc/ops/embedding_ops.cpp): pool, per bag, the rows of `weight`
  // (global rows row_start..) that a requester's bags use; mode "sum" or "max". Returns the pooled
  // [num_bags, dim] (0 / -inf where the shard holds none of a bag's ids) and, for max, the winning
  // local row per element (-1 for none). padding_idx -1 means none. fused=False takes the ATen
  // composition other devices use, also on CPU (for tests).
  m.def(
      "_embedding_bag_partial(Tensor weight, Tensor ids, Tensor offsets, Tensor? per_sample_weights, "
      "int row_start, str mode, int padding_idx, bool fused=True) -> (Tensor, Tensor)");
  m.def(
      "_embedding_bag_partial_backward(Tensor grad, Tensor ids, Tensor offsets, "
      "Tensor? per_sample_weights, Tensor argmax, int row_start, int rows, str mode, "
      "int padding_idx) -> Tensor");
  // [bytes sent to other ranks, bytes received from other ranks, collectives] since the last reset.
  m.def("_comm_stats(bool reset=False) -> int[]");
}

PyMethodDef* torch_shard_python_methods();  // csrc/bindings.cpp

// Loading the extension as a Python module registers the ops (static initialisers above); the module
// itself only carries the helpers of csrc/bindings.cpp.
extern "C" PyObject* PyInit__C(void) {
  static struct PyModuleDef module_def = {
      PyModuleDef_HEAD_INIT,
      "_C",  // name
      "torch_shard native library: registers torch.ops.torch_shard.*",  // doc
      -1,  // size
      torch_shard_python_methods(),  // methods
  };
  return PyModule_Create(&module_def);
}
