#include "layout/layout.h"

#include <algorithm>
#include <atomic>
#include <limits>
#include <numeric>

#include <c10/util/Exception.h>

#include "layout/chunk.h"
#include "layout/validate.h"

namespace torch_shard {
namespace layout {

namespace {

uint64_t mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

} // namespace

Fingerprint& Fingerprint::add(int64_t value) {
  state_ =
      mix64(state_ ^ (static_cast<uint64_t>(value) + 0x9e3779b97f4a7c15ull + (state_ << 6) + (state_ >> 2)));
  return *this;
}

Fingerprint& Fingerprint::add(const Dims& values) {
  add(static_cast<int64_t>(values.size()));
  for (int64_t v : values) {
    add(v);
  }
  return *this;
}

Fingerprint& Fingerprint::add(const std::string& value) {
  add(static_cast<int64_t>(value.size()));
  uint64_t word = 0;
  size_t filled = 0;
  for (unsigned char c : value) {
    word = (word << 8) | c;
    if (++filled == 8) {
      add(static_cast<int64_t>(word));
      word = 0;
      filled = 0;
    }
  }
  if (filled != 0) {
    add(static_cast<int64_t>(word));
  }
  return *this;
}

c10::Device placement_device(const std::string& name) {
  if (name.empty()) {
    return c10::Device(c10::kCPU);
  }
  const auto slash = name.find('/');
  const std::string device = slash == std::string::npos ? std::string("cpu") : name.substr(slash + 1);
  try {
    return c10::Device(device);
  } catch (const c10::Error& e) {
    TORCH_CHECK_VALUE(false, "torch_shard: placement '", name, "' names an unknown device '", device,
                      "': ", e.what_without_backtrace());
  }
}

std::shared_ptr<const Layout> Layout::make(Dims global_size, std::vector<Box> boxes,
                                           std::vector<int64_t> placement_of,
                                           std::vector<Placement> placements, bool validate) {
  TORCH_CHECK_VALUE(placement_of.size() == boxes.size(), "torch_shard: ", boxes.size(), " shards but ",
                    placement_of.size(), " placement indices");
  for (size_t i = 0; i < placement_of.size(); ++i) {
    TORCH_CHECK_INDEX(placement_of[i] >= 0 && placement_of[i] < static_cast<int64_t>(placements.size()),
                      "torch_shard: shard ", i, " refers to placement ", placement_of[i], ", but there are ",
                      placements.size(), " placements");
  }
  std::shared_ptr<Layout> out(new Layout());
  out->global_size_ = std::move(global_size);
  out->boxes_ = std::move(boxes);
  out->placement_of_ = std::move(placement_of);
  out->placements_ = std::move(placements);
  out->finish(validate);
  return out;
}

std::shared_ptr<const Layout> Layout::chunked(Dims global_size, int64_t dim,
                                              std::vector<Placement> placements) {
  TORCH_CHECK_VALUE(!placements.empty(), "torch_shard: a chunk layout needs at least one placement");
  std::shared_ptr<Layout> out(new Layout());
  out->boxes_ = chunk_boxes(global_size, dim, static_cast<int64_t>(placements.size()));
  out->chunk_dim_ = normalize_chunk_dim(dim, global_size.size());
  out->global_size_ = std::move(global_size);
  out->placement_of_.resize(placements.size());
  std::iota(out->placement_of_.begin(), out->placement_of_.end(), 0);
  out->placements_ = std::move(placements);
  out->finish(/*validate=*/false); // a chunk split tiles the tensor by construction
  return out;
}

std::shared_ptr<const Layout> Layout::whole(Dims global_size, int64_t owner, c10::Device device) {
  std::shared_ptr<Layout> out(new Layout());
  out->boxes_.push_back(Box{Dims(global_size.size(), 0), global_size});
  out->global_size_ = std::move(global_size);
  out->placement_of_ = {0};
  out->placements_ = {Placement{"", owner, device}};
  out->finish(/*validate=*/false);
  return out;
}

void Layout::finish(bool validate) {
  numel_ = checked_numel(global_size_, "the tensor size");
  for (size_t i = 0; i < boxes_.size(); ++i) {
    TORCH_CHECK_VALUE(boxes_[i].ndim() == global_size_.size(), "Rank of tensor is ", global_size_.size(),
                      ", but shards rank is ", boxes_[i].ndim());
    check_box(boxes_[i], i);
  }
  for (const Placement& p : placements_) {
    TORCH_CHECK_VALUE(p.owner >= -1, "torch_shard: placement '", p.name, "' has owner ", p.owner,
                      "; owners are group ranks, or -1 for none");
  }
  if (validate) {
    validate_shards(boxes_, global_size_);
  }
  // See NOTE [ What ranks agree on about a placement ].
  Fingerprint fp;
  fp.add(global_size_).add(static_cast<int64_t>(boxes_.size()));
  for (size_t i = 0; i < boxes_.size(); ++i) {
    const Placement& p = placement(i);
    fp.add(boxes_[i].offsets).add(boxes_[i].sizes).add(p.owner).add(static_cast<int64_t>(p.device.type()));
  }
  fingerprint_ = fp.value();
  static std::atomic<int64_t> serials{0};
  serial_ = ++serials;
}

std::shared_ptr<const Layout> sorted_by_owner_impl(const Layout& layout) {
  std::vector<size_t> order(layout.num_shards());
  std::iota(order.begin(), order.end(), 0);
  auto key = [&](size_t i) {
    const int64_t owner = layout.owner(i);
    return owner < 0 ? std::numeric_limits<int64_t>::max() : owner;
  };
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return key(a) < key(b); });
  std::vector<Box> boxes;
  std::vector<int64_t> placement_of;
  boxes.reserve(order.size());
  placement_of.reserve(order.size());
  for (size_t i : order) {
    boxes.push_back(layout.box(i));
    placement_of.push_back(layout.placement_of()[i]);
  }
  return Layout::make(layout.global_size(), std::move(boxes), std::move(placement_of), layout.placements(),
                      /*validate=*/false);
}

std::shared_ptr<const Layout> Layout::sorted_by_owner() const {
  return sorted_by_owner_impl(*this);
}

std::vector<int64_t> Layout::owners() const {
  std::vector<int64_t> out(boxes_.size());
  for (size_t i = 0; i < boxes_.size(); ++i) {
    out[i] = owner(i);
  }
  return out;
}

std::vector<int64_t> Layout::shards_of(int64_t rank) const {
  std::vector<int64_t> out;
  for (size_t i = 0; i < boxes_.size(); ++i) {
    if (owner(i) == rank) {
      out.push_back(static_cast<int64_t>(i));
    }
  }
  return out;
}

bool Layout::same_as(const Layout& other) const {
  if (this == &other) {
    return true;
  }
  if (fingerprint_ != other.fingerprint_ || global_size_ != other.global_size_ ||
      boxes_.size() != other.boxes_.size()) {
    return false;
  }
  for (size_t i = 0; i < boxes_.size(); ++i) {
    const Placement& a = placement(i);
    const Placement& b = other.placement(i);
    if (!(boxes_[i] == other.boxes_[i]) || a.owner != b.owner || a.device.type() != b.device.type()) {
      return false;
    }
  }
  return true;
}

bool on_placement_device(c10::Device device, c10::Device placement) {
  if (device.type() != placement.type()) {
    return false;
  }
  // CPU tensors carry no index ("cpu:0" and "cpu" are the same memory); an index-less placement
  // ("rank:0/cuda") accepts any device of its type.
  return device.is_cpu() || !placement.has_index() || device == placement;
}

} // namespace layout
} // namespace torch_shard
