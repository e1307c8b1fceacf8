// After the verdict: this rank's local part, the payloads that came in round 1, and round 2 for the
// rest (NOTE [ Agreed exchange ] in comm/exchange.cpp).

#include <algorithm>
#include <functional>

#include <ATen/ops/as_strided.h>
#include <c10/util/Exception.h>

#include "comm/exchange_state.h"
#include "comm/process_group.h"

namespace torch_shard {
namespace comm {

// Round 2 on a group with point-to-point messages goes pair by pair when the pattern is sparse (a
// scatter is one-to-many, a gather many-to-one) or some message is at least this big (each message is
// packed while the previous ones travel); a dense pattern of medium messages takes one all-to-all.
constexpr int64_t kPointToPointFromBytes = int64_t{256} << 10;

namespace {

// NOTE [ Whole buffers ]
// An all-to-all takes one flat send buffer (the messages to each rank, in rank order) and one flat
// receive buffer. Building them costs a pack copy and an unpack copy, unless the messages, in rank
// order, are already consecutive in ONE tensor's memory: then that tensor is the buffer. This is the
// common case on one side of most dense moves: the sender of row chunks (each peer's part of a row
// shard is a run of rows, in rank order) and the receiver of a column->row or row->column reshard
// (each peer's part of its new shard is a run). A rank's own part must then travel through the
// collective too (the backends copy it locally; it never touches the network) instead of being
// copied shard to shard. Returns that tensor's bytes, or an undefined tensor.
at::Tensor whole_buffer(const std::vector<int64_t>& splits,
                        const std::function<const at::Tensor&(int64_t)>& direct_of) {
  at::Tensor first;
  const uint8_t* next = nullptr;
  int64_t total = 0;
  for (size_t p = 0; p < splits.size(); ++p) {
    if (splits[p] == 0) {
      continue;
    }
    const at::Tensor& t = direct_of(static_cast<int64_t>(p));
    if (!t.defined() || t.numel() != splits[p]) {
      return at::Tensor();
    }
    // Only addresses are compared (no memory is read): the same test holds for device memory.
    const auto* start = static_cast<const uint8_t*>(t.const_data_ptr());
    if (!first.defined()) {
      first = t;
    } else if (start != next || !t.storage().is_alias_of(first.storage())) {
      return at::Tensor();
    }
    next = start + splits[p];
    total += splits[p];
  }
  if (!first.defined()) {
    return at::Tensor();
  }
  return first.as_strided({total}, {1}, first.storage_offset());
}

void run_local(const Exchange& x) {
  if (x.moves->local) {
    x.moves->local();
  }
}

// Point-to-point between the pairs that still have data to move.
void point_to_point(Exchange& x) {
  const int64_t world = x.world;
  const int64_t me = x.me;
  Moves& moves = *x.moves;
  auto sends_here = [&](int64_t p) { return !x.rides_in(p) && x.declared[p] > 0 && x.appended_in[p] == 0; };
  auto sends_there = [&](int64_t p) {
    return !x.rides_out[p] && moves.send[p].bytes > 0 && x.appended_out[p] == 0;
  };
  int64_t pack_bytes = 0, stage_bytes = 0;
  for (int64_t p = 0; p < world; ++p) {
    if (p == me) {
      continue;
    }
    if (sends_there(p) && !moves.send[p].direct.defined()) {
      pack_bytes += moves.send[p].bytes;
    }
    const bool direct = !x.mismatch && moves.recv[p].direct.defined();
    if (sends_here(p) && !direct) {
      stage_bytes += x.declared[p];
    }
  }
  at::Tensor pack_buffer = pack_bytes ? workspace(pack_bytes, x.device, 0) : at::Tensor();
  at::Tensor stage_buffer = stage_bytes ? workspace(stage_bytes, x.device, 2) : at::Tensor();
  std::vector<c10::intrusive_ptr<c10d::Work>> recv_work(world), send_work(world);
  std::vector<at::Tensor> landed(world);
  int64_t stage_pos = 0;
  bool posted = false;
  for (int64_t k = 1; k < world; ++k) {
    const int64_t p = (me - k + world) % world;
    if (!sends_here(p)) {
      continue;
    }
    const bool direct = !x.mismatch && moves.recv[p].direct.defined();
    landed[p] = direct ? moves.recv[p].direct : stage_buffer.narrow(0, stage_pos, x.declared[p]);
    if (!direct) {
      stage_pos += x.declared[p];
    }
    recv_work[p] = recv_bytes(x.pg, landed[p], p);
    posted = true;
  }
  int64_t pack_pos = 0;
  for (int64_t k = 1; k < world; ++k) {
    const int64_t p = (me + k) % world;
    if (!sends_there(p)) {
      continue;
    }
    const Outgoing& out = moves.send[p];
    at::Tensor message = out.direct;
    if (!message.defined()) {
      message = pack_buffer.narrow(0, pack_pos, out.bytes);
      pack_pos += out.bytes;
      out.pack(message);
    }
    send_work[p] = send_bytes(x.pg, message, p);
    posted = true;
  }
  // A rank whose payloads all rode in round 1 took no part in a second round.
  auto& stats = comm_stats();
  if (posted) {
    stats.collectives += 1;
  } else {
    stats.single_round_ops += 1;
  }
  run_local(x); // what stays on this rank moves while the network works
  for (int64_t p = 0; p < world; ++p) {
    if (p != me && x.declared[p] > 0 && !sends_here(p)) {
      x.deliver(p, x.round_one_payload(p));
    }
  }
  for (int64_t p = 0; p < world; ++p) {
    if (recv_work[p]) {
      recv_work[p]->wait();
      x.deliver(p, landed[p]);
    }
  }
  for (int64_t p = 0; p < world; ++p) {
    if (send_work[p]) {
      send_work[p]->wait();
    }
  }
}

// One all-to-all of the messages that did not ride in round 1 (dense patterns, NCCL, groups without
// point-to-point messages).
void all_to_all(Exchange& x) {
  const int64_t world = x.world;
  const int64_t me = x.me;
  Moves& moves = *x.moves;
  std::vector<int64_t> out_splits(world, 0), in_splits(world, 0);
  for (int64_t p = 0; p < world; ++p) {
    if (p == me) {
      continue;
    }
    out_splits[p] = x.rides_out[p] || x.appended_out[p] > 0 ? 0 : moves.send[p].bytes;
    in_splits[p] = x.rides_in(p) || x.appended_in[p] > 0 ? 0 : x.declared[p];
  }
  // See NOTE [ Whole buffers ].
  auto outgoing = [&](int64_t p) -> const at::Tensor& {
    return p == me ? moves.self_send.direct : moves.send[p].direct;
  };
  auto incoming = [&](int64_t p) -> const at::Tensor& {
    return p == me ? moves.self_recv.direct : moves.recv[p].direct;
  };
  const int64_t self_bytes = moves.self_send.bytes;
  const bool self_describable = self_bytes > 0 && moves.self_recv.bytes == self_bytes &&
                                (moves.self_send.direct.defined() || moves.self_send.pack) &&
                                (moves.self_recv.direct.defined() || moves.self_recv.unpack);
  auto splits_with_self = [&](std::vector<int64_t> splits, bool with_self) {
    splits[me] = with_self ? self_bytes : 0;
    return splits;
  };
  at::Tensor whole_send, whole_recv;
  bool include_self = false;
  for (bool with_self : {true, false}) {
    if (with_self && !self_describable) {
      continue;
    }
    at::Tensor s = whole_buffer(splits_with_self(out_splits, with_self), outgoing);
    at::Tensor r = x.mismatch ? at::Tensor() : whole_buffer(splits_with_self(in_splits, with_self), incoming);
    if (s.defined() || r.defined()) {
      whole_send = s;
      whole_recv = r;
      include_self = with_self;
      break;
    }
  }
  out_splits = splits_with_self(out_splits, include_self);
  in_splits = splits_with_self(in_splits, include_self);
  int64_t out_total = 0, in_total = 0;
  for (int64_t p = 0; p < world; ++p) {
    out_total += out_splits[p];
    in_total += in_splits[p];
  }
  at::Tensor out_buffer = whole_send.defined() ? whole_send : workspace(out_total, x.device, 0);
  at::Tensor in_buffer = whole_recv.defined() ? whole_recv : workspace(in_total, x.device, 2);
  if (!whole_send.defined()) {
    int64_t pos = 0;
    std::vector<PayloadAt> payloads;
    for (int64_t p = 0; p < world; ++p) {
      if (out_splits[p] > 0) {
        const Outgoing& out = p == me ? moves.self_send : moves.send[p];
        TORCH_INTERNAL_ASSERT(out.bytes == out_splits[p]);
        payloads.push_back({&out, pos});
        pos += out_splits[p];
      }
    }
    write_payloads(out_buffer, payloads);
  }
  all_to_all_bytes(x.pg, in_buffer, out_buffer, in_splits, out_splits);
  if (!include_self) {
    run_local(x);
  }
  int64_t pos = 0;
  for (int64_t p = 0; p < world; ++p) {
    if (p == me) {
      if (include_self) {
        const at::Tensor mine_back = in_buffer.narrow(0, pos, self_bytes);
        const Incoming& in = moves.self_recv;
        if (!in.direct.defined()) {
          in.unpack(mine_back);
        } else if (in.direct.data_ptr() != mine_back.data_ptr()) {
          in.direct.copy_(mine_back);
        }
        pos += self_bytes;
      }
      continue;
    }
    if (x.declared[p] == 0) {
      continue;
    }
    if (x.rides_in(p) || x.appended_in[p] > 0) {
      x.deliver(p, x.round_one_payload(p));
    } else {
      x.deliver(p, in_buffer.narrow(0, pos, x.declared[p]));
      pos += x.declared[p];
    }
  }
}

} // namespace

void round_two(Exchange& x) {
  bool needed = !x.fits;
  for (int64_t p = 0; p < x.world; ++p) {
    needed = needed || (p != x.me && x.field(p, kFits) == 0);
  }
  if (!needed) {
    comm_stats().single_round_ops += 1;
    run_local(x);
    for (int64_t p = 0; p < x.world; ++p) {
      if (p != x.me && x.declared[p] > 0) {
        x.deliver(p, x.round_one_payload(p));
      }
    }
    return;
  }
  // Every rank derives the same pattern from the same table, so all pick the same collective.
  const int64_t messages = round_two_messages(x.table.data(), x.world);
  int64_t largest = 0;
  for (int64_t r = 0; r < x.world; ++r) {
    largest = std::max(largest, x.field(r, kMaxMessage));
  }
  if (x.p2p && x.device.is_cpu() && (messages <= 2 * (x.world - 1) || largest >= kPointToPointFromBytes)) {
    point_to_point(x);
  } else {
    all_to_all(x);
  }
}

} // namespace comm
} // namespace torch_shard
