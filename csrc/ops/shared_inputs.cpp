// Every rank's input on every rank: NOTE [ Shared inputs ] in ops/shared_inputs.h.

#include "ops/shared_inputs.h"

#include <cmath>
#include <cstring>
#include <string>

#include <ATen/ops/empty.h>
#include <c10/util/Exception.h>

#include "comm/process_group.h"
#include "layout/box.h"
#include "layout/layout.h"
#include "ops/agreement.h"
#include "ops/untraceable.h"

namespace torch_shard {
namespace ops {

namespace {

int64_t padded8(int64_t bytes) {
  return layout::checked_add(bytes, (8 - bytes % 8) % 8, "a part");
}

// The agreed scalars as one value: bit patterns, with the two zeros and every NaN made one value each.
int64_t scalars_fingerprint(c10::ArrayRef<double> arguments) {
  layout::Fingerprint scalars;
  scalars.add(static_cast<int64_t>(arguments.size()));
  for (double value : arguments) {
    const double canonical = value == 0.0 ? 0.0 : (std::isnan(value) ? std::nan("") : value);
    int64_t bits = 0;
    std::memcpy(&bits, &canonical, sizeof(bits));
    scalars.add(bits);
  }
  return scalars.as_int64();
}

void check_shared(const std::vector<comm::Values>& all, int64_t me) {
  raise_first_mismatch(
      all, me,
      {{0, "torch_shard: the sharded weight on rank ", " does not match with the sharded weight on rank ",
        " (different layouts)"},
       {2, "torch_shard: the arguments on rank ", " do not match with the arguments on rank ",
        " (e.g. per_sample_weights given on some ranks only)"},
       {3, "torch_shard: the arguments on rank ", " do not match with the arguments on rank ",
        " (mode, padding_idx, max_norm or norm_type: each rank computes the "
        "other ranks' lookups with its own, so they must be the same on "
        "every rank)"},
       {1, "torch_shard: the inputs on rank ", " do not match with the inputs on rank ",
        " (different numbers of tensors or dtypes)"}});
}

} // namespace

Shared share_inputs(c10d::ProcessGroup& pg, const ShareRequest& request) {
  const int64_t me = pg.getRank();
  const int64_t world = pg.getSize();
  const at::TensorList parts = request.parts;
  const auto nparts = static_cast<int64_t>(parts.size());
  const c10::Device out_device = request.device.value_or(nparts ? parts[0].device() : c10::Device(c10::kCPU));
  const c10::Device device = comm::comm_device(pg, out_device);
  std::vector<at::Tensor> flat(parts.size());
  std::vector<c10::ScalarType> dtypes(parts.size());
  comm::Notes notes{};
  int64_t message_bytes = 0;
  layout::Fingerprint dtype_fp;
  dtype_fp.add(nparts);
  comm::Moves moves;
  comm::Values mine{};
  std::exception_ptr error = request.error;
  if (!error) {
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
        message_bytes = layout::checked_add(message_bytes, padded8(notes[k]), "a message size");
      }
      if (request.status.defined()) {
        TORCH_CHECK_VALUE(request.status.numel() == 1 && request.status.scalar_type() == at::kLong,
                          "torch_shard._share_inputs: status must be one int64 value, got ",
                          request.status.sizes(), " ", request.status.scalar_type());
        TORCH_INTERNAL_ASSERT(request.raise_status, "a status needs the function that raises its error");
      }
      if (request.words.defined()) {
        TORCH_CHECK_VALUE(request.words.dim() == 1 && request.words.numel() == world &&
                              request.words.scalar_type() == at::kLong,
                          "torch_shard._share_inputs: words must be int64 with one value per rank (", world,
                          "), got ", request.words.sizes(), " ", request.words.scalar_type());
      }
      moves.send.resize(world);
      moves.recv.resize(world);
      // Every peer gets the same message: packed once (a copy per non-empty part, a device copy where
      // the devices differ), then sent as it is to each.
      const at::Tensor message =
          at::empty({world > 1 ? message_bytes : 0}, at::TensorOptions().dtype(at::kByte).device(device));
      int64_t pos = 0;
      for (int64_t k = 0; k < nparts && world > 1; ++k) {
        if (notes[k] > 0) { // an empty part costs no copy (a kernel launch on a GPU)
          message.narrow(0, pos, notes[k]).copy_(flat[k].view(at::kByte));
        }
        pos += padded8(notes[k]);
      }
      for (int64_t p = 0; p < world; ++p) {
        if (p != me) {
          moves.send[p].bytes = message_bytes;
          moves.send[p].direct = message;
          moves.recv[p].bytes = comm::kDeclared;
        }
      }
      mine = {request.fingerprint, dtype_fp.as_int64(), request.flags,
              scalars_fingerprint(request.arguments)};
    } catch (...) {
      error = std::current_exception();
    }
  }
  std::vector<at::Tensor> received(world);
  if (!error) {
    for (int64_t p = 0; p < world; ++p) {
      if (p != me) {
        // The round's buffer is reused by the next exchange: keep a copy (on the communication device)
        // unless the caller copies the parts out first.
        moves.recv[p].unpack = [&received, p, borrow = request.borrow](const at::Tensor& from) {
          received[p] = borrow ? from : from.clone();
        };
      }
    }
  }
  comm::Agreement agreed = agreement(comm::OpKind::kShareInputs, mine, error, check_shared);
  agreed.notes = notes;
  if (!error && request.status.defined()) {
    agreed.status = request.status;
    agreed.raise_status = request.raise_status;
  }
  if (!error && request.words.defined()) {
    agreed.words = request.words;
  }
  const comm::Outcome outcome = comm::exchange(pg, device, agreed, error ? nullptr : &moves);
  Shared shared;
  shared.parts.reserve(world * nparts);
  for (int64_t r = 0; r < world; ++r) {
    if (r == me) {
      for (int64_t k = 0; k < nparts; ++k) {
        shared.parts.push_back(parts[k].reshape({-1}));
      }
      continue;
    }
    // The sizes come from another process: check them against what it declared before using them.
    int64_t total = 0;
    for (int64_t k = 0; k < nparts; ++k) {
      const int64_t bytes = outcome.notes[r][k];
      TORCH_CHECK(bytes >= 0 && bytes % static_cast<int64_t>(c10::elementSize(dtypes[k])) == 0,
                  "torch_shard._share_inputs: malformed message from rank ", r);
      total = layout::checked_add(total, padded8(bytes), "a message size");
    }
    TORCH_CHECK(total == outcome.declared[r], "torch_shard._share_inputs: malformed message from rank ", r);
    const at::Tensor message = received[r].defined()
                                   ? received[r]
                                   : at::empty({0}, at::TensorOptions().dtype(at::kByte).device(device));
    int64_t pos = 0;
    for (int64_t k = 0; k < nparts; ++k) {
      const int64_t bytes = outcome.notes[r][k];
      shared.parts.push_back(message.narrow(0, pos, bytes).view(dtypes[k]).to(out_device));
      pos += padded8(bytes);
    }
  }
  shared.words_in = outcome.words_in;
  shared.words_out = outcome.words_out;
  return shared;
}

// The op: parts only (init_from_local_shards' records, for one).
std::vector<at::Tensor> share_inputs_op(at::TensorList parts, int64_t fingerprint, int64_t flags,
                                        c10::string_view group_name, c10::ArrayRef<double> arguments) {
  check_not_tracing("_share_inputs", kCommunicates);
  auto pg = comm::resolve_group(std::string(group_name), "_share_inputs");
  ShareRequest request;
  request.parts = parts;
  request.fingerprint = fingerprint;
  request.flags = flags;
  request.arguments = arguments;
  return share_inputs(*pg, request).parts;
}

} // namespace ops
} // namespace torch_shard
