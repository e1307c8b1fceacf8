// Round 1 through a hub, group rank 0 (NOTE [ Round 1 through a hub ] in comm/round_one.cpp): the
// compact messages it relays, and the payloads that ride them.

#include <algorithm>
#include <cstring>
#include <functional>

#include <c10/util/Exception.h>

#include "comm/exchange_state.h"
#include "comm/process_group.h"

namespace torch_shard {
namespace comm {

constexpr int64_t kHub = 0;

// NOTE [ Hub messages ]
// Through the hub, round-1 messages carry only what is used, not W fixed blocks: gloo accepts a
// message shorter than the receive posted for it (never a longer one), so receivers post the largest
// possible size and senders send what they have.
//   rank -> hub:  W headers (row d: the header addressed to rank d), then its payloads that fit their
//                 slots in rank order, each at a multiple of 16 bytes, then a payload appended for the
//                 hub (NOTE [ Payloads riding the hub's messages ]).
//   hub -> rank d: the W headers addressed to d (row p: rank p's), then the payloads that fit from
//                 every rank p to d in rank order (16-byte aligned), then the hub's appended payload.
// Every size in it is in a header, so the receiver finds each payload without another message; the
// hub checks the sizes a peer's headers claim against what it posted before using them as offsets.

// NOTE [ Payloads riding the hub's messages ]
// A message of round 2 is one more hop, and on gloo a hop whose receive is posted late costs a
// rendezvous on top (the sender waits for the receiver's "ready" notice). A scatter from the hub or a
// gather to it (the usual root, group rank 0) can skip that hop: the payload travels IN the round-1
// message that already goes between the rank and the hub. gloo accepts a message shorter than the
// receive posted for it (never a longer one), which makes this safe with arguments nobody has checked:
//   * to the hub: a rank whose only message is for the hub, of at most kHubAppendMaxBytes, appends it
//     to its round-1 message and says so in its header (kAppended). The hub posts every round-1
//     receive kHubAppendMaxBytes larger than the largest message without it, so no sender can overrun
//     it. The payload is read only after the verdict, like a slot.
//   * from the hub: a rank that expects a payload from the hub of at most kHubAppendMaxBytes (and more
//     than the slot) posts its round-1 receive that much larger and says so (kRoom). The hub already
//     holds every header when it replies, so it reaches the verdict first; it appends a payload only
//     when that verdict passes, the payload is exactly the room the receiver made, and the pattern is
//     sparse (a dense reshard keeps its pipelined round 2 instead of packing before the replies). It
//     tells the receiver in its own header (kAppended).
// Both ends then skip that pair in round 2. The cap keeps the copies in and out of the round-1
// buffers (a direct round-2 message needs none) cheaper than the hop they save. Bigger payloads go in
// round 2, straight into the destination: sending them ahead of the hub's reply did not beat that on
// one host or two (docs/performance.md, "Figures behind design choices").
constexpr int64_t kHubAppendMaxBytes = int64_t{1} << 20;

namespace {

// The largest round-1 message of a hub exchange before any appended payload: W headers and a
// payload of at most the slot (a multiple of 16) for each peer.
int64_t hub_message_bound(int64_t world, int64_t slot_bytes) {
  return world * kHeaderBytes + (world - 1) * slot_bytes;
}

// The payload bytes the hub appends to its reply to each rank (0: none), given the headers addressed
// to it (row p: rank p's). See NOTE [ Payloads riding the hub's messages ].
std::vector<int64_t> hub_appends(const Exchange& x, const int64_t* table) {
  std::vector<int64_t> bytes(x.world, 0);
  if (x.failed || x.fits || !exchange_options().ride) {
    return bytes;
  }
  auto room_of = [&](int64_t r) { return table[r * kHeaderWords + kRoom]; };
  // Appended after the reply: exactly the room the receiver made (at most the cap).
  auto fits_room = [&](int64_t r) {
    const int64_t send = x.moves->send[r].bytes;
    return r != x.me && send > 0 && send == room_of(r) && room_of(r) <= kHubAppendMaxBytes;
  };
  bool any = false;
  for (int64_t r = 0; r < x.world; ++r) {
    any = any || fits_room(r);
  }
  if (!any || round_two_messages(table, x.world) > 2 * (x.world - 1) ||
      !agreed(table, x.world, x.op, x.agreement.check, x.me)) {
    return bytes;
  }
  for (int64_t r = 0; r < x.world; ++r) {
    bytes[r] = fits_room(r) ? x.moves->send[r].bytes : 0;
  }
  return bytes;
}

// The hub's side: receives every rank's message, checks what it claims, builds and sends each rank's
// reply. Sets x.recv1 to its own share and x.hub_messages to every rank's whole round-1 message;
// x.appended_out receives the payload bytes appended to each reply.
void serve_as_hub(Exchange& x) {
  const int64_t world = x.world;
  const int64_t me = x.me;
  const int64_t headers_bytes = world * kHeaderBytes;
  const int64_t longest = hub_message_bound(world, x.slot_bytes) + kHubAppendMaxBytes;
  at::Tensor posted = workspace(world * longest, x.device, 3).view({world, longest});
  std::vector<at::Tensor>& message = x.hub_messages;
  message.assign(world, at::Tensor());
  std::vector<c10::intrusive_ptr<c10d::Work>> incoming(world);
  for (int64_t p = 0; p < world; ++p) {
    if (p != me) {
      message[p] = posted.select(0, p);
      incoming[p] = recv_bytes(x.pg, message[p], p);
    }
  }
  message[me] = x.send1;
  // head[(p * world + d) * kHeaderWords + f]: field f of rank p's header addressed to rank d.
  std::vector<int64_t> head(world * world * kHeaderWords, 0);
  auto hdr = [&](int64_t p, int64_t d, int64_t f) -> int64_t& {
    return head[(p * world + d) * kHeaderWords + f];
  };
  // Where rank p's payload for rank d starts in p's message (-1: none there).
  std::vector<int64_t> source(world * world, -1);
  for (int64_t p = 0; p < world; ++p) {
    bool arrived = true;
    if (p != me) {
      try {
        incoming[p]->wait();
      } catch (const std::exception&) {
        arrived = false;
      }
    }
    if (arrived) {
      std::memcpy(&hdr(p, 0, 0), message[p].const_data_ptr(), headers_bytes);
      // The sizes come from another process: check them before they become offsets.
      int64_t end = headers_bytes;
      for (int64_t d = 0; d < world && arrived; ++d) {
        const int64_t bytes = hdr(p, d, kBytes);
        const int64_t appended = hdr(p, d, kAppended);
        // Only a rank whose payloads did not fit appends one, and only for the hub.
        arrived = bytes >= 0 && hdr(p, d, kRoom) >= 0 && hdr(p, d, kRoom) <= kHubAppendMaxBytes &&
                  appended >= 0 && appended <= kHubAppendMaxBytes &&
                  (appended == 0 || (d == me && hdr(p, d, kFits) == 0 && appended == bytes));
        if (arrived && hdr(p, d, kFits) != 0 && d != p && bytes > 0) {
          arrived = bytes <= x.slot_bytes;
          source[p * world + d] = end;
          end += padded16(bytes);
        }
      }
      arrived = arrived && end <= hub_message_bound(world, x.slot_bytes);
    }
    if (!arrived) {
      // The peer is gone (or sent what no torch_shard rank sends): every rank hears it from its header,
      // so none waits on it.
      for (int64_t d = 0; d < world; ++d) {
        std::fill_n(&hdr(p, d, 0), kHeaderWords, 0);
        hdr(p, d, kOp) = static_cast<int64_t>(x.op);
        hdr(p, d, kError) = static_cast<int64_t>(ErrorCode::kLost);
        source[p * world + d] = -1;
      }
    }
  }
  // The headers addressed to the hub decide what it appends for each rank.
  std::vector<int64_t> table(world * kHeaderWords);
  for (int64_t p = 0; p < world; ++p) {
    std::memcpy(table.data() + p * kHeaderWords, &hdr(p, me, 0), kHeaderBytes);
  }
  x.appended_out = hub_appends(x, table.data());
  std::vector<int64_t> reply_at(world + 1, 0);
  for (int64_t d = 0; d < world; ++d) {
    int64_t size = headers_bytes + x.appended_out[d];
    for (int64_t p = 0; p < world; ++p) {
      size += source[p * world + d] >= 0 ? padded16(hdr(p, d, kBytes)) : 0;
    }
    reply_at[d + 1] = reply_at[d] + size;
  }
  at::Tensor reply = workspace(reply_at[world], x.device, 4);
  std::vector<c10::intrusive_ptr<c10d::Work>> outgoing;
  // Each reply goes out as soon as it is built; the hub's own share last.
  for (int64_t k = 1; k <= world; ++k) {
    const int64_t d = (me + k) % world;
    char* base = static_cast<char*>(reply.data_ptr()) + reply_at[d];
    int64_t at = headers_bytes;
    for (int64_t p = 0; p < world; ++p) {
      std::memcpy(base + p * kHeaderBytes, &hdr(p, d, 0), kHeaderBytes);
      if (const int64_t from = source[p * world + d]; from >= 0) {
        std::memcpy(base + at, static_cast<const char*>(message[p].const_data_ptr()) + from,
                    static_cast<size_t>(hdr(p, d, kBytes)));
        at += padded16(hdr(p, d, kBytes));
      }
    }
    at::Tensor whole = reply.narrow(0, reply_at[d], reply_at[d + 1] - reply_at[d]);
    if (x.appended_out[d] > 0) {
      // The hub's own header to d says how much it appended after the slots.
      reinterpret_cast<int64_t*>(base + me * kHeaderBytes)[kAppended] = x.appended_out[d];
      x.write_payload(d, whole.narrow(0, at, x.appended_out[d]));
    }
    if (d == me) {
      x.recv1 = whole;
      continue;
    }
    try {
      outgoing.push_back(send_bytes(x.pg, whole, d));
    } catch (const std::exception&) {
      // A lost peer; the others still get their replies (and the verdict names it).
    }
  }
  for (auto& work : outgoing) {
    try {
      work->wait();
    } catch (const std::exception&) {
    }
  }
}

} // namespace

void prepare_hub_payloads(Exchange& x) {
  if (!x.via_hub || x.me == kHub || x.failed) {
    return;
  }
  if (!exchange_options().ride) {
    return;
  }
  const int64_t expected = x.moves->recv[kHub].bytes; // kDeclared (< 0) never makes room
  if (expected > x.slot_bytes && expected <= kHubAppendMaxBytes) {
    x.room = expected;
  }
  const int64_t bytes = x.moves->send[kHub].bytes;
  if (!x.fits && x.out_degree == 1 && bytes > 0 && bytes <= kHubAppendMaxBytes) {
    x.to_hub = bytes;
  }
}

void hub_round_one(Exchange& x) {
  const int64_t world = x.world;
  const int64_t headers_bytes = world * kHeaderBytes;
  device_words_into_headers(x); // the hub's messages are built on the host
  // See NOTE [ Hub messages ].
  int64_t size = headers_bytes + x.to_hub;
  for (int64_t p = 0; p < world && x.fits; ++p) {
    size += p != x.me ? padded16(x.moves->send[p].bytes) : 0;
  }
  x.send1 = workspace(size, x.device, 0);
  std::memcpy(x.send1.data_ptr(), x.headers.data(), headers_bytes);
  int64_t at = headers_bytes;
  std::vector<PayloadAt> payloads;
  for (int64_t p = 0; p < world && x.fits; ++p) {
    if (p != x.me && x.moves->send[p].bytes > 0) {
      payloads.push_back({&x.moves->send[p], at});
      at += padded16(x.moves->send[p].bytes);
    }
  }
  write_payloads(x.send1, payloads);
  if (x.to_hub > 0) {
    x.write_payload(kHub, x.send1.narrow(0, at, x.to_hub));
  }
  x.appended_out.assign(world, 0);
  comm_stats().collectives += 1;
  if (x.me == kHub) {
    serve_as_hub(x);
  } else {
    x.recv1 = workspace(hub_message_bound(world, x.slot_bytes) + x.room, x.device, 1);
    auto sent = send_bytes(x.pg, x.send1, kHub);
    auto received = recv_bytes(x.pg, x.recv1, kHub);
    sent->wait();
    received->wait();
    x.appended_out[kHub] = x.to_hub;
  }
  // Built on the host (the hub is a CPU-only mode): no device memory to read.
  TORCH_INTERNAL_ASSERT(x.recv1.is_cpu());
  x.table.assign(world * kHeaderWords, 0);
  std::memcpy(x.table.data(), x.recv1.const_data_ptr(), headers_bytes);
}

} // namespace comm
} // namespace torch_shard
