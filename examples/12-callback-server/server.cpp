// 12-callback-server, server: ONE thread and ONE rpmapp::EventLoop serve 32 connections
// with handlers only, no loop of its own. The listener is created with its connection
// request handler (Endpoint::listen_shared with a handler: ib_cm_insert_listen's form);
// each connection gets an event handler (EventLoop::watch) and a completion handler
// (EventLoop::watch_completions). Per connection: the accept echoes the client's private
// data; the client sends one message, which the server answers; once the answer has
// completed (and the connection is established) the server disconnects, and when the
// client has disconnected too, the connection's own event handler destroys it. A message
// that arrives before the server saw established is answered once it has (iWARP: the
// accepting side may send only then, docs/peer.md).
#include "../common/common.hpp"

#include <rpmapp/rpmapp.hpp>

#include <fmt/core.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <optional>
#include <string>

constexpr int connections = 32;  // the server exits after this many have closed
constexpr std::string_view hello_prefix = "hello from connection ";
constexpr std::string_view message_prefix = "message from connection ";
constexpr std::string_view answer_prefix = "answer to ";
// Each connection has a receive slot and a send slot in one registered region.
constexpr std::size_t slot_size = 64;
constexpr std::size_t recv_offset(int number) { return std::size_t(number - 1) * 2 * slot_size; }
constexpr std::size_t send_offset(int number) { return recv_offset(number) + slot_size; }
// The whole run is bounded: a client that never comes must not hang the server.
const auto run_bound = 2 * example::wait_bound;

namespace {

struct Connection {
  explicit Connection(rpmapp::Conn c) : conn(std::move(c)) {}
  rpmapp::Conn conn;
  // Declared after the Conn: destroyed first, so the handlers are unregistered before
  // the connection goes (either order is safe; this one is the tidy one).
  rpmapp::Registration events, completions;
  bool established = false, received = false, answered = false, replied = false;
  std::size_t answer_size = 0;  // of the answer waiting in the send slot
};

}  // namespace

int main(int argc, char** argv) {
  std::string_view addr, port;
  if (!example::parse_args(argc, argv, addr, port)) return 2;

  auto peer = rpmapp::Peer::from_address(addr, rpmapp::AddressKind::local);
  if (!peer) return example::fail(peer.error());
  std::array<std::byte, connections * 2 * slot_size> memory{};
  auto mr = rpmapp::MrLocal::reg(*peer, memory, rpmapp::MrUsage::send | rpmapp::MrUsage::recv);
  if (!mr) return example::fail(mr.error());
  auto loop = rpmapp::EventLoop::create();
  if (!loop) return example::fail(loop.error());

  std::map<int, Connection> open;  // by number, from 1
  int accepted = 0, served = 0, messages = 0, replies = 0;
  std::optional<rpmapp::Error> failure;  // the first error a handler met: ends the run
  auto failed = [&](const rpmapp::Error& error) {
    if (!failure) failure = error;
    loop->stop();
  };
  auto problem = [&](std::string what) {
    failed(rpmapp::Error(rpmapp::errc::unknown, 0, "12-callback-server", what));
  };

  // rdma_disconnect before the CM has seen the connection established sends nothing: the
  // client may send, and be answered, before the server's ESTABLISHED arrives.
  auto disconnect_when_done = [&](Connection& c) {
    if (!c.established || !c.replied) return;
    if (auto ok = c.conn.disconnect(); !ok) failed(ok.error());
  };
  // The answer goes once the message came and the connection is established.
  auto answer_when_ready = [&](Connection& c, int number) {
    if (!c.established || !c.received || c.answered) return;
    c.answered = true;
    if (auto ok = c.conn.send(*mr, send_offset(number), c.answer_size); !ok) failed(ok.error());
  };

  // Connection events. `closed` ends a connection: its own handler destroys it.
  auto on_event = [&](int number, rpmapp::expected<rpmapp::ConnEvent> event) {
    if (!event) return failed(event.error());
    Connection& c = open.at(number);  // present: erasing it unregisters this handler
    if (*event == rpmapp::ConnEvent::established) {
      c.established = true;
      return answer_when_ready(c, number);
    }
    if (*event != rpmapp::ConnEvent::closed)
      return problem(fmt::format("connection {}: unexpected event {}", number, rpmapp::to_string(*event)));
    if (!c.received || !c.replied)
      return problem(fmt::format("connection {} closed before its message was answered", number));
    open.erase(number);  // the Conn and both registrations go, inside this handler
    if (++served == connections) loop->stop();
  };

  // Completions of one connection: its message is answered; the answer's completion lets
  // the server disconnect.
  auto on_completions = [&](int number, rpmapp::expected<std::span<const ibv_wc>> batch) {
    if (!batch) return failed(batch.error());
    Connection& c = open.at(number);
    for (const ibv_wc& wc : *batch) {
      if (auto ok = rpmapp::check(wc); !ok) return failed(ok.error());
      if (wc.opcode == IBV_WC_RECV) {
        const auto bytes = std::span(memory).subspan(recv_offset(number), std::min<std::size_t>(wc.byte_len, slot_size));
        const std::string_view text = rpmapp::as_text(bytes);
        fmt::print("connection {}: message \"{}\"\n", number, text);
        if (!text.starts_with(message_prefix) || c.received)
          return problem(fmt::format("connection {}: unexpected message", number));
        c.received = true;
        ++messages;
        const std::string answer = fmt::format("{}{}", answer_prefix, text);
        if (answer.size() >= slot_size) return problem("the answer does not fit its slot");
        std::memcpy(memory.data() + send_offset(number), answer.c_str(), answer.size() + 1);
        c.answer_size = answer.size() + 1;
        answer_when_ready(c, number);
        if (failure) return;
      } else if (wc.opcode == IBV_WC_SEND) {
        c.replied = true;
        ++replies;
        disconnect_when_done(c);
      } else {
        return failed(example::unexpected_completion(wc, "a send or a receive"));
      }
    }
  };

  // Connection requests: the receive is posted before accepting (the client sends as soon
  // as it is established), the accept echoes the request's private data, and the new
  // connection gets its two handlers.
  auto on_request = std::make_shared<rpmapp::ConnReqHandler>([&](rpmapp::expected<rpmapp::ConnReq> req) {
    if (!req) return failed(req.error());
    if (accepted == connections) return;  // not ours to serve: left in `req`, it is rejected
    const int number = ++accepted;
    auto data = req->private_data();
    if (!data) return failed(data.error());
    const std::string hello(rpmapp::as_text(*data));
    fmt::print("connection {}: request \"{}\"\n", number, hello);
    if (!hello.starts_with(hello_prefix)) return problem(fmt::format("connection {}: unexpected private data", number));
    if (auto ok = req->recv(*mr, recv_offset(number), slot_size, number); !ok) return failed(ok.error());
    const std::string echo = fmt::format("echo: {}", hello);
    auto conn = std::move(*req).connect(rpmapp::as_bytes(echo));
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
  });

  auto endpoint = rpmapp::Endpoint::listen_shared(*peer, addr, port, on_request);
  if (!endpoint) return example::fail(endpoint.error());
  auto serving = loop->serve(*endpoint);  // the listener's own handler
  if (!serving) return example::fail(serving.error());
  if (auto ok = example::print_listening(*endpoint); !ok) return example::fail(ok.error());

  if (auto ran = loop->run_for(run_bound); !ran) return example::fail(ran.error());
  if (failure) return example::fail(*failure);
  if (served < connections) {
    fmt::print(stderr, "error: {} of {} connections served within {} ms\n", served, connections, run_bound.count());
    return 1;
  }
  fmt::print("served {} connections: {} messages, {} replies\n", served, messages, replies);
  serving->reset();
  if (auto ok = std::move(*mr).dereg(); !ok) return example::fail(ok.error());
  if (auto ok = std::move(*endpoint).shutdown(); !ok) return example::fail(ok.error());
  return 0;
}
