// 03-epoll-server, server: serves several clients at once from ONE epoll loop that
// watches the endpoint's fd (connection requests) and each connection's fd (its events),
// with the non-blocking try_next_conn_req and try_next_event.
#include "../common/common.hpp"

#include <rpmapp/rpmapp.hpp>

#include <fmt/core.h>

#include <sys/epoll.h>
#include <unistd.h>

#include <cerrno>
#include <map>
#include <string>

constexpr int clients = 3;  // the server exits after this many clients have left

namespace {

// An epoll instance, closed on scope exit.
struct Epoll {
  int fd = epoll_create1(EPOLL_CLOEXEC);
  ~Epoll() {
    if (fd >= 0) ::close(fd);
  }
  bool add(int watched) const {
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.fd = watched;
    return epoll_ctl(fd, EPOLL_CTL_ADD, watched, &ev) == 0;
  }
  void remove(int watched) const { epoll_ctl(fd, EPOLL_CTL_DEL, watched, nullptr); }
};

}  // namespace

int main(int argc, char** argv) {
  std::string_view addr, port;
  if (!example::parse_args(argc, argv, addr, port)) return 2;

  auto peer = rpmapp::Peer::from_address(addr, rpmapp::AddressKind::local);
  if (!peer) return example::fail(peer.error());
  auto endpoint = rpmapp::Endpoint::listen(*peer, addr, port);
  if (!endpoint) return example::fail(endpoint.error());
  auto endpoint_fd = endpoint->fd();
  if (!endpoint_fd) return example::fail(endpoint_fd.error());

  Epoll epoll;
  if (epoll.fd < 0) return example::fail_errno("epoll_create1");
  if (!epoll.add(*endpoint_fd)) return example::fail_errno("epoll_ctl");
  if (auto ok = example::print_listening(*endpoint); !ok) return example::fail(ok.error());

  std::map<int, rpmapp::Conn> conns;  // by the connection's event fd
  int accepted = 0, served = 0;
  while (served < clients) {
    epoll_event ready[8];
    const int n = epoll_wait(epoll.fd, ready, 8, static_cast<int>(example::wait_bound.count()));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return example::fail_errno("epoll_wait");
    if (n == 0) {
      fmt::print(stderr, "error: nothing happened within {} ms\n", example::wait_bound.count());
      return 1;
    }
    for (int i = 0; i < n; ++i) {
      const int fd = ready[i].data.fd;
      if (fd == *endpoint_fd) {
        // Take every pending request; no_event means the channel is drained.
        for (;;) {
          auto req = endpoint->try_next_conn_req();
          if (!req && req.error() == rpmapp::errc::no_event) break;
          if (!req) return example::fail(req.error());
          auto received = req->private_data();
          if (!received) return example::fail(received.error());
          const std::string reply = fmt::format("welcome, client #{}", ++accepted);
          fmt::print("request #{}: \"{}\"\n", accepted, rpmapp::as_text(*received));
          auto conn = std::move(*req).connect(rpmapp::as_bytes(reply));
          if (!conn) return example::fail(conn.error());
          auto conn_fd = conn->fd();
          if (!conn_fd) return example::fail(conn_fd.error());
          if (!epoll.add(*conn_fd)) return example::fail_errno("epoll_ctl");
          conns.emplace(*conn_fd, std::move(*conn));
        }
        continue;
      }
      auto it = conns.find(fd);
      if (it == conns.end()) continue;
      auto event = it->second.try_next_event();
      if (!event && event.error() == rpmapp::errc::no_event) continue;
      if (!event) return example::fail(event.error());
      fmt::print("connection on fd {}: {}\n", fd, rpmapp::to_string(*event));
      if (*event == rpmapp::ConnEvent::established) continue;
      if (*event != rpmapp::ConnEvent::closed) {
        fmt::print(stderr, "error: unexpected event {}\n", rpmapp::to_string(*event));
        return 1;
      }
      epoll.remove(fd);
      auto closed = std::move(it->second).close();
      conns.erase(it);
      if (!closed) return example::fail(closed.error());
      ++served;
    }
  }
  fmt::print("served {} clients\n", served);
  if (auto ok = std::move(*endpoint).shutdown(); !ok) return example::fail(ok.error());
  return 0;
}
