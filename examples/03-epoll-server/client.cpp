// 03-epoll-server, client: resolves the server's address without blocking
// (ConnReq::start, then poll on PendingConnReq::fd), connects, reads the server's reply.
#include "../common/common.hpp"

#include <rpmapp/rpmapp.hpp>

#include <fmt/core.h>

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
  if (int status = example::check_server_data(*conn, "welcome, client #"); status != 0)
    return status;

  if (auto ok = example::disconnect_and_close(*conn); !ok) return example::fail(ok.error());
  return 0;
}
