// 10-srq, server: one shared receive queue (Srq) with its own receive CQ serves every
// connection. Receives are posted to the queue once, before any client connects; each
// completion comes tagged with the connection the message came by (its ConnId, read with
// Cq::next_for and a span of tags) and says which receive it filled (wr_id). The
// connections also share one rdma_cm event channel (SharedEventChannel): no fd of their
// own; each still waits for its own events.
#include "../common/common.hpp"

#include <rpmapp/rpmapp.hpp>

#include <fmt/core.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <string>
#include <vector>

constexpr int clients = 2;
constexpr std::string_view expected_prefix = "hello from the 10-srq client";
// A pool of receives, more than the clients need: each is posted again once consumed.
constexpr std::size_t slot_size = 256;
constexpr std::size_t slots = 64;

namespace {

struct Client {
  rpmapp::Conn conn;
  rpmapp::ConnId id;
  std::string source;  // "ADDR port PORT"
  int messages = 0;
};

}  // namespace

int main(int argc, char** argv) {
  std::string_view addr, port;
  if (!example::parse_args(argc, argv, addr, port)) return 2;

  auto peer = rpmapp::Peer::from_address(addr, rpmapp::AddressKind::local);
  if (!peer) return example::fail(peer.error());
  auto srq = rpmapp::Srq::create(*peer, {.rq_size = slots, .rcq_size = slots});
  if (!srq) return example::fail(srq.error());
  static std::array<std::byte, slots * slot_size> memory{};
  auto mr = rpmapp::MrLocal::reg(*peer, memory, rpmapp::MrUsage::recv);
  if (!mr) return example::fail(mr.error());
  for (std::size_t slot = 0; slot < slots; ++slot)
    if (auto ok = srq->recv(*mr, slot * slot_size, slot_size, slot); !ok) return example::fail(ok.error());

  auto endpoint = example::listen_and_print(*peer, addr, port);
  if (!endpoint) return example::fail(endpoint.error());

  // Every connection receives through the queue (Conn::recv would be inval on them), and
  // gets its events through the shared channel.
  auto events = rpmapp::SharedEventChannel::create();
  if (!events) return example::fail(events.error());
  rpmapp::ConnConfig config;
  config.srq = &*srq;
  config.shared_event_channel = &*events;
  std::vector<Client> accepted;
  for (int i = 1; i <= clients; ++i) {
    auto req = endpoint->next_conn_req_for(example::wait_bound, config);
    if (!req) return example::fail(req.error());
    auto from = req->peer_address();
    if (!from) return example::fail(from.error());
    auto from_port = req->peer_port();
    if (!from_port) return example::fail(from_port.error());
    auto conn = std::move(*req).connect();
    if (!conn) return example::fail(conn.error());
    if (auto ok = example::expect_event(*conn, rpmapp::ConnEvent::established); !ok)
      return example::fail(ok.error());
    auto id = conn->id();
    if (!id) return example::fail(id.error());
    Client client{std::move(*conn), *id, fmt::format("{} port {}", *from, *from_port)};
    fmt::print("connection {} from {}\n", i, client.source);
    accepted.push_back(std::move(client));
  }

  auto on_channel = events->connections();
  if (!on_channel) return example::fail(on_channel.error());
  fmt::print("{} connections on one event channel\n", *on_channel);

  // The messages, in whatever order they came; all in the queue's receive CQ.
  auto rcq = srq->rcq();
  if (!rcq) return example::fail(rcq.error());
  for (int m = 0; m < clients; ++m) {
    ibv_wc received{};
    rpmapp::ConnId by;  // the connection of the completion: the queue is shared
    auto got = rcq->next_for(std::span(&received, 1), std::span(&by, 1), example::wait_bound);
    if (!got) return example::fail(got.error());
    if (auto ok = rpmapp::check(received); !ok) return example::fail(ok.error());
    auto it = std::find_if(accepted.begin(), accepted.end(), [&](const Client& c) { return c.id == by; });
    if (it == accepted.end() || received.opcode != IBV_WC_RECV || received.wr_id >= slots || received.byte_len > slot_size) {
      fmt::print(stderr, "error: a {} completion of connection {}, wr_id {}, {} bytes\n", rpmapp::to_string(received.opcode),
                 by.value, received.wr_id, received.byte_len);
      return 1;
    }
    const auto bytes = std::span(memory).subspan(received.wr_id * slot_size, received.byte_len);
    const std::string_view text = rpmapp::as_text(bytes);
    ++it->messages;
    fmt::print("message from connection {} ({}, receive {}): \"{}\"\n", it - accepted.begin() + 1,
               it->source, received.wr_id, text);
    if (!text.starts_with(expected_prefix)) {
      fmt::print(stderr, "error: unexpected message\n");
      return 1;
    }
    // The slot is read: back to the pool.
    if (auto ok = srq->recv(*mr, received.wr_id * slot_size, slot_size, received.wr_id); !ok)
      return example::fail(ok.error());
  }
  for (auto& client : accepted)
    if (client.messages != 1) {
      fmt::print(stderr, "error: {} sent {} messages, not 1\n", client.source, client.messages);
      return 1;
    }

  for (auto& client : accepted) {
    if (auto ok = example::expect_event(client.conn, rpmapp::ConnEvent::closed); !ok)
      return example::fail(ok.error());
    if (auto ok = std::move(client.conn).close(); !ok) return example::fail(ok.error());
  }
  fmt::print("served {} clients, {} messages through one shared receive queue and one event channel\n", clients,
             clients);
  // The unused receives are flushed with the queue.
  if (auto ok = std::move(*srq).close(); !ok) return example::fail(ok.error());
  if (auto ok = std::move(*mr).dereg(); !ok) return example::fail(ok.error());
  if (auto ok = std::move(*endpoint).shutdown(); !ok) return example::fail(ok.error());
  return 0;
}
