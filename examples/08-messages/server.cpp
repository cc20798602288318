// 08-messages, server: a send/recv ping-pong. Its first receive is posted on the
// incoming request, before accepting (ConnReq::recv), so the client's first message finds
// it; each later one is posted before the reply that provokes the client's next message.
#include "../common/common.hpp"

#include <rpmapp/rpmapp.hpp>

#include <fmt/core.h>

#include <array>
#include <cstdint>

constexpr int rounds = 5;
// One region for both directions: a receive slot and a send slot of one counter each.
constexpr std::size_t recv_offset = 0, send_offset = 8, counter_size = 8;

int main(int argc, char** argv) {
  std::string_view addr, port;
  if (!example::parse_args(argc, argv, addr, port)) return 2;

  auto peer = rpmapp::Peer::from_address(addr, rpmapp::AddressKind::local);
  if (!peer) return example::fail(peer.error());
  std::array<std::uint64_t, 2> slots{};
  auto mr = rpmapp::MrLocal::reg(*peer, slots.data(), sizeof slots,
                                 rpmapp::MrUsage::send | rpmapp::MrUsage::recv);
  if (!mr) return example::fail(mr.error());

  auto endpoint = example::listen_and_print(*peer, addr, port);
  if (!endpoint) return example::fail(endpoint.error());

  // The first receive is posted on the request, before accepting.
  auto post_first_recv = [&](rpmapp::ConnReq& req) { return req.recv(*mr, recv_offset, counter_size); };
  auto conn = example::accept_next(*endpoint, {}, post_first_recv);
  if (!conn) return example::fail(conn.error());
  auto cq = conn->cq();
  if (!cq) return example::fail(cq.error());

  bool send_pending = false;  // the previous reply's completion may still be on its way
  for (int round = 1; round <= rounds; ++round) {
    auto len = example::await_send_recv(*cq, send_pending, true);
    if (!len) return example::fail(len.error());
    const std::uint64_t value = slots[0];
    const std::uint64_t expected = 2 * static_cast<std::uint64_t>(round - 1);
    if (*len != counter_size || value != expected) {
      fmt::print(stderr, "error: round {}: received {} bytes, value {}, expected {}\n", round, *len,
                 value, expected);
      return 1;
    }
    if (round < rounds)
      if (auto ok = conn->recv(*mr, recv_offset, counter_size); !ok) return example::fail(ok.error());
    slots[1] = value + 1;
    if (auto ok = conn->send(*mr, send_offset, counter_size); !ok) return example::fail(ok.error());
    send_pending = true;
    fmt::print("round {}: received {}, replied {}\n", round, value, slots[1]);
  }
  if (auto ok = example::await_send_recv(*cq, send_pending, false); !ok) return example::fail(ok.error());

  if (auto ok = example::wait_closed_by_client(*conn); !ok) return example::fail(ok.error());
  if (auto ok = example::close_server(std::move(*conn), std::move(*mr), std::move(*endpoint)); !ok)
    return example::fail(ok.error());
  return 0;
}
