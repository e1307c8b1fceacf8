// The torch_shard operator library: every schema lives here, in the one TORCH_LIBRARY block.
// Which kernel serves which op, per dispatch key, is the one table in csrc/ops/registration.cpp; fake
// kernels and autograd written in Python are in torch_shard/_support/_op_registrations.py.
//
// Tracing (FakeTensorMode: torch.compile, torch.export, make_fx): chunk_boxes has a fake kernel and can
// be traced. The data ops and lookups communicate and the impl ops build or read a ShardedTensor's C++
// impl, so they cannot be traced: they raise a RuntimeError under FakeTensorMode or make_fx; so do the
// layout ops that read their tensors' values when given fake tensors. See NOTE [ Ops that cannot be traced ] (csrc/ops/untraceable.h). The rest take no tensors.
//
// Importing torch_shard._C loads this shared object; the static initialisers below register the ops,
// which Python then reaches as torch.ops.torch_shard.*. There is no pybind11 module: the module's
// few helpers (csrc/bindings.cpp) use the raw CPython API.

#include <Python.h>

#include <torch/library.h>

#include "seams.h"

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
  // source layout to the target layout (owners are ranks in [0, world); replicas allowed, checked as
  // _redistribute checks them). The data ops' plan, without a group: for tests and benchmarks.
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
  // Local tensors moved from one layout to another in one exchange, either layout holding a box on
  // several ranks (DTensor's Replicate): each rank passes the tensors of its source boxes (in box order)
  // and gets those of its target boxes; `like` gives dtype and device (NOTE [ Redistributing replicated
  // layouts ], csrc/ops/redistribute.cpp). Owners are group ranks.
  m.def(
      "_redistribute(Tensor[] sources, Tensor like, int[] global_size, Tensor src_offsets, Tensor src_sizes, "
      "int[] src_owners, Tensor dst_offsets, Tensor dst_sizes, int[] dst_owners, str group_name) -> "
      "Tensor[]");
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
  // every rank, rank-major, after agreeing on `fingerprint`, `flags` and `arguments` (csrc/ops/
  // shared_inputs.cpp, NOTE [ Shared inputs ]).
  m.def("_share_inputs(Tensor[] parts, int fingerprint, int flags, str group_name, float[] arguments=[]) "
        "-> Tensor[]");
  // True on every rank iff `value` is true on every rank.
  m.def("_all_ranks_true(bool value, str group_name) -> bool");
  // Every rank's `value`, in rank order (one agreement round; op kind "compare").
  m.def("_gather_values(int value, str group_name) -> int[]");
  // The Python exception class name of each error code a failing rank reports to the others, in code
  // order from 1: the one table of these codes (csrc/comm/exchange.h, ErrorCode).
  m.def("_error_classes() -> str[]");
  // --- sharded lookups (csrc/ops/): one call per forward and one per backward ---
  // A lookup's table has `num_embeddings` rows and is sharded along one dim; block_starts and
  // block_sizes give each group rank's block along it (rows, or columns), which must tile the dim (an
  // empty block may start anywhere, as ChunkShardingSpec's empty chunks do). `local` is this rank's
  // shard, `ids` its 1-D int64 ids; `mode` "embedding" (F.embedding: one row per id) or
  // F.embedding_bag's "sum", "mean", "max", with `offsets` the bags' starts as the caller gave them
  // (with the input's length last under include_last_offset), or without offsets 2-D ids, one bag per
  // row, as F.embedding_bag takes them. padding_idx is global (-1: none).
  // `fingerprint` (the weight's layout) and `arguments` (the call's scalars) must agree on every rank;
  // the op adds what it computes with. Every check that can differ between ranks runs inside the op's
  // agreement, so a bad call on one rank raises on every rank (the others carrying its message). The
  // backward ops agree too. CPU and CUDA kernels; autograd and fake kernels that raise are registered
  // in Python. Row-wise (csrc/ops/rowwise_lookup.cpp, NOTE [ A row-wise lookup in one call ]): returns
  // this rank's result ([n, dim], or [bags, dim]) and what _rowwise_lookup_backward needs.
  m.def("_rowwise_lookup(Tensor local, Tensor ids, Tensor? offsets, Tensor? per_sample_weights, "
        "int[] block_starts, int[] block_sizes, int num_embeddings, int padding_idx, str mode, "
        "bool include_last_offset, bool needs_grad, int fingerprint, float[] arguments, str group_name) "
        "-> (Tensor, Tensor[])");
  // The gradient of `local` from the gradient of _rowwise_lookup's result: one call.
  m.def("_rowwise_lookup_backward(Tensor grad, Tensor[] saved, int padding_idx, str mode, str group_name) "
        "-> Tensor");
  // Column-wise (csrc/ops/colwise_lookup.cpp, NOTE [ A column-wise lookup in one call ]): this rank's
  // rows with every rank's columns, in column order, and what _colwise_lookup_backward needs.
  m.def("_colwise_lookup(Tensor local, Tensor ids, Tensor? offsets, Tensor? per_sample_weights, "
        "int[] block_starts, int[] block_sizes, int num_embeddings, int padding_idx, str mode, "
        "bool include_last_offset, bool needs_grad, int fingerprint, float[] arguments, str group_name) "
        "-> (Tensor, Tensor[])");
  // The gradient of `local` from the gradient of _colwise_lookup's result: one call.
  m.def("_colwise_lookup_backward(Tensor grad, Tensor[] saved, int padding_idx, str mode, str group_name) "
        "-> Tensor");
  // max_norm (csrc/ops/renorm.cpp, NOTE [ max_norm on a sharded weight ]): renormalises `local` (the
  // table sharded along `dim`, 0 or 1) in place, under no_grad, so that every row any rank's `ids`
  // look up has a norm_type-norm of at most max_norm, as dense F.embedding's embedding_renorm_ does.
  m.def("_embedding_renorm_(Tensor(a!) local, Tensor ids, int dim, int[] block_starts, int[] block_sizes, "
        "int num_embeddings, float max_norm, float norm_type, int fingerprint, float[] arguments, "
        "str group_name) -> ()");
  // [bytes sent to other ranks, bytes received from other ranks, communication rounds, plan cache
  // hits, plan cache misses, data ops done in a single round, round-1 header tables read from the
  // communication device (a host sync on a GPU)] since the last reset.
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
  // The product's seams (csrc/seams.h): a table the test library takes, which no Python caller can call.
  PyObject* seams =
      PyCapsule_New(const_cast<torch_shard::Seams*>(&torch_shard::seams()), "torch_shard._C._seams", nullptr);
  if (seams == nullptr || PyModule_AddObject(module, "_seams", seams) < 0) {
    Py_XDECREF(seams);
    Py_DECREF(module);
    return nullptr;
  }
  return module;
}
