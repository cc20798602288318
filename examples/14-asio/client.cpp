// 14-asio, client: rpmapp inside a standalone Asio program. The outgoing request resolves
// without blocking (ConnReq::start; Asio watches PendingConnReq::fd, the handler calls
// try_wait), then the connection's fd is watched the same way (Conn::try_next_event).
// It checks the server's echo of its private data and disconnects. A rejected or
// unreachable attempt (the server may not listen yet) is retried after an asio timer.
#include "../common/common.hpp"
#include "watched_fd.hpp"

#include <rpmapp/rpmapp.hpp>

#include <asio/io_context.hpp>
#include <asio/steady_timer.hpp>

#include <fmt/core.h>

#include <unistd.h>

#include <optional>
#include <string>

const auto run_bound = 2 * example::wait_bound;

namespace {

class Client {
 public:
  Client(asio::io_context& io, const rpmapp::Peer& peer, std::string_view addr, std::string_view port)
      : io_(io), peer_(peer), addr_(addr), port_(port), watched_(io), retry_(io),
        hello_(fmt::format("hello from the 14-asio client, pid {}", getpid())) {}

  /// Starts an attempt: resolution first.
  void start() {
    ++attempt_;
    auto pending = rpmapp::ConnReq::start(peer_, addr_, port_);
    if (!pending) return failed(pending.error());
    pending_ = std::move(*pending);
    watch_resolution();
  }

  bool done() const { return done_; }
  const std::optional<rpmapp::Error>& failure() const { return failure_; }

 private:
  void failed(const rpmapp::Error& error) {
    if (!failure_) failure_ = error;
    io_.stop();
  }
  void failed_asio(const char* call, const asio::error_code& ec) {
    failed(rpmapp::Error(rpmapp::errc::provider, ec.value(), call, ec.message()));
  }

  void watch_resolution() {
    auto fd = pending_->fd();
    if (!fd) return failed(fd.error());
    if (auto ec = watched_.watch(*fd)) return failed_asio("stream_descriptor::assign", ec);
    watched_.when_readable([this](const asio::error_code& ec) {
      if (ec == asio::error::operation_aborted) return;
      if (ec) return failed_asio("async_wait", ec);
      // try_wait consumes the request unless resolution is still in progress, and then
      // closes its fd: release it from Asio first, and watch it again if it is still open.
      watched_.release();
      auto req = std::move(*pending_).try_wait();
      if (!req && req.error() == rpmapp::errc::no_event && *pending_) return watch_resolution();
      pending_.reset();
      if (!req) return failed(req.error());
      connect(std::move(*req));
    });
  }

  void connect(rpmapp::ConnReq req) {
    auto conn = std::move(req).connect(rpmapp::as_bytes(hello_));
    if (!conn) return failed(conn.error());
    conn_ = std::move(*conn);
    auto fd = conn_->fd();
    if (!fd) return failed(fd.error());
    if (auto ec = watched_.watch(*fd)) return failed_asio("stream_descriptor::assign", ec);
    wait_for_events();
  }

  void wait_for_events() {
    watched_.when_readable([this](const asio::error_code& ec) {
      if (ec == asio::error::operation_aborted) return;
      if (ec) return failed_asio("async_wait", ec);
      take_events();
    });
  }

  // Every pending event; no_event: wait for the next wake-up.
  void take_events() {
    for (;;) {
      auto event = conn_->try_next_event();
      if (!event && event.error() == rpmapp::errc::no_event) return wait_for_events();
      if (!event) return failed(event.error());
      switch (*event) {
        case rpmapp::ConnEvent::established: {
          auto data = conn_->private_data();
          if (!data) return failed(data.error());
          const std::string_view echo = rpmapp::as_text(*data);
          fmt::print("received \"{}\"\n", echo);
          if (echo != "echo: " + hello_)
            return failed(rpmapp::Error(rpmapp::errc::unknown, 0, "14-asio-client", "the server's echo differs"));
          if (auto ok = conn_->disconnect(); !ok) return failed(ok.error());
          continue;
        }
        case rpmapp::ConnEvent::closed:
          close("disconnected");
          return;
        case rpmapp::ConnEvent::rejected:
        case rpmapp::ConnEvent::unreachable:
          if (attempt_ < example::connect_attempts) {
            fmt::print("attempt {}: connection {}, retrying\n", attempt_, rpmapp::to_string(*event));
            if (auto ok = close(nullptr); !ok) return;
            retry_.expires_after(std::chrono::milliseconds(500));
            retry_.async_wait([this](const asio::error_code& ec) {
              if (ec == asio::error::operation_aborted) return;
              if (ec) return failed_asio("steady_timer::async_wait", ec);
              start();
            });
            return;
          }
          [[fallthrough]];
        default:
          return failed(rpmapp::Error(rpmapp::errc::unknown, 0, "14-asio-client",
                                      fmt::format("connection {} after {} attempt(s)", rpmapp::to_string(*event), attempt_)));
      }
    }
  }

  // Releases the fd from Asio, then closes the connection; `what`: the line to print.
  bool close(const char* what) {
    watched_.release();
    auto closed = std::move(*conn_).close();
    conn_.reset();
    if (!closed) {
      failed(closed.error());
      return false;
    }
    if (what != nullptr) {
      fmt::print("{}\n", what);
      done_ = true;
    }
    return true;
  }

  asio::io_context& io_;
  const rpmapp::Peer& peer_;
  std::string_view addr_, port_;
  std::optional<rpmapp::PendingConnReq> pending_;
  std::optional<rpmapp::Conn> conn_;
  example::WatchedFd watched_;  // declared after them: released before their fds close
  asio::steady_timer retry_;
  std::string hello_;
  int attempt_ = 0;
  bool done_ = false;
  std::optional<rpmapp::Error> failure_;
};

}  // namespace

int main(int argc, char** argv) {
  std::string_view addr, port;
  if (!example::parse_args(argc, argv, addr, port)) return 2;

  auto peer = rpmapp::Peer::from_address(addr, rpmapp::AddressKind::remote);
  if (!peer) return example::fail(peer.error());

  asio::io_context io;
  Client client(io, *peer, addr, port);
  client.start();
  io.run_for(run_bound);  // returns when nothing is left to wait for, on stop, or in time
  if (client.failure()) return example::fail(*client.failure());
  if (!client.done()) {
    fmt::print(stderr, "error: not done within {} ms\n", run_bound.count());
    return 1;
  }
  return 0;
}
