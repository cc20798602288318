// 12-callback-server, client: ONE thread and ONE rpmapp::EventLoop make 32 connections to
// the server at once, with handlers only. The 32 outgoing requests resolve concurrently
// (ConnReq::start, EventLoop::resolve); each, once resolved, posts a receive and connects
// with its own private data. When established, a connection checks the server's echo of
// that private data and sends one message; its completion handler checks the answer.
// The server disconnects; the connection then disconnects too and is closed.
#include "../common/common.hpp"

#include <rpmapp/rpmapp.hpp>

#include <fmt/core.h>

#include <unistd.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstring>
#include <map>
#include <optional>
#include <string>
#include <vector>

constexpr int connections = 32;
constexpr std::size_t slot_size = 64;
constexpr std::size_t recv_offset(int number) { return std::size_t(number - 1) * 2 * slot_size; }
constexpr std::size_t send_offset(int number) { return recv_offset(number) + slot_size; }
const auto run_bound = 2 * example::wait_bound;

namespace {

struct Connection {
  explicit Connection(rpmapp::Conn c) : conn(std::move(c)) {}
  rpmapp::Conn conn;
  rpmapp::Registration events, completions;  // unregistered before the Conn goes
  bool echoed = false, sent = false, answered = false, closed = false;
};

}  // namespace

int main(int argc, char** argv) {
  std::string_view addr, port;
  if (!example::parse_args(argc, argv, addr, port)) return 2;

  auto peer = rpmapp::Peer::from_address(addr, rpmapp::AddressKind::remote);
  if (!peer) return example::fail(peer.error());
  std::array<std::byte, connections * 2 * slot_size> memory{};
  auto mr = rpmapp::MrLocal::reg(*peer, memory, rpmapp::MrUsage::send | rpmapp::MrUsage::recv);
  if (!mr) return example::fail(mr.error());
  auto loop = rpmapp::EventLoop::create();
  if (!loop) return example::fail(loop.error());

  // What connection `number` sends: its private data and its message.
  auto hello = [](int number) { return fmt::format("hello from connection {} of pid {}", number, getpid()); };
  auto message = [](int number) { return fmt::format("message from connection {} of pid {}", number, getpid()); };

  std::map<int, Connection> open;  // by number, from 1
  int echoes = 0, answers = 0, done = 0;
  std::optional<rpmapp::Error> failure;
  auto failed = [&](const rpmapp::Error& error) {
    if (!failure) failure = error;
    loop->stop();
  };
  auto problem = [&](std::string what) {
    failed(rpmapp::Error(rpmapp::errc::unknown, 0, "12-callback-client", what));
  };

  // A connection is over when the server has closed it and both completions have come
  // (the close and the answer's completion may be handled in either order).
  auto finish_if_done = [&](int number, Connection& c) {
    if (!c.closed || !c.sent || !c.answered) return;
    auto closed = std::move(c.conn).close();
    open.erase(number);  // inside one of its own handlers: they are not called again
    if (!closed) return failed(closed.error());
    if (++done == connections) loop->stop();
  };

  auto on_event = [&](int number, rpmapp::expected<rpmapp::ConnEvent> event) {
    if (!event) return failed(event.error());
    Connection& c = open.at(number);
    if (*event == rpmapp::ConnEvent::established) {
      auto data = c.conn.private_data();
      if (!data) return failed(data.error());
      const std::string_view echo = rpmapp::as_text(*data);
      fmt::print("connection {}: accepted with \"{}\"\n", number, echo);
      if (echo != "echo: " + hello(number)) return problem(fmt::format("connection {}: wrong echo", number));
      c.echoed = true;
      ++echoes;
      const std::string text = message(number);
      std::memcpy(memory.data() + send_offset(number), text.c_str(), text.size() + 1);
      if (auto ok = c.conn.send(*mr, send_offset(number), text.size() + 1); !ok) return failed(ok.error());
      return;
    }
    if (*event != rpmapp::ConnEvent::closed || !c.echoed)
      return problem(fmt::format("connection {}: unexpected event {}", number, rpmapp::to_string(*event)));
    c.closed = true;
    if (auto ok = c.conn.disconnect(); !ok) return failed(ok.error());
    finish_if_done(number, c);
  };

  auto on_completions = [&](int number, rpmapp::expected<std::span<const ibv_wc>> batch) {
    if (!batch) return failed(batch.error());
    Connection& c = open.at(number);
    for (const ibv_wc& wc : *batch) {
      if (auto ok = rpmapp::check(wc); !ok) return failed(ok.error());
      if (wc.opcode == IBV_WC_SEND) {
        c.sent = true;
      } else if (wc.opcode == IBV_WC_RECV) {
        const auto bytes = std::span(memory).subspan(recv_offset(number), std::min<std::size_t>(wc.byte_len, slot_size));
        const std::string_view answer = rpmapp::as_text(bytes);
        fmt::print("connection {}: answer \"{}\"\n", number, answer);
        if (answer != "answer to " + message(number)) return problem(fmt::format("connection {}: wrong answer", number));
        c.answered = true;
        ++answers;
      } else {
        return failed(example::unexpected_completion(wc, "a send or a receive"));
      }
    }
    finish_if_done(number, c);  // the last use of `c`: it may be gone afterwards
  };

  // A resolved request: its receive is posted before connecting (the server answers as
  // soon as the message arrives), then it connects and gets its two handlers.
  auto on_resolved = [&](int number, rpmapp::expected<rpmapp::ConnReq> req) {
    if (!req) return failed(req.error());
    if (auto ok = req->recv(*mr, recv_offset(number), slot_size, number); !ok) return failed(ok.error());
    auto conn = std::move(*req).connect(rpmapp::as_bytes(hello(number)));
    if (!conn) return failed(conn.error());
    Connection& c = open.try_emplace(number, std::move(*conn)).first->second;
    auto events = loop->watch(c.conn, [&, number](rpmapp::expected<rpmapp::ConnEvent> event) {
      on_event(number, std::move(event));
    });
    if (!events) return failed(events.error());
    c.events = std::move(*events);
    auto completions = loop->watch_completions(c.conn, [&, number](rpmapp::expected<std::span<const ibv_wc>> batch) {
      on_completions(number, batch);
    });
    if (!completions) return failed(completions.error());
    c.completions = std::move(*completions);
  };

  // All 32 requests start at once; the loop resolves them side by side.
  std::vector<rpmapp::Registration> resolving;
  for (int number = 1; number <= connections; ++number) {
    auto pending = rpmapp::ConnReq::start(*peer, addr, port);
    if (!pending) return example::fail(pending.error());
    auto reg = loop->resolve(std::move(*pending), [&, number](rpmapp::expected<rpmapp::ConnReq> req) {
      on_resolved(number, std::move(req));
    });
    if (!reg) return example::fail(reg.error());
    resolving.push_back(std::move(*reg));
  }

  if (auto ran = loop->run_for(run_bound); !ran) return example::fail(ran.error());
  if (failure) return example::fail(*failure);
  if (done < connections) {
    fmt::print(stderr, "error: {} of {} connections done within {} ms\n", done, connections, run_bound.count());
    return 1;
  }
  fmt::print("{} connections: {} echoes, {} answers, closed by the server\n", done, echoes, answers);
  return 0;
}
