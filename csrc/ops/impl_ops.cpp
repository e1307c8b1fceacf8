// Kernels that build a ShardedTensorImpl and read it back.
//
// Registered as CompositeImplicitAutograd so they run at the Autograd key, before the Python key a
// wrapped ShardedTensor carries: reading the shards never bounces through __torch_dispatch__.

#include <ATen/ops/empty.h>
#include <torch/library.h>

#include "layout/box.h"
#include "ops/box_args.h"
#include "sharded_tensor_impl.h"

namespace torch_shard {
namespace {

at::Tensor make_sharded(at::TensorList local_shards,
                        c10::IntArrayRef local_shard_indices,
                        c10::IntArrayRef global_size,
                        const at::Tensor& shard_offsets,
                        const at::Tensor& shard_sizes,
                        c10::IntArrayRef shard_ranks,
                        c10::ScalarType dtype,
                        c10::Device device,
                        bool pin_memory,
                        c10::string_view group_name) {
  auto boxes = boxes_from_tensors(shard_offsets, shard_sizes, "_make_sharded");
  return make_sharded_tensor(local_shards.vec(), local_shard_indices.vec(), global_size.vec(),
                             std::move(boxes), shard_ranks.vec(), dtype, device, pin_memory,
                             std::string(group_name));
}

bool is_sharded(const at::Tensor& self) {
  return is_sharded_tensor(self);
}

std::vector<at::Tensor> local_shards(const at::Tensor& self) {
  return unsafe_get_sharded_impl(self, "_local_shards")->local_shards();
}

std::vector<int64_t> local_shard_indices(const at::Tensor& self) {
  return unsafe_get_sharded_impl(self, "_local_shard_indices")->local_shard_indices();
}

std::tuple<at::Tensor, at::Tensor, std::vector<int64_t>> shard_layout(const at::Tensor& self) {
  const auto* impl = unsafe_get_sharded_impl(self, "_shard_layout");
  const auto& shards = impl->global_shards();
  const auto n = static_cast<int64_t>(shards.size());
  const auto ndim = static_cast<int64_t>(impl->global_size().size());
  at::Tensor offsets = at::empty({n, ndim}, at::TensorOptions().dtype(at::kLong));
  at::Tensor sizes = at::empty({n, ndim}, at::TensorOptions().dtype(at::kLong));
  int64_t* off = offsets.mutable_data_ptr<int64_t>();
  int64_t* len = sizes.mutable_data_ptr<int64_t>();
  for (int64_t i = 0; i < n; ++i) {
    std::copy(shards[i].offsets.begin(), shards[i].offsets.end(), off + i * ndim);
    std::copy(shards[i].sizes.begin(), shards[i].sizes.end(), len + i * ndim);
  }
  return {std::move(offsets), std::move(sizes), impl->shard_ranks()};
}

std::string group_name(const at::Tensor& self) {
  return unsafe_get_sharded_impl(self, "_group_name")->group_name();
}

void set_local_shards(const at::Tensor& self, at::TensorList local_shards,
                      c10::IntArrayRef local_shard_indices) {
  auto* impl = unsafe_get_sharded_impl(self, "_set_local_shards");
  TORCH_CHECK_VALUE(local_shards.size() == local_shard_indices.size(),
                    "torch_shard._set_local_shards: ", local_shards.size(), " shards but ",
                    local_shard_indices.size(), " indices");
  const auto& boxes = impl->global_shards();
  for (size_t k = 0; k < local_shards.size(); ++k) {
    const int64_t idx = local_shard_indices[k];
    TORCH_CHECK_INDEX(idx >= 0 && idx < static_cast<int64_t>(boxes.size()),
                      "torch_shard._set_local_shards: shard index ", idx, " out of range");
    TORCH_CHECK_VALUE(local_shards[k].sizes().vec() == boxes[idx].sizes,
                      "torch_shard._set_local_shards: local shard ", k, " has size ",
                      local_shards[k].sizes(), ", but shard ", idx, " is ",
                      layout::dims_str(boxes[idx].sizes));
    TORCH_CHECK_TYPE(local_shards[k].scalar_type() == impl->dtype().toScalarType(),
                     "torch_shard._set_local_shards: local shard ", k, " has dtype ",
                     local_shards[k].scalar_type(), ", the ShardedTensor ", impl->dtype());
  }
  impl->set_layout(boxes, impl->shard_ranks(), local_shards.vec(), local_shard_indices.vec());
}

}  // namespace

TORCH_LIBRARY_IMPL(torch_shard, CompositeImplicitAutograd, m) {
  m.impl("_set_local_shards", TORCH_FN(set_local_shards));
  m.impl("_make_sharded", TORCH_FN(make_sharded));
  m.impl("is_sharded", TORCH_FN(is_sharded));
  m.impl("_local_shards", TORCH_FN(local_shards));
  m.impl("_local_shard_indices", TORCH_FN(local_shard_indices));
  m.impl("_shard_layout", TORCH_FN(shard_layout));
  m.impl("_group_name", TORCH_FN(group_name));
}

}  // namespace torch_shard
