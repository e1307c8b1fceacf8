// A lookup input's value checks: NOTE [ Input checks on the device ] in ops/lookup_checks.h.

#include "ops/lookup_checks.h"

#include <utility>
#include <vector>

#include <ATen/TensorOperators.h>
#include <ATen/ops/arange.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/full.h>
#include <ATen/ops/zeros.h>
#include <c10/util/Exception.h>

#include "comm/exchange.h"
#include "comm/process_group.h"
#include "layout/layout.h"
#include "ops/lookup_common.h"
#include "ops/untraceable.h"

namespace torch_shard {
namespace ops {

namespace {

constexpr auto kValueError = static_cast<int64_t>(comm::ErrorCode::kValueError);
constexpr auto kRuntimeError = static_cast<int64_t>(comm::ErrorCode::kRuntimeError);

// The checks on host memory (CPU tensors, or copies of device ones), each calling `fail(code, ...)`
// with its message's values; the first failure ends the walk. One walk for the status and the error,
// so the two can never disagree.
template <typename Fail>
void walk_checks(const LookupInput& input, const at::Tensor& ids, const at::Tensor& offsets, Fail&& fail) {
  const int64_t n = ids.numel();
  const int64_t* id = ids.const_data_ptr<int64_t>();
  int64_t low = 0, high = 0;
  bool out_of_range = false;
  for (int64_t i = 0; i < n; ++i) {
    low = i == 0 || id[i] < low ? id[i] : low;
    high = i == 0 || id[i] > high ? id[i] : high;
    out_of_range = out_of_range || id[i] < 0 || id[i] >= input.num_embeddings;
  }
  if (out_of_range) {
    fail(kValueError, [&] {
      TORCH_CHECK_VALUE(false, "Index out of range in Input ", low, " ", high, " ", input.num_embeddings);
    });
    return;
  }
  const int64_t m = offsets.defined() ? offsets.numel() : 0;
  if (m == 0) {
    return;
  }
  const int64_t* o = offsets.const_data_ptr<int64_t>();
  const int64_t first = o[0], last = o[m - 1];
  if (input.include_last_offset && last != n) {
    fail(kValueError, [] {
      TORCH_CHECK_VALUE(
          false, "offsets need to have the input size in the end when the flag \"include_last_offset\" "
                 "is on!");
    });
    return;
  }
  if (first != 0) {
    fail(kRuntimeError, [&] {
      TORCH_CHECK(false,
                  "offsets[0] has to be 0, i.e., the first sequence in the mini-batch has to start from "
                  "position 0. However, got ",
                  first);
    });
    return;
  }
  if (last > n) {
    fail(kRuntimeError, [&] {
      TORCH_CHECK(false, "offsets[-1] can not be greater than input's length ", n, " but got offsets[-1] of ",
                  last);
    });
    return;
  }
  for (int64_t b = 1; b < m; ++b) {
    if (o[b] < o[b - 1]) {
      fail(kRuntimeError, [&] {
        TORCH_CHECK(false, "embedding_bag: offsets has to be non-decreasing, but offsets[", b, "] = ", o[b],
                    " is less than offsets[", b - 1, "] = ", o[b - 1]);
      });
      return;
    }
  }
}

at::Tensor on_host(const at::Tensor& t) {
  return t.defined() ? t.to(at::kCPU).contiguous() : t;
}

// The same checks as ATen ops on the input's device: no host read (NOTE [ Input checks on the device ]).
// `outside`, when defined, is how many ids lie outside the table (the row-wise routing counts them).
at::Tensor composed_status(const LookupInput& input, const at::Tensor& outside) {
  static_assert(kValueError == 1, "a count of bad ids clamped to 1 is the ValueError code");
  const at::Tensor& ids = input.ids;
  const int64_t n = ids.numel();
  const at::Tensor bad_ids = outside.defined() ? outside
                             : input.num_embeddings > 0
                                 ? ids.clamp(0, input.num_embeddings - 1).ne(ids).count_nonzero()
                                 : at::full({}, n, ids.options().dtype(at::kLong));
  at::Tensor status = bad_ids.clamp_max(kValueError);
  const int64_t m = input.offsets.has_value() ? input.offsets->numel() : 0;
  if (m == 0) {
    return status;
  }
  const at::Tensor& offsets = *input.offsets;
  const at::Tensor first = offsets.select(0, 0), last = offsets.select(0, m - 1);
  if (input.include_last_offset) {
    status.masked_fill_(last.ne(n), kValueError);
  }
  // Well-formed offsets start at 0, never decrease and end at most at n: in one comparison, every
  // element of lhs is at least rhs's, pairing (offsets[0], 0), each (offsets[i], offsets[i - 1]),
  // (n, offsets[-1]) and (0, offsets[0]).
  const at::Tensor ends = to_device({n, 0, 0}, offsets.device());
  const at::Tensor lhs = at::cat({offsets, ends.narrow(0, 0, 2)});
  const at::Tensor rhs = at::cat({ends.narrow(0, 2, 1), offsets, first.reshape({1})});
  const at::Tensor runtime_bad = lhs.lt(rhs).any();
  // Every ValueError check comes before every RuntimeError one: a RuntimeError only where none failed.
  return status.masked_fill_(runtime_bad & status.eq(0), kRuntimeError);
}

} // namespace

at::Tensor input_status(const LookupInput& input, const at::Tensor& outside) {
  if (!loops_for(input.ids)) {
    return composed_status(input, outside);
  }
  int64_t code = 0;
  walk_checks(input, input.ids.contiguous(),
              input.offsets.has_value() ? input.offsets->contiguous() : at::Tensor(),
              [&code](int64_t failed, const auto&) { code = failed; });
  at::Tensor status = at::empty({}, input.ids.options().dtype(at::kLong)); // written on the host: no kernel
  *status.mutable_data_ptr<int64_t>() = code;
  return status;
}

void raise_input_error(const LookupInput& input) {
  walk_checks(input, on_host(input.ids), input.offsets.has_value() ? on_host(*input.offsets) : at::Tensor(),
              [](int64_t, const auto& raise) { raise(); });
  TORCH_CHECK(false,
              "torch_shard: an input check failed on the device but not on the host; please report this");
}

c10::intrusive_ptr<c10d::ProcessGroup> lookup_group(c10::string_view group_name, const char* op) {
  check_not_tracing(op, kCommunicates);
  return comm::resolve_group(std::string(group_name), op);
}

CheckedInput check_input(const char* op, const LookupCall& call) {
  const at::Tensor &local = call.local, &ids = call.ids;
  const std::optional<at::Tensor>&offsets = call.offsets, &per_sample_weights = call.per_sample_weights;
  const int64_t num_embeddings = call.num_embeddings, padding_idx = call.padding_idx;
  const bool include_last_offset = call.include_last_offset;
  CheckedInput checked;
  checked.mode = parse_mode(op, call.mode);
  const bool bags = is_bags(checked.mode);
  TORCH_CHECK_VALUE(padding_idx >= -1 && padding_idx < num_embeddings, op, ": padding_idx ", padding_idx,
                    " is not a row (or -1)");
  TORCH_CHECK_VALUE(local.dim() == 2, op, ": the weight shard must be 2-D, got shape ", local.sizes());
  TORCH_CHECK_TYPE(at::isFloatingType(local.scalar_type()), op,
                   ": the weight shard must be a floating point tensor, got ", local.scalar_type());
  // Bags without offsets are the rows of a 2-D input.
  const bool fixed = bags && !offsets.has_value();
  TORCH_CHECK_TYPE(ids.scalar_type() == at::kLong && ids.dim() == (fixed ? 2 : 1), op, ": ids must be ",
                   fixed ? "2-D (bags without offsets)" : "1-D", " int64, got ", ids.dim(), "-D ",
                   ids.scalar_type());
  TORCH_CHECK_VALUE(ids.device() == local.device(), op, ": ids are on ", ids.device(),
                    ", the weight shard on ", local.device());
  TORCH_CHECK_VALUE(bags || !offsets.has_value(), op, ": offsets are for embedding_bag");
  TORCH_CHECK_VALUE(bags || !include_last_offset, op, ": include_last_offset is for embedding_bag");
  TORCH_CHECK_VALUE(!fixed || !include_last_offset, op, ": include_last_offset needs offsets");
  if (offsets.has_value()) {
    TORCH_CHECK_VALUE(offsets->scalar_type() == at::kLong && offsets->dim() == 1 &&
                          offsets->device() == local.device(),
                      op, ": offsets must be 1-D int64 on the weight shard's device");
    TORCH_CHECK_VALUE(!include_last_offset || offsets->numel() > 0,
                      "include_last_offset: number of offset should be at least 1");
  }
  if (per_sample_weights.has_value()) {
    TORCH_CHECK_VALUE(
        checked.mode == LookupMode::kSum && per_sample_weights->dim() == 1 &&
            per_sample_weights->numel() == ids.numel() && per_sample_weights->device() == local.device() &&
            per_sample_weights->scalar_type() == local.scalar_type(),
        op, ": per_sample_weights must be 1-D, one per id, with mode sum, of the weight's dtype");
  }
  checked.input = LookupInput{
      fixed ? ids.reshape({-1}) : ids, offsets, include_last_offset, num_embeddings, fixed ? ids.size(1) : -1,
      fixed ? ids.size(0) : 0};
  return checked;
}

ShareRequest agreement_request(const CheckedInput& checked, int64_t fingerprint,
                               const std::vector<double>& agreed, c10::Device device,
                               std::exception_ptr error) {
  ShareRequest request;
  request.fingerprint = fingerprint;
  request.arguments = agreed;
  request.device = device;
  request.error = std::move(error);
  if (!request.error) {
    request.status = checked.status;
    request.raise_status = [&checked](comm::ErrorCode) { raise_input_error(checked.input); };
  }
  return request;
}

void agree_backward(c10d::ProcessGroup& pg, LookupOp op, LookupMode mode, const at::Tensor& grad,
                    std::exception_ptr error) {
  const std::vector<double> agreed = agreed_arguments(op, {}, {static_cast<double>(mode)});
  ShareRequest request;
  request.fingerprint = layout::Fingerprint()
                            .add(grad.dim() == 2 ? grad.size(1) : int64_t{-1})
                            .add(static_cast<int64_t>(grad.scalar_type()))
                            .as_int64();
  request.arguments = agreed;
  request.device = grad.device();
  request.error = std::move(error);
  share_inputs(pg, request);
}

BackwardHead backward_head(const char* op, c10::string_view mode_name, const at::Tensor& grad,
                           at::TensorList saved, size_t num_saved, size_t counts_at, int64_t words) {
  const LookupMode mode = parse_mode(op, mode_name);
  TORCH_CHECK_VALUE(saved.size() == num_saved, op, ": expected ", static_cast<int64_t>(num_saved),
                    " saved tensors, got ", saved.size());
  TORCH_CHECK_VALUE(grad.dim() == 2, op, ": grad must be 2-D, got ", grad.sizes());
  const at::Tensor& counts = saved[counts_at];
  TORCH_CHECK_VALUE(counts.is_cpu() && counts.scalar_type() == at::kLong && counts.dim() == 1 &&
                        counts.numel() == words,
                    op, ": malformed counts");
  const at::Tensor dense = counts.contiguous();
  const int64_t* c = dense.const_data_ptr<int64_t>();
  return {mode, std::vector<int64_t>(c, c + words)};
}

at::Tensor bag_offsets(const LookupInput& input) {
  if (input.fixed()) {
    const auto options = input.ids.options();
    return input.bag_length > 0 ? at::arange(0, input.ids.numel(), input.bag_length, options)
                                : at::zeros({input.fixed_bags}, options);
  }
  const at::Tensor& offsets = *input.offsets;
  return input.include_last_offset && offsets.numel() > 0 ? offsets.narrow(0, 0, offsets.numel() - 1)
                                                          : offsets;
}

int64_t bag_count(const LookupInput& input) {
  // Given offsets: bag_offsets is a view of them (no op).
  return input.fixed() ? input.fixed_bags : bag_offsets(input).numel();
}

} // namespace ops
} // namespace torch_shard
