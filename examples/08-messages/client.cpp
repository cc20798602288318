// 08-messages, client: sends a counter, receives it incremented by the server, sends it
// incremented again, for a few rounds. Its first receive is posted on the outgoing request
// before connecting (ConnReq::recv); each later one before the message it answers.
#include "../common/common.hpp"

#include <rpmapp/rpmapp.hpp>

#include <fmt/core.h>

#include <array>
#include <cstdint>

constexpr int rounds = 5;
constexpr std::size_t recv_offset = 0, send_offset = 8, counter_size = 8;

int main(int argc, char** argv) {
  std::string_view addr, port;
  if (!example::parse_args(argc, argv, addr, port)) return 2;

  auto peer = rpmapp::Peer::from_address(addr, rpmapp::AddressKind::remote);
  if (!peer) return example::fail(peer.error());
  std::array<std::uint64_t, 2> slots{};
  auto mr = rpmapp::MrLocal::reg(*peer, slots.data(), sizeof slots,
                                 rpmapp::MrUsage::send | rpmapp::MrUsage::recv);
  if (!mr) return example::fail(mr.error());

  // Each attempt is a new request, and gets its own receive.
  auto resolve = [&]() -> rpmapp::expected<rpmapp::ConnReq> {
    auto req = rpmapp::ConnReq::to(*peer, addr, port);
    if (!req) return req;
    if (auto ok = req->recv(*mr, recv_offset, counter_size); !ok) return rpmapp::unexpected(ok.error());
    return req;
  };
  auto conn = example::connect_with_retry(resolve, {});
  if (!conn) return example::fail(conn.error());
  auto cq = conn->cq();
  if (!cq) return example::fail(cq.error());

  std::uint64_t counter = 0;
  for (int round = 1; round <= rounds; ++round) {
    if (round > 1)
      if (auto ok = conn->recv(*mr, recv_offset, counter_size); !ok) return example::fail(ok.error());
    slots[1] = counter;
    if (auto ok = conn->send(*mr, send_offset, counter_size); !ok) return example::fail(ok.error());
    auto len = example::await_send_recv(*cq, true, true);
    if (!len) return example::fail(len.error());
    if (*len != counter_size || slots[0] != counter + 1) {
      fmt::print(stderr, "error: round {}: received {} bytes, value {}, expected {}\n", round, *len,
                 slots[0], counter + 1);
      return 1;
    }
    fmt::print("round {}: sent {}, received {}\n", round, counter, slots[0]);
    counter = slots[0] + 1;
  }

  if (auto ok = example::disconnect_and_close(*conn); !ok) return example::fail(ok.error());
  return 0;
}
