// The torch_shard operator library: every schema lives here, in the one TORCH_LIBRARY block.
// Kernels are registered next to their code under csrc/ops/ with TORCH_LIBRARY_IMPL; fake kernels and
// autograd written in Python are in torch_shard/_op_registrations.py.
//
// Tracing (FakeTensorMode: torch.compile, torch.export, make_fx): _embedding_bag_partial, its backward
// and chunk_boxes have fake kernels and can be traced. The data ops communicate and the impl ops build
// or read a ShardedTensor's C++ impl, so they cannot be traced: they raise a RuntimeError under
// FakeTensorMode or make_fx; so do the layout ops that read their tensors' values when given fake
// tensors. See NOTE [ Ops that cannot be traced ] (csrc/ops/untraceable.h). The rest take no tensors.
//
// Importing torch_shard._C loads this shared object; the static initialisers below register the ops,
// which Python then reaches as torch.ops.torch_shard.*. There is no pybind11 module: the module's
// few helpers (csrc/bindings.cpp) use the raw CPython API.

#include <Python.h>

#include <torch/library.h>

#include "testing_hooks.h"

// A layout travels as one argument group, the same in every schema that takes one (see
// csrc/ops/layout_args.h):
//   int? chunk_dim, Tensor? shard_offsets, Tensor? shard_sizes, Tensor? placement_index,
//   str[] placements, int[] placement_owners
// chunk_dim: ChunkShardingSpec's split along that dim, chunk i on placements[i]; otherwise (N, ndim)
// int64 offsets and sizes, and the placement of each shard. Owners are ranks of the op's group.
TORCH_LIBRARY(torch_shard, m) {
  // --- layout math (pure; see csrc/layout/) ---
  // Offsets and lengths, along the sharded dim, of `num_chunks` torch.chunk-style chunks.
  m.def("chunk_layout(int dim_size, int num_chunks) -> (int[], int[])");
  // Length of chunk `index` when `dim_size` is cut into pieces of `split_size`.
  m.def("chunked_dim_size(int dim_size, int split_size, int index) -> int");
  // ChunkShardingSpec's N-D boxes: (N, ndim) offsets and sizes of `global_size` split along `dim`.
  m.def("chunk_boxes(int[] global_size, int dim, int num_chunks) -> (Tensor, Tensor)");
  // Shards are given as two int64 CPU tensors of shape (N, ndim): offsets and sizes. Raises ValueError
  // for overlap, int64 overflow and, with global_size, for shards outside the tensor and gaps.
  // This op and the next three read their tensors' values: not traceable (RuntimeError for fake tensors).
  m.def("validate_shards(Tensor shard_offsets, Tensor shard_sizes, int[]? global_size=None) -> ()");
  // [i, j] (i < j) for an overlapping pair of non-empty shards, or [] if none overlap.
  m.def("_find_overlap(Tensor shard_offsets, Tensor shard_sizes) -> int[]");
  // The fingerprint ranks agree on for a tensor of `dtype` with this layout (boxes, owners, device
  // types and dtype; not validated), as the data ops compute it.
  m.def("_layout_fingerprint(int[] global_size, int? chunk_dim, Tensor? shard_offsets, Tensor? shard_sizes, "
        "Tensor? placement_index, str[] placements, int[] placement_owners, ScalarType dtype) -> int");
  // (elements sent to, elements received from) each rank, for group rank `me` moving data from the
  // source layout to the target layout (both validated; owners are ranks in [0, world)). The data
  // ops' plan, without a group: for tests.
  m.def("_transfer_counts(int[] global_size, Tensor src_offsets, Tensor src_sizes, int[] src_owners, "
        "Tensor dst_offsets, Tensor dst_sizes, int[] dst_owners, int me, int world) -> (int[], int[])");

  // --- ShardedTensorImpl construction, accessors and the one setter (csrc/sharded_tensor_impl.h) ---
  // Not traceable (they build or read the impl; RuntimeError under FakeTensorMode), except is_sharded
  // and _local_shard_mismatch (it reads plain tensors' metadata only).
  // `rank` and `world` are this process's rank in group `group_name` and its size ("" and -1/-1 for a
  // tensor without a group, whose owners are then global ranks). `device`: where the impl says it
  // lives when this rank holds no shard (None: the group's communication device).
  m.def("_make_sharded(Tensor[] local_shards, int[] local_shard_indices, int[] global_size, int? chunk_dim, "
        "Tensor? shard_offsets, Tensor? shard_sizes, Tensor? placement_index, str[] placements, "
        "int[] placement_owners, ScalarType dtype, Device? device, bool pin_memory, str group_name, "
        "int rank, int world, bool validate=True) -> Tensor");
  m.def("is_sharded(Tensor self) -> bool");
  m.def("_local_shards(Tensor self) -> Tensor[]");
  m.def("_local_shard_indices(Tensor self) -> int[]");
  // A stamp that changes whenever the layout or a local shard does.
  m.def("_version(Tensor self) -> int");
  // (version, local shards, their indices in the layout, pin_memory, layout serial, layout
  // fingerprint): what Python caches, in one call.
  m.def("_state(Tensor self) -> (int, Tensor[], int[], bool, int, int)");
  // (offsets, sizes, placement_index, placements, placement_owners, chunk_dim) of the layout.
  m.def("_layout(Tensor self) -> (Tensor, Tensor, Tensor, str[], int[], int?)");
  m.def("_group_name(Tensor self) -> str");
  // The one setter of local shards (same layout); checks each tensor against its shard.
  m.def("_set_local_shards(Tensor(a!) self, Tensor[] local_shards, int[] local_shard_indices) -> ()");
  // [k, code] of the first tensor that does not fit its shard (size, placement device, properties;
  // NOTE [ A local shard against its shard ]), or []: the one check behind every way to give local shards.
  // Codes: 1 layout, 2 contiguity, 3 size, 4 device, 5 dtype, 6 pin_memory, 7 requires_grad.
  m.def("_local_shard_mismatch(Tensor[] tensors, int[] shard_sizes, int[] shard_ndims, str[] devices, "
        "ScalarType? dtype=None, bool? pin_memory=None, bool? requires_grad=None, "
        "bool strided_contiguous=False) -> int[]");

  // --- data movement over the tensor's process group (csrc/ops/data_ops.cpp) ---
  // Every data op agrees first (one small all-to-all that also carries small payloads), so bad or
  // mismatched arguments raise on every rank. Ranks are ranks of the group. Every op here that takes a
  // group communicates and cannot be traced (RuntimeError under FakeTensorMode).
  // Scatter `tensor` (read on rank `src` only) into the given layout; returns the new ShardedTensor.
  m.def("shard(Tensor? tensor, int src, int[] global_size, ScalarType dtype, int? chunk_dim, "
        "Tensor? shard_offsets, Tensor? shard_sizes, Tensor? placement_index, str[] placements, "
        "int[] placement_owners, bool requires_grad, str group_name) -> Tensor");
  // Assemble the whole tensor into `out` on rank `dst` (None elsewhere); exact sizes on the wire.
  m.def("gather(Tensor self, int dst, Tensor(a!)? out) -> ()");
  // Move `self` to the given layout, in place, moving only the elements that change owner.
  m.def("reshard(Tensor(a!) self, int? chunk_dim, Tensor? shard_offsets, Tensor? shard_sizes, "
        "Tensor? placement_index, str[] placements, int[] placement_owners) -> ()");
  // For a rank whose Python-side preparation of data op `op` failed with an `error_class` exception
  // (`message`: that exception in words, "<its class>: <its message>"): takes part in that op's
  // agreement so every other rank raises too, carrying `message` (NOTE [ Reasons travel ]). Returns on
  // this rank.
  m.def("_abort(str op, str error_class, str group_name, str message=\"\") -> ()");
  // The agreement of `shard` alone (src rank, size, dtype, a fingerprint of the spec), for scatters by
  // specs that shard themselves (their shard() runs after it).
  m.def("_agree_shard(int src, int[] global_size, ScalarType dtype, int spec_fingerprint, "
        "str group_name) -> ()");
  // Every rank's `parts` (1-D tensors, at most 3, same count and dtypes everywhere, any lengths) on
  // every rank, rank-major, after agreeing on `fingerprint`, `flags` and `arguments`. See NOTE [ Shared
  // inputs ]. The .with_words overload also carries device-side values read with the agreement:
  // `status` (this rank's input check) and `words` (one per peer); it returns [this rank's status, the
  // word each rank sent here (W), this rank's words (W)] too, and no parts when that status is not 0.
  m.def("_share_inputs(Tensor[] parts, int fingerprint, int flags, str group_name, float[] arguments=[]) "
        "-> Tensor[]");
  m.def("_share_inputs.with_words(Tensor[] parts, int fingerprint, int flags, str group_name, "
        "float[] arguments, Tensor? status, Tensor? words) -> (Tensor[], int[])");
  // True on every rank iff `value` is true on every rank.
  m.def("_all_ranks_true(bool value, str group_name) -> bool");
  // Every rank's `value`, in rank order (one agreement round; op kind "compare").
  m.def("_gather_values(int value, str group_name) -> int[]");
  // Unchecked all-to-all of a flat tensor (counts in elements; rank r receives send_counts[r] from
  // this rank). Internal: counts must come from data every rank agreed on. CPU and CUDA kernels; its
  // autograd (the reverse all-to-all) and a fake kernel that raises are registered in Python.
  m.def("_all_to_all(Tensor input, int[] send_counts, int[] recv_counts, str group_name) -> Tensor");
  // Unchecked elementwise sum over the group's ranks (a new tensor on `input`'s device). Internal: every
  // rank's shape and dtype must come from data every rank agreed on. Kernels and registrations as for
  // _all_to_all (its backward sums the gradients over the ranks).
  m.def("_sum_over_ranks(Tensor input, str group_name) -> Tensor");
  // The Python exception class name of each error code a failing rank reports to the others, in code
  // order from 1: the one table of these codes (csrc/comm/exchange.h, ErrorCode).
  m.def("_error_classes() -> str[]");
  // Row-wise sharded embedding_bag (csrc/ops/embedding_ops.cpp): pool, per bag, the rows of `weight`
  // (global rows row_start..) that a requester's bags use; mode "sum" or "max". Returns the pooled
  // [num_bags, dim] (0 / -inf where the shard holds none of a bag's ids) and, for max, the position in
  // ids of the winning id per element (-1 for none; NOTE [ Max ties ]). padding_idx -1 means none.
  // fused=False takes the ATen composition other devices use, also on CPU (for tests; in the backward
  // it matters for max only). Bag b holds ids[offsets[b]:offsets[b+1]]
  // (the last to the end); both kernels check offsets (non-decreasing, within [0, numel(ids)]),
  // shapes, devices, row_start/rows and argmax, so no call reads or writes out of bounds.
  // `owned`: how many ids (from offsets[0] on) fall in the shard's rows, when the caller knows it
  // without reading device memory (the kernels then never read it either); None: counted here.
  // CPU and CUDA kernels, fake kernels, and the forward's autograd (its backward is the second op).
  m.def("_embedding_bag_partial(Tensor weight, Tensor ids, Tensor offsets, Tensor? per_sample_weights, "
        "int row_start, str mode, int padding_idx, bool fused=True, int? owned=None) -> (Tensor, Tensor)");
  m.def("_embedding_bag_partial_backward(Tensor grad, Tensor ids, Tensor offsets, "
        "Tensor? per_sample_weights, Tensor argmax, int row_start, int rows, str mode, "
        "int padding_idx, int? owned=None, bool fused=True) -> Tensor");
  // Row-wise requester's preparation in one CPU pass (csrc/ops/embedding_ops.cpp, NOTE [ Requester-side
  // routing in one op ]): (ids in owner order, each owner's per-bag lengths after its ids, as int32 when
  // `int32`; the positions in ids of that order; the word told to each owner with the agreement; the
  // status: range_code when an id is outside [0, num_embeddings), else `status`). row_ranges: the
  // (first, end) rows of each group rank, flattened. Without offsets: no lengths, words are counts.
  // Last, mean's divisor per bag: its ids other than padding_idx (-1: none), at least 1.
  m.def("_bucket_ids(Tensor ids, Tensor? offsets, int[] row_ranges, int num_embeddings, bool int32, "
        "int range_code, Tensor? status, int padding_idx=-1) -> (Tensor, Tensor, Tensor, Tensor, Tensor)");
  // Owner side: every requester's ids (less row_start) and its bags' offsets, from what _bucket_ids
  // sent (per requester: counts_in[r] ids, then bags_in[r] lengths). CPU kernel and fake kernel.
  m.def("_unpack_routed(Tensor received, int[] counts_in, int[] bags_in, int row_start) -> (Tensor, Tensor)");
  // A whole row-wise sharded lookup on this rank, one call (csrc/ops/rowwise_lookup.cpp, NOTE [ A row-wise
  // lookup in one call ]): buckets `ids` (1-D int64) by owner, agrees (`status`, `fingerprint`,
  // `arguments`, as _share_inputs.with_words), routes each id to its owner, looks the owned ids up in
  // `local` (this rank's rows from `row_start`), and returns this rank's result: [n, dim] for mode -1
  // (embedding), [bags, dim] for 0 (sum) and 1 (mean, padding ids not counted), with what
  // _rowwise_lookup_backward needs. `padding_idx` is global (-1: none). When this rank's input failed
  // its check the result is empty and `saved` holds only the counts, whose first value is the code.
  // CPU and CUDA kernels; autograd and a fake kernel that raises are registered in Python.
  m.def("_rowwise_lookup(Tensor local, Tensor ids, Tensor? offsets, Tensor? per_sample_weights, "
        "Tensor? status, int[] row_ranges, int num_embeddings, int row_start, int padding_idx, int mode, "
        "bool int32, bool needs_grad, bool loops, int fingerprint, float[] arguments, int range_code, "
        "str group_name) -> (Tensor, Tensor[])");
  // The gradient of `local` from the gradient of _rowwise_lookup's result: one call.
  m.def("_rowwise_lookup_backward(Tensor grad, Tensor[] saved, int rows, int row_start, int padding_idx, "
        "int mode, str group_name) -> Tensor");
  // A whole column-wise sharded lookup on this rank, one call (csrc/ops/colwise_lookup.cpp, NOTE [ A
  // column-wise lookup in one call ]): agrees and shares every rank's bags, looks them up in `local`
  // (this rank's columns of every row), and returns this rank's rows with every rank's columns, in
  // column order (column_starts / column_widths: each group rank's block), with what
  // _colwise_lookup_backward needs. mode: -1 embedding, 0 sum, 1 mean, 2 max; padding_idx -1: none.
  // When this rank's input failed its check the result is empty and `saved` holds only the counts.
  m.def("_colwise_lookup(Tensor local, Tensor ids, Tensor? offsets, Tensor? per_sample_weights, "
        "Tensor? status, int[] column_starts, int[] column_widths, int num_embeddings, int padding_idx, "
        "int mode, bool int32, bool needs_grad, int fingerprint, float[] arguments, int range_code, "
        "str group_name) -> (Tensor, Tensor[])");
  // The gradient of `local` from the gradient of _colwise_lookup's result: one call.
  m.def("_colwise_lookup_backward(Tensor grad, Tensor[] saved, int rows, int padding_idx, int mode, "
        "str group_name) -> Tensor");
  // [bytes sent to other ranks, bytes received from other ranks, communication rounds, plan cache
  // hits, plan cache misses, data ops done in a single round] since the last reset.
  m.def("_comm_stats(bool reset=False) -> int[]");
}

PyMethodDef* torch_shard_python_methods(); // csrc/bindings.cpp

// Loading the extension as a Python module registers the ops (static initialisers above); the module
// itself only carries the helpers of csrc/bindings.cpp.
extern "C" PyObject* PyInit__C(void) {
  static struct PyModuleDef module_def = {
      PyModuleDef_HEAD_INIT,
      "_C",                                                            // name
      "torch_shard native library: registers torch.ops.torch_shard.*", // doc
      -1,                                                              // size
      torch_shard_python_methods(),                                    // methods
  };
  PyObject* module = PyModule_Create(&module_def);
  if (module == nullptr) {
    return nullptr;
  }
  // For torch_shard._testing_C only (csrc/testing_hooks.h): the product itself never uses it.
  PyObject* hooks = PyCapsule_New(const_cast<torch_shard::TestingHooks*>(&torch_shard::testing_hooks()),
                                  "torch_shard._C._testing_hooks", nullptr);
  if (hooks == nullptr || PyModule_AddObject(module, "_testing_hooks", hooks) < 0) {
    Py_XDECREF(hooks);
    Py_DECREF(module);
    return nullptr;
  }
  return module;
}
