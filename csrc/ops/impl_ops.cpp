// Kernels that build a ShardedTensorImpl, read it back, and write its local shards (the one setter).
//
// Registered as CompositeImplicitAutograd (ops/registration.cpp) so they run at the Autograd key, before
// the Python key a wrapped ShardedTensor carries: reading the shards never bounces through
// __torch_dispatch__.
// They cannot be traced (NOTE [ Ops that cannot be traced ] in ops/untraceable.h): each raises first
// under FakeTensorMode / make_fx. Two exceptions: is_sharded only asks what kind of impl a tensor has,
// which has an answer for fake tensors too (they are never sharded), and _local_shard_mismatch reads
// only its plain tensors' metadata (sizes, device, dtype, flags), which fake tensors have.

#include "ops/impl_ops.h"

#include <unordered_map>

#include <ATen/ops/empty.h>

#include "comm/process_group.h"
#include "layout/box.h"
#include "ops/layout_args.h"
#include "ops/untraceable.h"
#include "sharded_tensor_impl.h"

namespace torch_shard {
namespace {

constexpr const char* kReadsImpl = "builds, reads or writes a ShardedTensor's C++ impl";

// The impl behind `self`, after checking that nothing is being traced.
ShardedTensorImpl* impl_of(const at::Tensor& self, const char* op) {
  check_not_tracing(op, kReadsImpl);
  return unsafe_get_sharded_impl(self, op);
}

} // namespace

namespace ops {

at::Tensor make_sharded(at::TensorList local_shards, c10::IntArrayRef local_shard_indices,
                        c10::IntArrayRef global_size, std::optional<int64_t> chunk_dim,
                        const std::optional<at::Tensor>& shard_offsets,
                        const std::optional<at::Tensor>& shard_sizes,
                        const std::optional<at::Tensor>& placement_index, std::vector<std::string> placements,
                        c10::IntArrayRef placement_owners, c10::ScalarType dtype,
                        std::optional<c10::Device> device, bool pin_memory, c10::string_view group_name,
                        int64_t rank, int64_t world, bool validate) {
  check_not_tracing("_make_sharded", kReadsImpl);
  TORCH_CHECK_VALUE(group_name.empty() || (world > 0 && rank >= 0 && rank < world),
                    "torch_shard._make_sharded: rank ", rank, " is not a rank of a group of size ", world);
  // A named group must exist now (ValueError otherwise), and be the group the rank and size describe:
  // every later data op resolves it by this name.
  c10::intrusive_ptr<c10d::ProcessGroup> pg;
  if (!group_name.empty()) {
    pg = comm::resolve_group(std::string(group_name), "_make_sharded");
    TORCH_CHECK_VALUE(pg->getRank() == rank && pg->getSize() == world, "torch_shard._make_sharded: rank ",
                      rank, " of a group of size ", world, " does not match process group '", group_name,
                      "', where this process is rank ", pg->getRank(), " of ", pg->getSize());
  }
  auto layout =
      layout_from_args(global_size, chunk_dim, shard_offsets, shard_sizes, placement_index, placements,
                       placement_owners, group_name.empty() ? -1 : world, validate, "_make_sharded");
  // A rank without local shards still has a device: the group's communication device.
  if (!device.has_value() && local_shards.empty() && !group_name.empty()) {
    device = comm::comm_device(*pg);
  }
  return make_sharded_tensor(std::move(layout), local_shards.vec(), local_shard_indices.vec(), dtype, device,
                             pin_memory, std::string(group_name), rank);
}

bool is_sharded(const at::Tensor& self) {
  return is_sharded_tensor(self);
}

std::vector<at::Tensor> local_shards(const at::Tensor& self) {
  return impl_of(self, "_local_shards")->local_shards();
}

std::vector<int64_t> local_shard_indices(const at::Tensor& self) {
  return impl_of(self, "_local_shard_indices")->local_shard_indices();
}

int64_t version(const at::Tensor& self) {
  return impl_of(self, "_version")->version();
}

// Everything Python caches about a ShardedTensor, in one call: its version stamp, local shards and
// their indices in the layout, pin_memory, the layout's serial (which changes only when the layout
// does, so Python knows whether the spec it keeps still describes the tensor) and its fingerprint (what
// ranks agree on, NOTE [ What ranks agree on about a placement ]).
std::tuple<int64_t, std::vector<at::Tensor>, std::vector<int64_t>, bool, int64_t, int64_t>
state(const at::Tensor& self) {
  const auto* impl = impl_of(self, "_state");
  return {impl->version(),    impl->local_shards(),     impl->local_shard_indices(),
          impl->pin_memory(), impl->layout()->serial(), static_cast<int64_t>(impl->layout()->fingerprint())};
}

// The layout in the schema's argument-group form (see ops/layout_args.h), plus the chunk dim when the
// layout was built as a chunk split, so Python can rebuild ShardMetadata and the spec from it.
std::tuple<at::Tensor, at::Tensor, at::Tensor, std::vector<std::string>, std::vector<int64_t>,
           std::optional<int64_t>>
layout_of(const at::Tensor& self) {
  const auto* impl = impl_of(self, "_layout");
  const auto& layout = *impl->layout();
  const auto n = static_cast<int64_t>(layout.num_shards());
  const auto ndim = static_cast<int64_t>(layout.global_size().size());
  const auto opts = at::TensorOptions().dtype(at::kLong);
  at::Tensor offsets = at::empty({n, ndim}, opts);
  at::Tensor sizes = at::empty({n, ndim}, opts);
  at::Tensor index = at::empty({n}, opts);
  int64_t* off = offsets.mutable_data_ptr<int64_t>();
  int64_t* len = sizes.mutable_data_ptr<int64_t>();
  int64_t* idx = index.mutable_data_ptr<int64_t>();
  for (int64_t i = 0; i < n; ++i) {
    const auto& box = layout.box(static_cast<size_t>(i));
    std::copy(box.offsets.begin(), box.offsets.end(), off + i * ndim);
    std::copy(box.sizes.begin(), box.sizes.end(), len + i * ndim);
    idx[i] = layout.placement_of()[static_cast<size_t>(i)];
  }
  std::vector<std::string> names;
  std::vector<int64_t> owners;
  for (const auto& p : layout.placements()) {
    names.push_back(p.name);
    owners.push_back(p.owner);
  }
  return {std::move(offsets), std::move(sizes),  std::move(index),
          std::move(names),   std::move(owners), layout.chunk_dim()};
}

std::string group_name(const at::Tensor& self) {
  return impl_of(self, "_group_name")->group_name();
}

void set_local_shards(const at::Tensor& self, at::TensorList local_shards,
                      c10::IntArrayRef local_shard_indices) {
  impl_of(self, "_set_local_shards")->set_local_shards(local_shards.vec(), local_shard_indices.vec());
}

// NOTE [ A local shard against its shard ], for Python's constructors: [k, ShardMismatch code] of the
// first of `tensors` that does not fit its shard, or [] when all fit. Shard k's size is the next
// shard_ndims[k] values of shard_sizes; devices[k] is its placement's device ("": not checked; an
// empty list: none checked).
std::vector<int64_t> local_shard_mismatch(at::TensorList tensors, c10::IntArrayRef shard_sizes,
                                          c10::IntArrayRef shard_ndims,
                                          const std::vector<std::string>& devices,
                                          std::optional<c10::ScalarType> dtype,
                                          std::optional<bool> pin_memory, std::optional<bool> requires_grad,
                                          bool strided_contiguous) {
  const auto n = static_cast<int64_t>(tensors.size());
  TORCH_CHECK_VALUE(static_cast<int64_t>(shard_ndims.size()) == n, "torch_shard._local_shard_mismatch: ", n,
                    " tensors but ", shard_ndims.size(), " shard ranks");
  TORCH_CHECK_VALUE(devices.empty() || static_cast<int64_t>(devices.size()) == n,
                    "torch_shard._local_shard_mismatch: ", n, " tensors but ", devices.size(), " devices");
  const auto total = static_cast<int64_t>(shard_sizes.size());
  int64_t start = 0;
  std::vector<int64_t> mismatch;
  for (int64_t k = 0; k < n; ++k) {
    const int64_t ndim = shard_ndims[k];
    TORCH_CHECK_VALUE(ndim >= 0 && ndim <= total - start, "torch_shard._local_shard_mismatch: shard ", k,
                      " has ", ndim, " dims, but only ", total - start, " sizes are left");
    ShardExpectation expected;
    expected.strided_contiguous = strided_contiguous;
    expected.sizes = shard_sizes.slice(static_cast<size_t>(start), static_cast<size_t>(ndim));
    if (!devices.empty() && !devices[k].empty()) {
      expected.device = c10::Device(devices[k]);
    }
    expected.dtype = dtype;
    expected.pin_memory = pin_memory;
    expected.requires_grad = requires_grad;
    start += ndim;
    const ShardMismatch found = shard_mismatch(tensors[k], expected);
    if (mismatch.empty() && found != ShardMismatch::kNone) {
      mismatch = {k, static_cast<int64_t>(found)};
    }
  }
  TORCH_CHECK_VALUE(start == total, "torch_shard._local_shard_mismatch: ", total - start,
                    " sizes left over after the last shard");
  return mismatch;
}

} // namespace ops
} // namespace torch_shard
