// The public data ops: shard (scatter), gather, reshard. Each is ONE call that runs, in order:
//   local checks -> agreement (error codes and fingerprints, computed here) -> plan (cached) -> move,
// so a direct torch.ops.torch_shard.* call is as safe as the Python methods: bad or mismatched
// arguments raise on every rank, and nothing is written unless every rank agreed. See
// NOTE [ Agreed exchange ] (comm/exchange.cpp) for the rounds and NOTE [ Plan cache ]
// (comm/transfer.cpp) for planning.

#include <cmath>
#include <cstring>
#include <sstream>

#include <ATen/core/grad_mode.h>

#include <ATen/ops/empty.h>
#include <torch/library.h>

#include "comm/exchange.h"
#include "comm/process_group.h"
#include "comm/transfer.h"
#include "layout/layout.h"
#include "ops/layout_args.h"
#include "sharded_tensor_impl.h"

namespace torch_shard {
namespace {

using comm::LocalTensors;
using comm::Values;
using layout::Fingerprint;
using layout::Layout;

// What every rank must agree on about a tensor besides its layout.
int64_t size_and_dtype_fp(const layout::Dims& size, c10::ScalarType dtype) {
  return Fingerprint().add(size).add(static_cast<int64_t>(dtype)).as_int64();
}

int64_t layout_and_dtype_fp(const Layout& layout, c10::ScalarType dtype) {
  return Fingerprint()
      .add(static_cast<int64_t>(layout.fingerprint()))
      .add(static_cast<int64_t>(dtype))
      .as_int64();
}

// First rank whose value k differs from this rank's, or -1.
int64_t first_mismatch(const std::vector<Values>& all, int64_t me, int k) {
  for (size_t r = 0; r < all.size(); ++r) {
    if (all[r][k] != all[me][k]) {
      return static_cast<int64_t>(r);
    }
  }
  return -1;
}

// Every non-empty shard must be held by a member of the group, or its data is nowhere.
void check_owned(const Layout& layout, int64_t world, const char* op) {
  for (size_t i = 0; i < layout.num_shards(); ++i) {
    const int64_t owner = layout.owner(i);
    TORCH_CHECK_VALUE(layout.box(i).empty() || (owner >= 0 && owner < world), "torch_shard.", op, ": shard ",
                      layout::describe_box(layout.box(i), i), " (placement '", layout.placement(i).name,
                      "') has no owner in the process group");
  }
}

// The agreement of a scatter: the same source rank, tensor size and dtype, and layout everywhere
// (upstream's messages for the first and last).
void check_shard(const std::vector<Values>& all, int64_t me) {
  if (const int64_t r = first_mismatch(all, me, 0); r >= 0) {
    TORCH_CHECK_VALUE(false, "src_rank=", all[me][0], " on rank: ", me,
                      " does not match with src_rank=", all[r][0], " on rank: ", r);
  }
  if (const int64_t r = first_mismatch(all, me, 1); r >= 0) {
    TORCH_CHECK_VALUE(false, "torch_shard.shard: the tensor on rank ", me,
                      " has a different size or dtype than on rank ", r,
                      "; every rank must pass a tensor of the same size and dtype");
  }
  if (const int64_t r = first_mismatch(all, me, 2); r >= 0) {
    TORCH_CHECK_VALUE(false, "sharding_spec on rank: ", me, " does not match with sharding_spec on rank: ", r,
                      " (their layouts differ: boxes or placements)");
  }
}

at::Tensor shard(const std::optional<at::Tensor>& tensor, int64_t src, c10::IntArrayRef global_size,
                 c10::ScalarType dtype, std::optional<int64_t> chunk_dim,
                 const std::optional<at::Tensor>& shard_offsets, const std::optional<at::Tensor>& shard_sizes,
                 const std::optional<at::Tensor>& placement_index, std::vector<std::string> placements,
                 c10::IntArrayRef placement_owners, bool requires_grad, c10::string_view group_name) {
  // The kernel writes shards and `out` in place; a direct call with tensors that require grad must not
  // record it.
  at::NoGradGuard no_grad;
  const std::string group(group_name);
  auto pg = comm::resolve_group(group, "shard");
  const int64_t me = pg->getRank();
  const int64_t world = pg->getSize();
  const c10::Device device = comm::comm_device(*pg);
  std::shared_ptr<const Layout> target;
  std::shared_ptr<const Layout> source;
  std::shared_ptr<const layout::TransferPlan> plan;
  LocalTensors src_local, out;
  comm::Moves moves;
  Values mine{};
  std::exception_ptr error;
  try {
    TORCH_CHECK_INDEX(src >= 0 && src < world, "torch_shard.shard: src_rank ", src,
                      " is not a rank of a group of size ", world);
    target = layout_from_args(global_size, chunk_dim, shard_offsets, shard_sizes, placement_index, placements,
                              placement_owners, world, /*validate=*/true, "shard");
    check_owned(*target, world, "shard");
    if (me == src) {
      TORCH_CHECK_VALUE(tensor.has_value() && tensor->defined(),
                        "torch_shard.shard: the source rank must pass the tensor to shard");
      TORCH_CHECK_TYPE(!is_sharded_tensor(*tensor),
                       "torch_shard.shard: the tensor to shard is already a ShardedTensor");
      TORCH_CHECK_VALUE(tensor->sizes() == global_size, "torch_shard.shard: tensor of size ", tensor->sizes(),
                        " on the source rank, but the layout is for ", layout::dims_str(global_size.vec()));
      TORCH_CHECK_TYPE(tensor->scalar_type() == dtype, "torch_shard.shard: tensor has dtype ",
                       tensor->scalar_type(), ", expected ", dtype);
      src_local = LocalTensors{{*tensor}, {0}};
    }
    source = Layout::whole(global_size.vec(), src, device);
    plan = comm::cached_plan(source, target, me, world);
    out = comm::allocate_local(*target, me, dtype);
    moves = comm::transfer_moves(*plan, *source, src_local, *target, out, me, device, dtype);
    moves.fresh_destinations = true; // `out` was just allocated
    mine = {src, size_and_dtype_fp(global_size.vec(), dtype), static_cast<int64_t>(target->fingerprint()), 0};
  } catch (...) {
    error = std::current_exception();
  }
  comm::exchange(*pg, comm::OpKind::kShard, mine, error, comm::ErrorCode::kNone, &moves, check_shard);
  for (auto& t : out.tensors) {
    t.requires_grad_(requires_grad);
  }
  return make_sharded_tensor(target, std::move(out.tensors), std::move(out.indices), dtype, device,
                             /*pin_memory=*/false, group, me);
}

void gather(const at::Tensor& self, int64_t dst, const std::optional<at::Tensor>& out) {
  at::NoGradGuard no_grad;
  auto* impl = unsafe_get_sharded_impl(self, "gather");
  auto pg = comm::resolve_group(impl->group_name(), "gather");
  const int64_t me = pg->getRank();
  const int64_t world = pg->getSize();
  const c10::Device device = comm::comm_device(*pg);
  const auto dtype = impl->dtype().toScalarType();
  const auto& source = impl->layout();
  std::shared_ptr<const Layout> target;
  std::shared_ptr<const layout::TransferPlan> plan;
  LocalTensors src_local, dst_local;
  comm::Moves moves;
  Values mine{};
  std::exception_ptr error;
  try {
    TORCH_CHECK_INDEX(dst >= 0 && dst < world, "torch_shard.gather: dst ", dst,
                      " is not a rank of a group of size ", world);
    const bool has_out = out.has_value() && out->defined();
    if (me == dst) {
      TORCH_CHECK_VALUE(has_out, "Argument ``dst_tensor`` must be specified on destination rank ", dst);
      TORCH_CHECK_TYPE(!is_sharded_tensor(*out), "torch_shard.gather: `out` must be a dense tensor");
      TORCH_CHECK_VALUE(out->sizes().vec() == impl->global_size(), "Argument ``dst_tensor`` have size ",
                        out->sizes(), ",but should be ", layout::dims_str(impl->global_size()));
      dst_local = LocalTensors{{*out}, {0}};
    } else {
      TORCH_CHECK_VALUE(!has_out, "Argument ``dst_tensor`` must NOT be specified on non-destination ranks.");
    }
    impl->check_local_shards("gather");
    check_owned(*source, world, "gather");
    src_local = LocalTensors{impl->local_shards(), impl->local_shard_indices()};
    target = Layout::whole(impl->global_size(), dst, has_out ? out->device() : device);
    plan = comm::cached_plan(source, target, me, world);
    moves = comm::transfer_moves(*plan, *source, src_local, *target, dst_local, me, device, dtype);
    mine = {dst, layout_and_dtype_fp(*source, dtype), 0, 0};
  } catch (...) {
    error = std::current_exception();
  }
  comm::exchange(*pg, comm::OpKind::kGather, mine, error, comm::ErrorCode::kNone, &moves,
                 [](const std::vector<Values>& all, int64_t me) {
                   if (const int64_t r = first_mismatch(all, me, 0); r >= 0) {
                     TORCH_CHECK_VALUE(false, "dst=", all[me][0], " on rank: ", me,
                                       " does not match with dst=", all[r][0], " on rank: ", r);
                   }
                   if (const int64_t r = first_mismatch(all, me, 1); r >= 0) {
                     TORCH_CHECK_VALUE(false, "torch_shard.gather: the layout on rank: ", me,
                                       " does not match with the layout on rank: ", r,
                                       " (size, dtype, boxes or placements differ)");
                   }
                 });
}

void reshard(const at::Tensor& self, std::optional<int64_t> chunk_dim,
             const std::optional<at::Tensor>& shard_offsets, const std::optional<at::Tensor>& shard_sizes,
             const std::optional<at::Tensor>& placement_index, std::vector<std::string> placements,
             c10::IntArrayRef placement_owners) {
  at::NoGradGuard no_grad;
  auto* impl = unsafe_get_sharded_impl(self, "reshard");
  auto pg = comm::resolve_group(impl->group_name(), "reshard");
  const int64_t me = pg->getRank();
  const int64_t world = pg->getSize();
  const c10::Device device = comm::comm_device(*pg);
  const auto dtype = impl->dtype().toScalarType();
  const auto source = impl->layout();
  std::shared_ptr<const Layout> target;
  std::shared_ptr<const layout::TransferPlan> plan;
  LocalTensors src_local, out;
  comm::Moves moves;
  Values mine{};
  bool unchanged = false;
  std::exception_ptr error;
  try {
    // Upstream keeps resharded metadata in rank order (stable for several shards per rank).
    target = layout_from_args(impl->global_size(), chunk_dim, shard_offsets, shard_sizes, placement_index,
                              placements, placement_owners, world,
                              /*validate=*/true, "reshard")
                 ->sorted_by_owner();
    check_owned(*target, world, "reshard");
    impl->check_local_shards("reshard");
    check_owned(*source, world, "reshard");
    unchanged = target->same_as(*source);
    if (unchanged) {
      moves.send.resize(world);
      moves.recv.resize(world);
    } else {
      src_local = LocalTensors{impl->local_shards(), impl->local_shard_indices()};
      plan = comm::cached_plan(source, target, me, world);
      out = comm::allocate_local(*target, me, dtype);
      moves = comm::transfer_moves(*plan, *source, src_local, *target, out, me, device, dtype);
      moves.fresh_destinations = true; // `out` was just allocated
    }
    mine = {layout_and_dtype_fp(*source, dtype), static_cast<int64_t>(target->fingerprint()), 0, 0};
  } catch (...) {
    error = std::current_exception();
  }
  comm::exchange(*pg, comm::OpKind::kReshard, mine, error, comm::ErrorCode::kNone, &moves,
                 [](const std::vector<Values>& all, int64_t me) {
                   if (const int64_t r = first_mismatch(all, me, 0); r >= 0) {
                     TORCH_CHECK_VALUE(false, "torch_shard.reshard: the layout on rank: ", me,
                                       " does not match with the layout on rank: ", r,
                                       " (size, dtype, boxes or placements differ)");
                   }
                   if (const int64_t r = first_mismatch(all, me, 1); r >= 0) {
                     TORCH_CHECK_VALUE(false, "sharding_spec on rank: ", me,
                                       " does not match with sharding_spec on rank: ", r,
                                       " (the target layouts differ: boxes or placements)");
                   }
                 });
  if (unchanged) {
    return;
  }
  const bool requires_grad = self.requires_grad();
  for (auto& t : out.tensors) {
    t.requires_grad_(requires_grad);
  }
  impl->set_layout(target, std::move(out.tensors), std::move(out.indices));
}

// The agreement of a scatter by a spec whose shard() is not torch_shard's (EnumerableShardingSpec,
// user specs): the same src rank, size, dtype and spec (a fingerprint of it) on every rank, before the
// spec's own shard() runs. Same op kind and values as `shard`, so a rank scattering by a chunk spec
// and a rank with another spec raise together.
void agree_shard(int64_t src, c10::IntArrayRef global_size, c10::ScalarType dtype, int64_t spec_fingerprint,
                 c10::string_view group_name) {
  auto pg = comm::resolve_group(std::string(group_name), "shard");
  std::exception_ptr error;
  try {
    TORCH_CHECK_INDEX(src >= 0 && src < pg->getSize(), "torch_shard.shard: src_rank ", src,
                      " is not a rank of a group of size ", pg->getSize());
  } catch (...) {
    error = std::current_exception();
  }
  comm::Moves moves;
  moves.send.resize(pg->getSize());
  moves.recv.resize(pg->getSize());
  const Values mine{src, size_and_dtype_fp(global_size.vec(), dtype), spec_fingerprint, 0};
  comm::exchange(*pg, comm::OpKind::kShard, mine, error, comm::ErrorCode::kNone, &moves, check_shard);
}

// A rank whose Python-side preparation failed (a bad spec, an unknown placement) still takes part in
// the agreement round of the op its peers are running, so they raise too instead of waiting for it.
// It returns normally on this rank, whatever the others did: the caller then raises its own error.
void abort_op(c10::string_view op, c10::string_view error_class, c10::string_view group_name) {
  static const std::pair<const char*, comm::OpKind> kOps[] = {
      {"shard", comm::OpKind::kShard},
      {"gather", comm::OpKind::kGather},
      {"reshard", comm::OpKind::kReshard},
      {"share_inputs", comm::OpKind::kShareInputs},
      {"init_from_local_shards", comm::OpKind::kInitFromLocalShards},
      {"compare", comm::OpKind::kCompare},
  };
  std::optional<comm::OpKind> kind;
  for (const auto& [name, k] : kOps) {
    if (op == name) {
      kind = k;
    }
  }
  TORCH_CHECK_VALUE(kind.has_value(), "torch_shard._abort: unknown op '", op, "'");
  static const std::pair<const char*, comm::ErrorCode> kClasses[] = {
      {"ValueError", comm::ErrorCode::kValueError},
      {"TypeError", comm::ErrorCode::kTypeError},
      {"IndexError", comm::ErrorCode::kIndexError},
      {"NotImplementedError", comm::ErrorCode::kNotImplementedError},
      {"RuntimeError", comm::ErrorCode::kRuntimeError},
  };
  comm::ErrorCode code = comm::ErrorCode::kOther;
  for (const auto& [name, c] : kClasses) {
    if (error_class == name) {
      code = c;
    }
  }
  struct AbortedHere : std::exception {};
  auto pg = comm::resolve_group(std::string(group_name), "_abort");
  try {
    comm::exchange(*pg, *kind, Values{}, std::make_exception_ptr(AbortedHere{}), code, nullptr,
                   [](const std::vector<Values>&, int64_t) {});
  } catch (const AbortedHere&) {
    // Expected: the exchange rethrows this rank's own failure once every rank knows of it.
  }
}

// NOTE [ Shared inputs ]
// Sharded compute (the embedding ops) needs every rank's input on every rank. _share_inputs is that
// exchange as one agreed data op: each rank's `parts` (1-D tensors, the same count and dtypes on every
// rank, any lengths) form one message, sent to every peer; receivers take the sizes the senders
// declare in the agreement round (see NOTE [ Agreed exchange ]), so inputs of different lengths per
// rank are safe. A message is a header of one int64 byte count per part, then each part padded to 8
// bytes so every part starts aligned for its dtype. `fingerprint` is an op-specific value every rank
// must agree on (the weight's layout), `flags` a small op-specific value that must agree too, and
// `arguments` the scalars with which each rank computes the OTHER ranks' results (the embedding ops:
// mode, padding_idx, max_norm, norm_type). Ranks that differ there would hand back silently different
// results, or run a collective the others do not (max_norm on a column-sharded weight): all raise.
std::vector<at::Tensor> share_inputs(at::TensorList parts, int64_t fingerprint, int64_t flags,
                                     c10::string_view group_name, c10::ArrayRef<double> arguments) {
  auto pg = comm::resolve_group(std::string(group_name), "_share_inputs");
  const int64_t me = pg->getRank();
  const int64_t world = pg->getSize();
  const auto nparts = static_cast<int64_t>(parts.size());
  auto padded = [](int64_t bytes) { return layout::checked_add(bytes, (8 - bytes % 8) % 8, "a part"); };
  std::vector<at::Tensor> flat(parts.size());
  int64_t message_bytes = nparts * 8;
  Fingerprint dtypes;
  dtypes.add(nparts);
  comm::Moves moves;
  Values mine{};
  std::exception_ptr error;
  try {
    for (int64_t k = 0; k < nparts; ++k) {
      TORCH_CHECK_VALUE(parts[k].dim() == 1, "torch_shard._share_inputs: part ", k, " must be 1-D, got ",
                        parts[k].sizes());
      flat[k] = parts[k].contiguous().cpu();
      dtypes.add(static_cast<int64_t>(flat[k].scalar_type()));
      message_bytes = layout::checked_add(message_bytes, padded(flat[k].nbytes()), "a message size");
    }
    moves.send.resize(world);
    moves.recv.resize(world);
    auto pack = [&flat, nparts, padded](const at::Tensor& into) {
      at::Tensor counts = into.narrow(0, 0, nparts * 8).view(at::kLong);
      int64_t pos = nparts * 8;
      for (int64_t k = 0; k < nparts; ++k) {
        const int64_t bytes = flat[k].nbytes();
        counts[k].fill_(bytes);
        into.narrow(0, pos, bytes).copy_(flat[k].view(at::kByte));
        pos += padded(bytes);
      }
    };
    for (int64_t p = 0; p < world; ++p) {
      if (p != me) {
        moves.send[p].bytes = message_bytes;
        moves.send[p].pack = pack;
        moves.recv[p].bytes = comm::kDeclared;
      }
    }
    Fingerprint scalars;
    scalars.add(static_cast<int64_t>(arguments.size()));
    for (double value : arguments) {
      // Bit patterns, with the two zeros and every NaN made one value each.
      const double canonical = value == 0.0 ? 0.0 : (std::isnan(value) ? std::nan("") : value);
      int64_t bits = 0;
      std::memcpy(&bits, &canonical, sizeof(bits));
      scalars.add(bits);
    }
    mine = {fingerprint, dtypes.as_int64(), flags, scalars.as_int64()};
  } catch (...) {
    error = std::current_exception();
  }
  std::vector<at::Tensor> received(world);
  if (!error) {
    for (int64_t p = 0; p < world; ++p) {
      if (p != me) {
        moves.recv[p].unpack = [&received, p](const at::Tensor& from) { received[p] = from.clone(); };
      }
    }
  }
  comm::exchange(*pg, comm::OpKind::kShareInputs, mine, error, comm::ErrorCode::kNone, &moves,
                 [](const std::vector<Values>& all, int64_t me) {
                   if (const int64_t r = first_mismatch(all, me, 0); r >= 0) {
                     TORCH_CHECK_VALUE(false, "torch_shard: the sharded weight on rank ", me,
                                       " does not match with the sharded weight on rank ", r,
                                       " (different layouts)");
                   }
                   if (const int64_t r = first_mismatch(all, me, 2); r >= 0) {
                     TORCH_CHECK_VALUE(false, "torch_shard: the arguments on rank ", me,
                                       " do not match with the arguments on rank ", r,
                                       " (e.g. per_sample_weights given on some ranks only)");
                   }
                   if (const int64_t r = first_mismatch(all, me, 3); r >= 0) {
                     TORCH_CHECK_VALUE(false, "torch_shard: the arguments on rank ", me,
                                       " do not match with the arguments on rank ", r,
                                       " (mode, padding_idx, max_norm or norm_type: each rank computes the "
                                       "other ranks' lookups with its own, so they must be the same on "
                                       "every rank)");
                   }
                   if (const int64_t r = first_mismatch(all, me, 1); r >= 0) {
                     TORCH_CHECK_VALUE(false, "torch_shard: the inputs on rank ", me,
                                       " do not match with the inputs on rank ", r,
                                       " (different numbers of tensors or dtypes)");
                   }
                 });
  // Every rank's parts, rank-major: out[r * nparts + k] is part k of rank r.
  std::vector<at::Tensor> out;
  out.reserve(world * nparts);
  const auto device = nparts ? parts[0].device() : c10::Device(c10::kCPU);
  for (int64_t r = 0; r < world; ++r) {
    if (r == me) {
      for (int64_t k = 0; k < nparts; ++k) {
        out.push_back(parts[k].reshape({-1}));
      }
      continue;
    }
    const at::Tensor& message = received[r];
    TORCH_CHECK(message.numel() >= nparts * 8, "torch_shard._share_inputs: short message from rank ", r);
    const at::Tensor counts = message.narrow(0, 0, nparts * 8).view(at::kLong);
    const int64_t* c = counts.const_data_ptr<int64_t>();
    int64_t pos = nparts * 8;
    for (int64_t k = 0; k < nparts; ++k) {
      const int64_t bytes = c[k];
      const auto dtype = flat[k].scalar_type();
      const auto itemsize = static_cast<int64_t>(c10::elementSize(dtype));
      TORCH_CHECK(bytes >= 0 && bytes % itemsize == 0 && pos + bytes <= message.numel(),
                  "torch_shard._share_inputs: malformed message from rank ", r);
      out.push_back(message.narrow(0, pos, bytes).view(dtype).to(device));
      pos += padded(bytes);
    }
  }
  return out;
}

// Every rank's `value`, in rank order (one agreement round, op kind "compare"; a rank that failed
// locally takes part through _abort("compare", ...)).
std::vector<int64_t> gather_values(int64_t value, c10::string_view group_name) {
  auto pg = comm::resolve_group(std::string(group_name), "_gather_values");
  comm::Moves moves;
  moves.send.resize(pg->getSize());
  moves.recv.resize(pg->getSize());
  std::vector<int64_t> out;
  comm::exchange(*pg, comm::OpKind::kCompare, Values{value, 0, 0, 0}, nullptr, comm::ErrorCode::kNone, &moves,
                 [&out](const std::vector<Values>& values, int64_t) {
                   out.clear();
                   for (const auto& v : values) {
                     out.push_back(v[0]);
                   }
                 });
  return out;
}

// True on every rank iff `value` is true on every rank (one agreement round).
bool all_ranks_true(bool value, c10::string_view group_name) {
  auto pg = comm::resolve_group(std::string(group_name), "_all_ranks_true");
  comm::Moves moves;
  moves.send.resize(pg->getSize());
  moves.recv.resize(pg->getSize());
  bool all = true;
  comm::exchange(*pg, comm::OpKind::kCompare, Values{value ? 1 : 0, 0, 0, 0}, nullptr, comm::ErrorCode::kNone,
                 &moves, [&all](const std::vector<Values>& values, int64_t) {
                   all = true;
                   for (const auto& v : values) {
                     all = all && v[0] != 0;
                   }
                 });
  return all;
}

std::vector<int64_t> get_comm_stats(bool reset) {
  auto& s = comm::comm_stats();
  std::vector<int64_t> out{s.bytes_sent_to_peers.load(), s.bytes_received_from_peers.load(),
                           s.collectives.load(),         s.plan_cache_hits.load(),
                           s.plan_cache_misses.load(),   s.single_round_ops.load()};
  if (reset) {
    s.bytes_sent_to_peers = 0;
    s.bytes_received_from_peers = 0;
    s.collectives = 0;
    s.plan_cache_hits = 0;
    s.plan_cache_misses = 0;
    s.single_round_ops = 0;
  }
  return out;
}

void clear_plan_cache() {
  comm::clear_plan_cache();
}

// Unchecked all-to-all of a flat tensor: rank p receives send_counts[p] elements from this rank and
// recv_counts[p] must equal what rank p sends here. Internal (underscore): callers derive the counts
// from data every rank already agreed on (the sharded embedding ops); mismatched counts abort gloo.
at::Tensor all_to_all(const at::Tensor& input, c10::IntArrayRef send_counts, c10::IntArrayRef recv_counts,
                      c10::string_view group_name) {
  auto pg = comm::resolve_group(std::string(group_name), "_all_to_all");
  const int64_t world = pg->getSize();
  const int64_t me = pg->getRank();
  TORCH_CHECK_VALUE(static_cast<int64_t>(send_counts.size()) == world &&
                        static_cast<int64_t>(recv_counts.size()) == world,
                    "torch_shard._all_to_all: expected ", world, " send and receive counts, got ",
                    send_counts.size(), " and ", recv_counts.size());
  int64_t send_total = 0, recv_total = 0;
  for (int64_t p = 0; p < world; ++p) {
    TORCH_CHECK_VALUE(send_counts[p] >= 0 && recv_counts[p] >= 0, "torch_shard._all_to_all: negative count");
    send_total = layout::checked_add(send_total, send_counts[p], "torch_shard._all_to_all: send total");
    recv_total = layout::checked_add(recv_total, recv_counts[p], "torch_shard._all_to_all: receive total");
  }
  TORCH_CHECK_VALUE(input.dim() == 1 && input.numel() == send_total, "torch_shard._all_to_all: input has ",
                    input.numel(), " elements in ", input.dim(), " dims; expected a 1-D tensor of ",
                    send_total);
  at::Tensor send = input.contiguous();
  at::Tensor recv = at::empty({recv_total}, send.options());
  const int64_t itemsize = static_cast<int64_t>(send.element_size());
  std::vector<int64_t> send_bytes(world), recv_bytes(world);
  for (int64_t p = 0; p < world; ++p) {
    send_bytes[p] = layout::checked_mul(send_counts[p], itemsize, "torch_shard._all_to_all: bytes");
    recv_bytes[p] = layout::checked_mul(recv_counts[p], itemsize, "torch_shard._all_to_all: bytes");
  }
  at::Tensor send_view = send.view(at::kByte);
  at::Tensor recv_view = recv.view(at::kByte);
  comm::all_to_all_bytes(*pg, recv_view, send_view, recv_bytes, send_bytes);
  auto& stats = comm::comm_stats();
  stats.bytes_sent_to_peers += (send_total - send_counts[me]) * itemsize;
  stats.bytes_received_from_peers += (recv_total - recv_counts[me]) * itemsize;
  return recv;
}

} // namespace

TORCH_LIBRARY_IMPL(torch_shard, CompositeImplicitAutograd, m) {
  m.impl("shard", TORCH_FN(shard));
  m.impl("gather", TORCH_FN(gather));
  m.impl("reshard", TORCH_FN(reshard));
  m.impl("_abort", TORCH_FN(abort_op));
  m.impl("_agree_shard", TORCH_FN(agree_shard));
  m.impl("_comm_stats", TORCH_FN(get_comm_stats));
  m.impl("_clear_plan_cache", TORCH_FN(clear_plan_cache));
  m.impl("_all_to_all", TORCH_FN(all_to_all));
  m.impl("_share_inputs", TORCH_FN(share_inputs));
  m.impl("_all_ranks_true", TORCH_FN(all_ranks_true));
  m.impl("_gather_values", TORCH_FN(gather_values));
}

} // namespace torch_shard
