// 14-asio, server: rpmapp inside a standalone Asio program. One asio::io_context watches
// the endpoint's fd and each connection's fd (asio::posix::stream_descriptor, async_wait
// for readable); its handlers take what is pending with rpmapp's non-blocking calls
// (Endpoint::try_next_conn_req, Conn::try_next_event) until no_event, then wait again.
// Each client's private data is echoed in the accept. The server exits after 3 clients
// have disconnected.
#include "../common/common.hpp"
#include "watched_fd.hpp"

#include <rpmapp/rpmapp.hpp>

#include <asio/io_context.hpp>

#include <fmt/core.h>

#include <map>
#include <memory>
#include <optional>
#include <string>

constexpr int clients = 3;
constexpr std::string_view hello_prefix = "hello from the 14-asio client";
const auto run_bound = 2 * example::wait_bound;

namespace {

class Server {
 public:
  Server(asio::io_context& io, rpmapp::Endpoint endpoint) : io_(io), endpoint_(std::move(endpoint)), watched_(io) {}

  /// Starts watching the endpoint.
  void start() {
    auto fd = endpoint_.fd();
    if (!fd) return failed(fd.error());
    if (auto ec = watched_.watch(*fd)) return failed_asio("stream_descriptor::assign", ec);
    wait_for_requests();
  }

  /// Served every client: shuts the endpoint down (its fd released from Asio first).
  rpmapp::expected<void> finish() {
    watched_.release();
    return std::move(endpoint_).shutdown();
  }

  int served() const { return served_; }
  const std::optional<rpmapp::Error>& failure() const { return failure_; }

 private:
  struct Connection {
    Connection(asio::io_context& io, rpmapp::Conn c) : conn(std::move(c)), watched(io) {}
    rpmapp::Conn conn;
    example::WatchedFd watched;  // declared after the Conn: released before the fd closes
  };

  void failed(const rpmapp::Error& error) {
    if (!failure_) failure_ = error;
    io_.stop();
  }
  void failed_asio(const char* call, const asio::error_code& ec) {
    failed(rpmapp::Error(rpmapp::errc::provider, ec.value(), call, ec.message()));
  }

  void wait_for_requests() {
    watched_.when_readable([this](const asio::error_code& ec) {
      if (ec == asio::error::operation_aborted) return;  // released
      if (ec) return failed_asio("async_wait", ec);
      take_requests();
    });
  }

  // Every pending request; no_event: the channel is drained, wait for the next wake-up.
  void take_requests() {
    for (;;) {
      auto req = endpoint_.try_next_conn_req();
      if (!req && req.error() == rpmapp::errc::no_event) break;
      if (!req) return failed(req.error());
      if (accepted_ == clients) continue;  // not ours to serve: dropping it rejects it
      const int number = ++accepted_;
      auto data = req->private_data();
      if (!data) return failed(data.error());
      const std::string hello(rpmapp::as_text(*data));
      fmt::print("request #{}: \"{}\"\n", number, hello);
      if (!hello.starts_with(hello_prefix))
        return failed(rpmapp::Error(rpmapp::errc::unknown, 0, "14-asio-server", "unexpected private data"));
      const std::string echo = fmt::format("echo: {}", hello);
      auto conn = std::move(*req).connect(rpmapp::as_bytes(echo));
      if (!conn) return failed(conn.error());
      auto fd = conn->fd();
      if (!fd) return failed(fd.error());
      Connection& c = connections_.try_emplace(number, io_, std::move(*conn)).first->second;
      if (auto ec = c.watched.watch(*fd)) return failed_asio("stream_descriptor::assign", ec);
      wait_for_events(number, c);
    }
    if (accepted_ < clients) wait_for_requests();
  }

  void wait_for_events(int number, Connection& c) {
    c.watched.when_readable([this, number](const asio::error_code& ec) {
      if (ec == asio::error::operation_aborted) return;
      if (ec) return failed_asio("async_wait", ec);
      take_events(number);
    });
  }

  void take_events(int number) {
    Connection& c = connections_.at(number);
    for (;;) {
      auto event = c.conn.try_next_event();
      if (!event && event.error() == rpmapp::errc::no_event) return wait_for_events(number, c);
      if (!event) return failed(event.error());
      fmt::print("connection {}: {}\n", number, rpmapp::to_string(*event));
      if (*event == rpmapp::ConnEvent::established) continue;
      if (*event != rpmapp::ConnEvent::closed)
        return failed(rpmapp::Error(rpmapp::errc::unknown, 0, "14-asio-server",
                                    fmt::format("unexpected event {}", rpmapp::to_string(*event))));
      c.watched.release();
      auto closed = std::move(c.conn).close();
      connections_.erase(number);
      if (!closed) return failed(closed.error());
      ++served_;
      return;  // nothing waits on this connection any more
    }
  }

  asio::io_context& io_;
  rpmapp::Endpoint endpoint_;
  example::WatchedFd watched_;  // the endpoint's fd
  std::map<int, Connection> connections_;  // by number, from 1
  int accepted_ = 0, served_ = 0;
  std::optional<rpmapp::Error> failure_;
};

}  // namespace

int main(int argc, char** argv) {
  std::string_view addr, port;
  if (!example::parse_args(argc, argv, addr, port)) return 2;

  auto peer = rpmapp::Peer::from_address(addr, rpmapp::AddressKind::local);
  if (!peer) return example::fail(peer.error());
  auto endpoint = example::listen_and_print(*peer, addr, port);
  if (!endpoint) return example::fail(endpoint.error());

  asio::io_context io;
  Server server(io, std::move(*endpoint));
  server.start();
  // Returns when nothing is left to wait for (every client served), on io.stop() (an
  // error), or after run_bound.
  io.run_for(run_bound);
  if (server.failure()) return example::fail(*server.failure());
  if (server.served() < clients) {
    fmt::print(stderr, "error: {} of {} clients served within {} ms\n", server.served(), clients, run_bound.count());
    return 1;
  }
  fmt::print("served {} clients\n", server.served());
  if (auto ok = server.finish(); !ok) return example::fail(ok.error());
  return 0;
}
