// The public data ops: shard (scatter), gather, reshard. Each is ONE call that runs, in order:
//   local checks -> agreement (error codes and fingerprints, computed here) -> plan (cached) -> move,
// so a direct torch.ops.torch_shard.* call is as safe as the Python methods: bad or mismatched
// arguments raise on every rank, and nothing is written unless every rank agreed. See
// NOTE [ Agreed exchange ] (comm/exchange.cpp) for the rounds and NOTE [ Plan cache ]
// (comm/transfer.cpp) for planning.
// Every op here that communicates raises first under FakeTensorMode / make_fx: see NOTE [ Ops that
// cannot be traced ] (ops/untraceable.h).

#include <cmath>
#include <cstring>
#include <sstream>

#include <ATen/core/grad_mode.h>

#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>
#include <torch/library.h>

#include "comm/exchange.h"
#include "comm/process_group.h"
#include "comm/transfer.h"
#include "layout/layout.h"
#include "ops/layout_args.h"
#include "ops/lookup_parts.h"
#include "ops/untraceable.h"
#include "sharded_tensor_impl.h"

namespace torch_shard {
namespace {

using comm::LocalTensors;
using comm::Values;
using layout::Fingerprint;
using layout::Layout;

constexpr const char* kCommunicates = "communicates over its process group";

// What every rank must agree on about a tensor besides its layout.
int64_t size_and_dtype_fp(const layout::Dims& size, c10::ScalarType dtype) {
  return Fingerprint().add(size).add(static_cast<int64_t>(dtype)).as_int64();
}

comm::Agreement agreement(comm::OpKind op, const Values& values, std::exception_ptr error,
                          comm::Check check) {
  comm::Agreement a;
  a.op = op;
  a.values = values;
  a.error = std::move(error);
  a.check = std::move(check);
  return a;
}

// Where this rank's shards live, if it holds any (the communication device follows them on CUDA).
std::optional<c10::Device> shards_device(const ShardedTensorImpl& impl) {
  if (impl.local_shards().empty() || !impl.local_shards().front().defined()) {
    return std::nullopt;
  }
  return impl.local_shards().front().device();
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
  check_not_tracing("shard", kCommunicates);
  // The kernel writes shards and `out` in place; a direct call with tensors that require grad must not
  // record it.
  at::NoGradGuard no_grad;
  const std::string group(group_name);
  auto pg = comm::resolve_group(group, "shard");
  const int64_t me = pg->getRank();
  const int64_t world = pg->getSize();
  // Follows the tensors this rank moves (the source, on the source rank; its new shards).
  c10::Device device = comm::comm_device(*pg, me == src && tensor.has_value() && tensor->defined()
                                                  ? std::optional<c10::Device>(tensor->device())
                                                  : std::nullopt);
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
    if (const auto mine = target->shards_of(me); !device.is_cuda() || (me != src && !mine.empty())) {
      const auto placed =
          mine.empty() ? std::nullopt : std::optional<c10::Device>(target->placement(mine.front()).device);
      if (placed.has_value() && placed->is_cuda()) {
        device = comm::comm_device(*pg, placed);
      }
    }
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
    mine = {src, size_and_dtype_fp(global_size.vec(), dtype), static_cast<int64_t>(target->fingerprint()), 0};
  } catch (...) {
    error = std::current_exception();
  }
  comm::exchange(*pg, device, agreement(comm::OpKind::kShard, mine, error, check_shard), &moves);
  for (auto& t : out.tensors) {
    t.requires_grad_(requires_grad);
  }
  return make_sharded_tensor(target, std::move(out.tensors), std::move(out.indices), dtype, device,
                             /*pin_memory=*/false, group, me);
}

void gather(const at::Tensor& self, int64_t dst, const std::optional<at::Tensor>& out) {
  check_not_tracing("gather", kCommunicates);
  at::NoGradGuard no_grad;
  auto* impl = unsafe_get_sharded_impl(self, "gather");
  auto pg = comm::resolve_group(impl->group_name(), "gather");
  const int64_t me = pg->getRank();
  const int64_t world = pg->getSize();
  const c10::Device device = comm::comm_device(*pg, shards_device(*impl));
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
  comm::exchange(*pg, device,
                 agreement(comm::OpKind::kGather, mine, error,
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
                           }),
                 &moves);
}

void reshard(const at::Tensor& self, std::optional<int64_t> chunk_dim,
             const std::optional<at::Tensor>& shard_offsets, const std::optional<at::Tensor>& shard_sizes,
             const std::optional<at::Tensor>& placement_index, std::vector<std::string> placements,
             c10::IntArrayRef placement_owners) {
  check_not_tracing("reshard", kCommunicates);
  at::NoGradGuard no_grad;
  auto* impl = unsafe_get_sharded_impl(self, "reshard");
  auto pg = comm::resolve_group(impl->group_name(), "reshard");
  const int64_t me = pg->getRank();
  const int64_t world = pg->getSize();
  const c10::Device device = comm::comm_device(*pg, shards_device(*impl));
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
    // Same boxes, owners and device types, and this rank's shards already where the target puts them:
    // no data moves (the placements may still be written differently, e.g. "cpu" and "cpu:0").
    unchanged = target->same_as(*source);
    for (size_t k = 0; unchanged && k < impl->local_shards().size(); ++k) {
      const auto idx = static_cast<size_t>(impl->local_shard_indices()[k]);
      unchanged =
          layout::on_placement_device(impl->local_shards()[k].device(), target->placement(idx).device);
    }
    if (unchanged) {
      moves.send.resize(world);
      moves.recv.resize(world);
    } else {
      src_local = LocalTensors{impl->local_shards(), impl->local_shard_indices()};
      plan = comm::cached_plan(source, target, me, world);
      // A pinned tensor stays pinned (is_pinned() and the metadata keep telling the truth).
      out = comm::allocate_local(*target, me, dtype, impl->pin_memory());
      moves = comm::transfer_moves(*plan, *source, src_local, *target, out, me, device, dtype);
    }
    mine = {layout_and_dtype_fp(*source, dtype), static_cast<int64_t>(target->fingerprint()), 0, 0};
  } catch (...) {
    error = std::current_exception();
  }
  comm::exchange(*pg, device,
                 agreement(comm::OpKind::kReshard, mine, error,
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
                           }),
                 &moves);
  if (unchanged) {
    if (target.get() != source.get()) {
      // Keep the placements as this call wrote them (the layouts agree on everything else).
      impl->set_layout(target, impl->local_shards(), impl->local_shard_indices());
    }
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
  check_not_tracing("_agree_shard", kCommunicates);
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
  comm::exchange(*pg, comm::comm_device(*pg), agreement(comm::OpKind::kShard, mine, error, check_shard),
                 &moves);
}

// A rank whose Python-side preparation failed (a bad spec, an unknown placement) still takes part in
// the agreement round of the op its peers are running, so they raise too instead of waiting for it.
// It returns normally on this rank, whatever the others did: the caller then raises its own error.
void abort_op(c10::string_view op, c10::string_view error_class, c10::string_view group_name,
              c10::string_view message) {
  check_not_tracing("_abort", kCommunicates);
  const std::optional<comm::OpKind> kind = comm::op_from_name(std::string(op));
  TORCH_CHECK_VALUE(kind.has_value(), "torch_shard._abort: unknown op '", op, "'");
  // The class's code in the one table (comm::error_class_names); any other class reports kOther.
  comm::ErrorCode code = comm::ErrorCode::kOther;
  const auto names = comm::error_class_names();
  for (size_t k = 0; k < names.size(); ++k) {
    if (error_class == names[k] && static_cast<comm::ErrorCode>(k + 1) != comm::ErrorCode::kLost) {
      code = static_cast<comm::ErrorCode>(k + 1);
      break;
    }
  }
  struct AbortedHere : std::exception {};
  auto pg = comm::resolve_group(std::string(group_name), "_abort");
  comm::Agreement failed = agreement(*kind, Values{}, std::make_exception_ptr(AbortedHere{}),
                                     [](const std::vector<Values>&, int64_t) {});
  failed.error_code = code;
  // What the other ranks are told (NOTE [ Reasons travel ]): the Python exception in words.
  failed.reason = message.empty() ? std::string(error_class) : std::string(message);
  try {
    comm::exchange(*pg, comm::comm_device(*pg), failed, nullptr);
  } catch (const AbortedHere&) {
    // Expected: the exchange rethrows this rank's own failure once every rank knows of it.
  }
}

} // namespace

// Also called from the one-call lookups (ops/lookup_parts.h).
namespace ops {

// NOTE [ Shared inputs ]
// Sharded compute (the embedding ops, init_from_local_shards) needs every rank's input on every rank.
// _share_inputs is that exchange as one agreed data op: each rank's `parts` (1-D tensors, the same
// count (at most comm::kNotes) and dtypes on every rank, any lengths) form one message, sent to every
// peer: the parts one after the other, each padded to 8 bytes so every part starts aligned for its
// dtype. The byte count of each part travels in the agreement round (Agreement::notes) and receivers
// take the message sizes the senders declare there (NOTE [ Agreed exchange ]), so inputs of different
// lengths per rank are safe and nothing is read back from the message itself: on CUDA the parts go
// from the caller's device to the communication device and back by device copies, and the host reads
// device memory once per call, in the exchange (NOTE [ One host read per exchange ]).
// `fingerprint` is an op-specific value every rank must agree on (the weight's layout), `flags` a
// small op-specific value that must agree too, and `arguments` the scalars with which each rank
// computes the OTHER ranks' results (the embedding ops: mode, padding_idx, max_norm, norm_type). Ranks
// that differ there would hand back silently different results, or run a collective the others do not
// (max_norm on a column-sharded weight): all raise.
// `status` and `words` (the .with_words overload) are the op's device-side values (Agreement::status /
// words): the validity of this rank's input checked on its device, and a word for each peer (the
// embedding ops: how many of this rank's ids each peer owns). They come back as host values: [this
// rank's status, the word each rank sent here (W), this rank's words (W)]; when this rank's status is
// not 0 there are no parts (every other rank raises naming this one, and the caller raises its own,
// detailed error).
std::tuple<std::vector<at::Tensor>, std::vector<int64_t>>
share_inputs_agreed(at::TensorList parts, int64_t fingerprint, int64_t flags, c10::string_view group_name,
                    c10::ArrayRef<double> arguments, const std::optional<at::Tensor>& status,
                    const std::optional<at::Tensor>& words) {
  check_not_tracing("_share_inputs", kCommunicates);
  auto pg = comm::resolve_group(std::string(group_name), "_share_inputs");
  const int64_t me = pg->getRank();
  const int64_t world = pg->getSize();
  const auto nparts = static_cast<int64_t>(parts.size());
  const auto out_device = nparts ? parts[0].device() : c10::Device(c10::kCPU);
  const c10::Device device = comm::comm_device(*pg, out_device);
  auto padded = [](int64_t bytes) { return layout::checked_add(bytes, (8 - bytes % 8) % 8, "a part"); };
  std::vector<at::Tensor> flat(parts.size());
  std::vector<c10::ScalarType> dtypes(parts.size());
  comm::Notes notes{};
  int64_t message_bytes = 0;
  Fingerprint dtype_fp;
  dtype_fp.add(nparts);
  comm::Moves moves;
  Values mine{};
  std::exception_ptr error;
  try {
    TORCH_CHECK_VALUE(nparts <= comm::kNotes, "torch_shard._share_inputs: at most ", comm::kNotes,
                      " parts, got ", nparts);
    for (int64_t k = 0; k < nparts; ++k) {
      TORCH_CHECK_VALUE(parts[k].dim() == 1, "torch_shard._share_inputs: part ", k, " must be 1-D, got ",
                        parts[k].sizes());
      TORCH_CHECK_VALUE(parts[k].device() == out_device, "torch_shard._share_inputs: part ", k, " is on ",
                        parts[k].device(), ", part 0 on ", out_device, "; give every part on one device");
      flat[k] = parts[k].contiguous();
      dtypes[k] = flat[k].scalar_type();
      dtype_fp.add(static_cast<int64_t>(dtypes[k]));
      notes[k] = static_cast<int64_t>(flat[k].nbytes());
      message_bytes = layout::checked_add(message_bytes, padded(notes[k]), "a message size");
    }
    if (status.has_value() && status->defined()) {
      TORCH_CHECK_VALUE(status->numel() == 1 && status->scalar_type() == at::kLong,
                        "torch_shard._share_inputs: status must be one int64 value, got ", status->sizes(),
                        " ", status->scalar_type());
    }
    if (words.has_value() && words->defined()) {
      TORCH_CHECK_VALUE(words->dim() == 1 && words->numel() == world && words->scalar_type() == at::kLong,
                        "torch_shard._share_inputs: words must be int64 with one value per rank (", world,
                        "), got ", words->sizes(), " ", words->scalar_type());
    }
    moves.send.resize(world);
    moves.recv.resize(world);
    auto pack = [&flat, &notes, nparts, padded](const at::Tensor& into) {
      int64_t pos = 0;
      for (int64_t k = 0; k < nparts; ++k) {
        into.narrow(0, pos, notes[k]).copy_(flat[k].view(at::kByte)); // a device copy where they differ
        pos += padded(notes[k]);
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
    mine = {fingerprint, dtype_fp.as_int64(), flags, scalars.as_int64()};
  } catch (...) {
    error = std::current_exception();
  }
  std::vector<at::Tensor> received(world);
  if (!error) {
    for (int64_t p = 0; p < world; ++p) {
      if (p != me) {
        // The round's buffer is reused by the next exchange: keep a copy (on the communication device).
        moves.recv[p].unpack = [&received, p](const at::Tensor& from) { received[p] = from.clone(); };
      }
    }
  }
  comm::Agreement agreed =
      agreement(comm::OpKind::kShareInputs, mine, error, [](const std::vector<Values>& all, int64_t me) {
        if (const int64_t r = first_mismatch(all, me, 0); r >= 0) {
          TORCH_CHECK_VALUE(false, "torch_shard: the sharded weight on rank ", me,
                            " does not match with the sharded weight on rank ", r, " (different layouts)");
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
  agreed.notes = notes;
  int64_t own_status = 0;
  if (!error && status.has_value() && status->defined()) {
    struct OwnStatus : std::exception {};
    agreed.status = *status;
    agreed.raise_status = [&own_status](comm::ErrorCode code) {
      own_status = static_cast<int64_t>(code);
      throw OwnStatus{};
    };
  }
  if (!error && words.has_value() && words->defined()) {
    agreed.words = *words;
  }
  comm::Outcome outcome;
  try {
    outcome = comm::exchange(*pg, device, agreed, &moves);
  } catch (const std::exception&) {
    if (own_status == 0) {
      throw;
    }
    // This rank's input failed its device-side check: its caller names the error.
    std::vector<int64_t> info(1 + 2 * world, 0);
    info[0] = own_status;
    return {std::vector<at::Tensor>{}, std::move(info)};
  }
  // Every rank's parts, rank-major: out[r * nparts + k] is part k of rank r.
  std::vector<at::Tensor> out;
  out.reserve(world * nparts);
  for (int64_t r = 0; r < world; ++r) {
    if (r == me) {
      for (int64_t k = 0; k < nparts; ++k) {
        out.push_back(parts[k].reshape({-1}));
      }
      continue;
    }
    // The sizes come from another process: check them against what it declared before using them.
    int64_t total = 0;
    for (int64_t k = 0; k < nparts; ++k) {
      const int64_t bytes = outcome.notes[r][k];
      TORCH_CHECK(bytes >= 0 && bytes % static_cast<int64_t>(c10::elementSize(dtypes[k])) == 0,
                  "torch_shard._share_inputs: malformed message from rank ", r);
      total = layout::checked_add(total, padded(bytes), "a message size");
    }
    TORCH_CHECK(total == outcome.declared[r], "torch_shard._share_inputs: malformed message from rank ", r);
    const at::Tensor message = received[r].defined()
                                   ? received[r]
                                   : at::empty({0}, at::TensorOptions().dtype(at::kByte).device(device));
    int64_t pos = 0;
    for (int64_t k = 0; k < nparts; ++k) {
      const int64_t bytes = outcome.notes[r][k];
      out.push_back(message.narrow(0, pos, bytes).view(dtypes[k]).to(out_device));
      pos += padded(bytes);
    }
  }
  std::vector<int64_t> info(1 + 2 * world, 0);
  for (int64_t p = 0; p < world; ++p) {
    info[1 + p] = outcome.words_in[p];
    info[1 + world + p] = outcome.words_out.empty() ? 0 : outcome.words_out[p];
  }
  return {std::move(out), std::move(info)};
}

} // namespace ops

namespace {

std::vector<at::Tensor> share_inputs(at::TensorList parts, int64_t fingerprint, int64_t flags,
                                     c10::string_view group_name, c10::ArrayRef<double> arguments) {
  return std::get<0>(
      ops::share_inputs_agreed(parts, fingerprint, flags, group_name, arguments, std::nullopt, std::nullopt));
}

// Every rank's `value`, in rank order (one agreement round, op kind "compare"; a rank that failed
// locally takes part through _abort("compare", ...)).
std::vector<int64_t> gather_values(int64_t value, c10::string_view group_name) {
  check_not_tracing("_gather_values", kCommunicates);
  auto pg = comm::resolve_group(std::string(group_name), "_gather_values");
  comm::Moves moves;
  moves.send.resize(pg->getSize());
  moves.recv.resize(pg->getSize());
  std::vector<int64_t> out;
  comm::exchange(*pg, comm::comm_device(*pg),
                 agreement(comm::OpKind::kCompare, Values{value, 0, 0, 0}, nullptr,
                           [&out](const std::vector<Values>& values, int64_t) {
                             out.clear();
                             for (const auto& v : values) {
                               out.push_back(v[0]);
                             }
                           }),
                 &moves);
  return out;
}

// True on every rank iff `value` is true on every rank (one agreement round).
bool all_ranks_true(bool value, c10::string_view group_name) {
  check_not_tracing("_all_ranks_true", kCommunicates);
  auto pg = comm::resolve_group(std::string(group_name), "_all_ranks_true");
  comm::Moves moves;
  moves.send.resize(pg->getSize());
  moves.recv.resize(pg->getSize());
  bool all = true;
  comm::exchange(*pg, comm::comm_device(*pg),
                 agreement(comm::OpKind::kCompare, Values{value ? 1 : 0, 0, 0, 0}, nullptr,
                           [&all](const std::vector<Values>& values, int64_t) {
                             all = true;
                             for (const auto& v : values) {
                               all = all && v[0] != 0;
                             }
                           }),
                 &moves);
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

// NOTE [ Why not torch's functional collectives ]
// torch.distributed._functional_collectives has an all-to-all with autograd
// (all_to_all_single_autograd) and an all-reduce, and they can be traced. _all_to_all and
// _sum_over_ranks stay because the functional collectives do not serve here:
//   * they run the collective on whatever device the input is on. A group with a backend per device
//     type ("cpu:gloo,cuda:nccl") then sends CPU inputs to gloo and CUDA inputs to NCCL, and ranks
//     whose shards sit on different devices (allowed: placements are per shard) would call different
//     backends and hang; an NCCL-only group cannot take CPU inputs at all. These ops stage through
//     the group's communication device (NOTE [ Communication device ]), the same on every rank, as
//     every other torch_shard data op does;
//   * they would not count in comm_stats (bytes to and from peers, rounds), from which
//     bench/bench_embedding.py reports the bytes each rank sends, as for the other data ops;
//   * tracing is what the functional collectives would add, and the sharded ops that call these two
//     cannot be traced anyway: their ShardedTensor argument is no tensor dynamo can trace, so dynamo
//     breaks the graph at the sharded op and runs it eagerly (docs/torch_compile.md).
// Like the other data ops they raise under FakeTensorMode (NOTE [ Ops that cannot be traced ]).

} // namespace

namespace ops {

// Unchecked all-to-all of a flat tensor: rank p receives send_counts[p] elements from this rank and
// recv_counts[p] must equal what rank p sends here. Internal (underscore): callers derive the counts
// from data every rank already agreed on (the sharded embedding ops); mismatched counts abort gloo.
// Staged through the communication device: see NOTE [ Why not torch's functional collectives ].
at::Tensor all_to_all_counts(const at::Tensor& input, c10::IntArrayRef send_counts,
                             c10::IntArrayRef recv_counts, c10::string_view group_name) {
  check_not_tracing("_all_to_all", kCommunicates);
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
  // Staged through the communication device (NOTE [ Communication device ]): CPU tensors on an NCCL
  // group go to the GPU and back.
  const c10::Device device = comm::comm_device(*pg, input.device());
  at::Tensor send = input.contiguous().to(device);
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
  return recv.to(input.device());
}

} // namespace ops

namespace {

// Unchecked elementwise sum of `input` over the ranks of the group, staged through the communication
// device like _all_to_all. Internal (underscore): every rank must pass a tensor of the same shape and
// dtype, which callers derive from data every rank already agreed on (the max_norm renormalisation of a
// column-sharded weight sums each looked-up row's partial norms: the rows come from the inputs every
// rank received in the same _share_inputs, and the agreement checked that every rank renormalises).
at::Tensor sum_over_ranks(const at::Tensor& input, c10::string_view group_name) {
  check_not_tracing("_sum_over_ranks", kCommunicates);
  auto pg = comm::resolve_group(std::string(group_name), "_sum_over_ranks");
  const c10::Device device = comm::comm_device(*pg, input.device());
  at::Tensor buffer = input.contiguous().to(device, /*non_blocking=*/false, /*copy=*/true);
  std::vector<at::Tensor> tensors{buffer};
  c10d::AllreduceOptions options;
  options.reduceOp = c10d::ReduceOp::SUM;
  pg->allreduce(tensors, options)->wait();
  comm::comm_stats().collectives += 1;
  return buffer.to(input.device());
}

std::vector<std::string> error_classes() {
  return comm::error_class_names();
}

} // namespace

TORCH_LIBRARY_IMPL(torch_shard, CompositeImplicitAutograd, m) {
  m.impl("shard", TORCH_FN(shard));
  m.impl("gather", TORCH_FN(gather));
  m.impl("reshard", TORCH_FN(reshard));
  m.impl("_abort", TORCH_FN(abort_op));
  m.impl("_agree_shard", TORCH_FN(agree_shard));
  m.impl("_comm_stats", TORCH_FN(get_comm_stats));
  m.impl("_error_classes", TORCH_FN(error_classes));
  m.impl("_share_inputs", TORCH_FN(share_inputs));
  m.impl("_share_inputs.with_words", TORCH_FN(ops::share_inputs_agreed));
  m.impl("_all_ranks_true", TORCH_FN(all_ranks_true));
  m.impl("_gather_values", TORCH_FN(gather_values));
}

// The two collectives take and return plain tensors only, so they need not run before the Python key:
// they are registered per backend like any kernel. Their autograd (the reverse all-to-all; the sum of
// the gradients over the ranks) and their fake kernels, which raise the error of NOTE [ Ops that cannot
// be traced ], are in torch_shard/_op_registrations.py.
TORCH_LIBRARY_IMPL(torch_shard, CPU, m) {
  m.impl("_all_to_all", TORCH_FN(ops::all_to_all_counts));
  m.impl("_sum_over_ranks", TORCH_FN(sum_over_ranks));
}

TORCH_LIBRARY_IMPL(torch_shard, CUDA, m) {
  m.impl("_all_to_all", TORCH_FN(ops::all_to_all_counts));
  m.impl("_sum_over_ranks", TORCH_FN(sum_over_ranks));
}

} // namespace torch_shard
