// 11-completion-epoll, server: one thread serves several connections from ONE epoll set
// holding the endpoint's fd (requests), each connection's CM fd (its events) and each
// connection's completion fd (Cq::fd). Each client sends a message; the server replies,
// and once the reply has completed it disconnects that client.
#include "../common/common.hpp"

#include <rpmapp/rpmapp.hpp>

#include <fmt/core.h>

#include <sys/epoll.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstdint>
#include <map>
#include <string>

constexpr int clients = 3;  // the server exits after this many clients have gone
constexpr std::string_view expected_prefix = "hello from the 11-completion-epoll client";
// Each connection has a receive slot and a send slot in one registered region.
constexpr std::size_t slot_size = 64;
constexpr std::size_t recv_offset(int number) { return std::size_t(number - 1) * 2 * slot_size; }
constexpr std::size_t send_offset(int number) { return recv_offset(number) + slot_size; }

namespace {

// What an fd in the epoll set stands for: its kind and the connection's number.
enum class Kind : std::uint32_t { endpoint, cm, completion };
std::uint64_t key(Kind kind, int number) {
  return (std::uint64_t(kind) << 32) | static_cast<std::uint32_t>(number);
}

// An epoll instance, closed on scope exit.
struct Epoll {
  int fd = epoll_create1(EPOLL_CLOEXEC);
  ~Epoll() {
    if (fd >= 0) ::close(fd);
  }
  bool add(int watched, std::uint64_t data) const {
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.u64 = data;
    return epoll_ctl(fd, EPOLL_CTL_ADD, watched, &ev) == 0;
  }
  void remove(int watched) const { epoll_ctl(fd, EPOLL_CTL_DEL, watched, nullptr); }
};

struct Connection {
  rpmapp::Conn conn;
  rpmapp::Cq cq;
  int cm_fd = -1, completion_fd = -1;
  int messages = 0, replies = 0;
  bool established = false;
  // rdma_disconnect before the CM has seen the connection established sends nothing (the
  // IB CM cannot leave its REP-sent state): the client may send, and be answered, before
  // the server's ESTABLISHED arrives, so disconnect when both have happened.
  rpmapp::expected<void> disconnect_when_done() {
    if (!established || replies == 0) return {};
    return conn.disconnect();
  }
};

}  // namespace

int main(int argc, char** argv) {
  std::string_view addr, port;
  if (!example::parse_args(argc, argv, addr, port)) return 2;

  auto peer = rpmapp::Peer::from_address(addr, rpmapp::AddressKind::local);
  if (!peer) return example::fail(peer.error());
  std::array<std::byte, clients * 2 * slot_size> memory{};
  auto mr = rpmapp::MrLocal::reg(*peer, memory, rpmapp::MrUsage::send | rpmapp::MrUsage::recv);
  if (!mr) return example::fail(mr.error());

  auto endpoint = rpmapp::Endpoint::listen(*peer, addr, port);
  if (!endpoint) return example::fail(endpoint.error());
  auto endpoint_fd = endpoint->fd();
  if (!endpoint_fd) return example::fail(endpoint_fd.error());
  Epoll epoll;
  if (epoll.fd < 0) return example::fail_errno("epoll_create1");
  if (!epoll.add(*endpoint_fd, key(Kind::endpoint, 0))) return example::fail_errno("epoll_ctl");
  if (auto ok = example::print_listening(*endpoint); !ok) return example::fail(ok.error());

  std::map<int, Connection> connections;  // by number, from 1
  int accepted = 0, served = 0, messages = 0, replies = 0;

  // A request: its receive is posted before accepting, then its two fds join the set.
  auto on_request = [&](rpmapp::ConnReq req) -> rpmapp::expected<void> {
    if (accepted == clients) return {};  // not ours to serve: dropping it rejects it
    const int number = ++accepted;
    if (auto ok = req.recv(*mr, recv_offset(number), slot_size, number); !ok) return ok;
    auto conn = std::move(req).connect();
    if (!conn) return rpmapp::unexpected(conn.error());
    auto cq = conn->cq();
    if (!cq) return rpmapp::unexpected(cq.error());
    auto cm_fd = conn->fd();
    if (!cm_fd) return rpmapp::unexpected(cm_fd.error());
    auto completion_fd = cq->fd();
    if (!completion_fd) return rpmapp::unexpected(completion_fd.error());
    Connection c{std::move(*conn), *cq, *cm_fd, *completion_fd, 0, 0, false};
    if (!epoll.add(c.cm_fd, key(Kind::cm, number)) ||
        !epoll.add(c.completion_fd, key(Kind::completion, number)))
      return rpmapp::unexpected(rpmapp::Error(rpmapp::errc::provider, errno, "epoll_ctl"));
    connections.emplace(number, std::move(c));
    fmt::print("connection {}: request accepted\n", number);
    return {};
  };

  // Completions that are already there (non-blocking): a message is answered; the answer's
  // completion ends the exchange, and the server disconnects.
  auto drain = [&](int number, Connection& c) -> rpmapp::expected<void> {
    for (;;) {
      std::array<ibv_wc, 4> wcs;
      auto got = c.cq.get(wcs);
      if (!got && got.error() == rpmapp::errc::no_completion) return {};
      if (!got) return rpmapp::unexpected(got.error());
      for (const ibv_wc& wc : *got) {
        if (auto ok = rpmapp::check(wc); !ok) return ok;
        if (wc.opcode == IBV_WC_RECV) {
          const auto bytes = std::span(memory).subspan(recv_offset(number), std::min<std::size_t>(wc.byte_len, slot_size));
          const std::string_view text = rpmapp::as_text(bytes);
          fmt::print("connection {}: message \"{}\"\n", number, text);
          if (!text.starts_with(expected_prefix))
            return rpmapp::unexpected(rpmapp::Error(rpmapp::errc::unknown, 0, "drain", "unexpected message"));
          ++c.messages, ++messages;
          const std::string reply = fmt::format("welcome, connection {}", number);
          std::memcpy(memory.data() + send_offset(number), reply.c_str(), reply.size() + 1);
          if (auto ok = c.conn.send(*mr, send_offset(number), reply.size() + 1); !ok) return ok;
        } else if (wc.opcode == IBV_WC_SEND) {
          ++c.replies, ++replies;
          fmt::print("connection {}: reply sent\n", number);
          if (auto ok = c.disconnect_when_done(); !ok) return ok;
        } else {
          return rpmapp::unexpected(example::unexpected_completion(wc, "a send or a receive"));
        }
      }
    }
  };

  while (served < clients) {
    std::array<epoll_event, 8> ready;
    const int n = epoll_wait(epoll.fd, ready.data(), ready.size(), static_cast<int>(example::wait_bound.count()));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return example::fail_errno("epoll_wait");
    if (n == 0) {
      fmt::print(stderr, "error: nothing happened within {} ms\n", example::wait_bound.count());
      return 1;
    }
    for (int i = 0; i < n; ++i) {
      const auto kind = static_cast<Kind>(ready[i].data.u64 >> 32);
      const int number = static_cast<int>(ready[i].data.u64 & 0xffffffffu);
      if (kind == Kind::endpoint) {
        for (;;) {  // every pending request; no_event: the channel is drained
          auto req = endpoint->try_next_conn_req();
          if (!req && req.error() == rpmapp::errc::no_event) break;
          if (!req) return example::fail(req.error());
          if (auto ok = on_request(std::move(*req)); !ok) return example::fail(ok.error());
        }
        continue;
      }
      auto it = connections.find(number);
      if (it == connections.end()) continue;  // closed earlier in this batch
      Connection& c = it->second;
      if (kind == Kind::completion) {
        // Acknowledge the event and re-arm first, then read: a completion arriving
        // after the read raises a new event.
        auto event = c.cq.try_wait();
        if (!event && event.error() == rpmapp::errc::no_completion) continue;
        if (!event) return example::fail(event.error());
        if (auto ok = drain(number, c); !ok) return example::fail(ok.error());
        continue;
      }
      auto event = c.conn.try_next_event();
      if (!event && event.error() == rpmapp::errc::no_event) continue;
      if (!event) return example::fail(event.error());
      fmt::print("connection {}: {}\n", number, rpmapp::to_string(*event));
      if (*event == rpmapp::ConnEvent::established) {
        c.established = true;
        if (auto ok = c.disconnect_when_done(); !ok) return example::fail(ok.error());
        continue;
      }
      if (*event != rpmapp::ConnEvent::closed) {
        fmt::print(stderr, "error: unexpected event {}\n", rpmapp::to_string(*event));
        return 1;
      }
      if (c.messages != 1 || c.replies != 1) {
        fmt::print(stderr, "error: connection {} closed after {} messages and {} replies\n", number,
                   c.messages, c.replies);
        return 1;
      }
      epoll.remove(c.cm_fd);
      epoll.remove(c.completion_fd);
      auto closed = std::move(c.conn).close();
      connections.erase(it);
      if (!closed) return example::fail(closed.error());
      ++served;
    }
  }
  fmt::print("served {} clients: {} messages, {} replies\n", served, messages, replies);
  if (auto ok = std::move(*mr).dereg(); !ok) return example::fail(ok.error());
  if (auto ok = std::move(*endpoint).shutdown(); !ok) return example::fail(ok.error());
  return 0;
}
