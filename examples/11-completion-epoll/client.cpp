// 11-completion-epoll, client: posts a receive before connecting, sends one message,
// waits for the server's reply and then for the server to disconnect.
#include "../common/common.hpp"

#include <rpmapp/rpmapp.hpp>

#include <fmt/core.h>

#include <unistd.h>

#include <algorithm>
#include <array>
#include <string>

constexpr std::size_t slot_size = 64, recv_offset = 0, send_offset = slot_size;

int main(int argc, char** argv) {
  std::string_view addr, port;
  if (!example::parse_args(argc, argv, addr, port)) return 2;

  auto peer = rpmapp::Peer::from_address(addr, rpmapp::AddressKind::remote);
  if (!peer) return example::fail(peer.error());
  std::array<std::byte, 2 * slot_size> memory{};
  const std::string message = fmt::format("hello from the 11-completion-epoll client, pid {}", getpid());
  std::memcpy(memory.data() + send_offset, message.c_str(), message.size() + 1);
  auto mr = rpmapp::MrLocal::reg(*peer, memory, rpmapp::MrUsage::send | rpmapp::MrUsage::recv);
  if (!mr) return example::fail(mr.error());

  auto resolve = [&]() -> rpmapp::expected<rpmapp::ConnReq> {
    auto req = rpmapp::ConnReq::to(*peer, addr, port);
    if (!req) return req;
    if (auto ok = req->recv(*mr, recv_offset, slot_size); !ok) return rpmapp::unexpected(ok.error());
    return req;
  };
  auto conn = example::connect_with_retry(resolve, {});
  if (!conn) return example::fail(conn.error());
  auto cq = conn->cq();
  if (!cq) return example::fail(cq.error());

  if (auto ok = conn->send(*mr, send_offset, message.size() + 1); !ok) return example::fail(ok.error());
  auto len = example::await_send_recv(*cq, true, true);
  if (!len) return example::fail(len.error());
  const std::string_view reply = rpmapp::as_text(std::span(memory).first(std::min<std::size_t>(*len, slot_size)));
  fmt::print("sent \"{}\"\n", message);
  fmt::print("received \"{}\"\n", reply);
  if (!reply.starts_with("welcome, connection ")) {
    fmt::print(stderr, "error: unexpected reply\n");
    return 1;
  }

  // The server disconnects once its reply has completed; this side then disconnects too.
  if (auto ok = example::expect_event(*conn, rpmapp::ConnEvent::closed); !ok) return example::fail(ok.error());
  if (auto ok = conn->disconnect(); !ok) return example::fail(ok.error());
  if (auto ok = std::move(*conn).close(); !ok) return example::fail(ok.error());
  fmt::print("disconnected by the server\n");
  return 0;
}
