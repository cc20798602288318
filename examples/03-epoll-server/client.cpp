// 03-epoll-server, client: resolves the server's address without blocking
// (ConnReq::start, then poll on PendingConnReq::fd), connects, reads the server's reply.
#include "../common/common.hpp"

#include <rpmapp/rpmapp.hpp>

#include <fmt/format.h>

#include <poll.h>
#include <unistd.h>

#include <string>

namespace {

// One outgoing request, resolved by polling the pending request's fd.
rpmapp::expected<rpmapp::ConnReq> resolve(const rpmapp::Peer& peer, std::string_view addr,
                                          std::string_view port) {
  auto pending = rpmapp::ConnReq::start(peer, addr, port);
  if (!pending) return rpmapp::unexpected(pending.error());
  for (;;) {
    auto fd = pending->fd();
    if (!fd) return rpmapp::unexpected(fd.error());
    pollfd pfd{*fd, POLLIN, 0};
    if (poll(&pfd, 1, static_cast<int>(example::wait_bound.count())) == 0)
      return rpmapp::unexpected(rpmapp::Error(rpmapp::errc::no_event, 0, "poll",
                                              "address and route resolution took too long"));
    // no_event: still resolving, `pending` stays usable; anything else consumes it.
    auto req = std::move(*pending).try_wait();
    if (req || req.error() != rpmapp::errc::no_event) return req;
  }
}

}  // namespace

int main(int argc, char** argv) {
  std::string_view addr, port;
  if (!example::parse_args(argc, argv, addr, port)) return 2;

  auto peer = rpmapp::Peer::from_address(addr, rpmapp::AddressKind::remote);
  if (!peer) return example::fail(peer.error());

  const std::string hello = fmt::format("hello from client pid {}", getpid());
  auto conn = example::connect_with_retry([&] { return resolve(*peer, addr, port); },
                                          rpmapp::as_bytes(hello));
  if (!conn) return example::fail(conn.error());
  auto received = conn->private_data();
  if (!received) return example::fail(received.error());
  fmt::print("received from the server: \"{}\"\n", rpmapp::as_text(*received));
  if (!example::has_prefix(*received, "welcome, client #")) {
    fmt::print(stderr, "error: unexpected private data from the server\n");
    return 1;
  }

  if (auto ok = conn->disconnect(); !ok) return example::fail(ok.error());
  if (auto ok = example::expect_event(*conn, rpmapp::ConnEvent::closed); !ok)
    return example::fail(ok.error());
  if (auto ok = std::move(*conn).close(); !ok) return example::fail(ok.error());
  fmt::print("disconnected\n");
  return 0;
}
