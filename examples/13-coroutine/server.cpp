// 13-coroutine, server: one thread, one EventLoop, one coroutine per connection. A
// coroutine awaits the connection requests (co_await loop.next_conn_req) and spawns, for
// each, a coroutine that posts a receive, accepts with the request's own private data
// (an echo), waits for ESTABLISHED, receives the client's message, sends it back and waits
// for the client to disconnect. The server exits once it has served echo::connections.
#include "echo.hpp"

#include <rpmapp/rpmapp.hpp>
#include <rpmapp/task.hpp>

#include <fmt/core.h>

#include <array>
#include <cstring>
#include <string>
#include <utility>

using rpmapp::Task;
using rpmapp::expected;

namespace {

/// What the coroutines report to main().
struct Tally {
  int served = 0;   // connections echoed and closed
  int failed = 0;   // connections (or the accepting coroutine) that failed
  int ended = 0;    // connection coroutines that have finished
  bool accepting_failed = false;
};

/// One connection, from its request to its end.
/// `slot` is the connection's part of the memory `mr` registers, at `offset`.
Task<expected<void>> echo_connection(rpmapp::EventLoop& loop, rpmapp::ConnReq req,
                                     const rpmapp::MrLocal& mr, std::size_t offset, const char* slot) {
  // The request's private data, copied: accepting consumes the request.
  auto data = req.private_data();
  if (!data) co_return rpmapp::unexpected(data.error());
  const std::string text(rpmapp::as_text(*data));
  if (!text.starts_with(echo::private_data_prefix))
    co_return rpmapp::unexpected(echo::mismatch("13-coroutine server", fmt::format("unexpected private data \"{}\"", text)));

  // The receive goes on the request, so the client's message (sent as soon as it is
  // established) finds it.
  if (auto ok = req.recv(mr, offset, echo::slot_size); !ok) co_return ok;
  auto conn = std::move(req).connect(rpmapp::as_bytes(text));
  if (!conn) co_return rpmapp::unexpected(conn.error());

  auto event = co_await loop.next_event(*conn, example::wait_bound);
  if (!event) co_return rpmapp::unexpected(event.error());
  if (*event != rpmapp::ConnEvent::established)
    co_return rpmapp::unexpected(echo::mismatch("13-coroutine server", fmt::format("{}: {} before established", text, rpmapp::to_string(*event))));

  // The message, then the same bytes back.
  echo::Pending pending{.recv = true};
  if (auto ok = co_await echo::complete(loop, *conn, pending); !ok) co_return ok;
  if (auto ok = conn->send(mr, offset, pending.received); !ok) co_return ok;
  pending.send = true;
  if (auto ok = co_await echo::complete(loop, *conn, pending); !ok) co_return ok;
  fmt::print("{}: echoed the private data and a {}-byte message \"{}\"\n", text, pending.received,
             std::string_view(slot, pending.received));

  // The client disconnects when it has the answer.
  event = co_await loop.next_event(*conn, example::wait_bound);
  if (!event) co_return rpmapp::unexpected(event.error());
  if (*event != rpmapp::ConnEvent::closed)
    co_return rpmapp::unexpected(echo::mismatch("13-coroutine server", fmt::format("{}: {} instead of closed", text, rpmapp::to_string(*event))));
  co_return std::move(*conn).close();
}

/// A connection's coroutine as spawned: runs it, counts the result, and stops the loop
/// after the last one.
Task<> serve_connection(rpmapp::EventLoop& loop, rpmapp::ConnReq req, const rpmapp::MrLocal& mr,
                        std::size_t offset, const char* slot, Tally& tally) {
  auto done = co_await echo_connection(loop, std::move(req), mr, offset, slot);
  if (done) {
    ++tally.served;
  } else {
    ++tally.failed;
    fmt::print(stderr, "error: {}\n", done.error().message());
  }
  if (++tally.ended == echo::connections) loop.stop();
}

/// Takes echo::connections requests and spawns a coroutine for each; each gets its own
/// slot of `memory`, which `mr` registers.
Task<> accept_connections(rpmapp::EventLoop& loop, rpmapp::Endpoint& endpoint, const rpmapp::MrLocal& mr,
                          const char* memory, Tally& tally) {
  for (int i = 0; i < echo::connections; ++i) {
    auto req = co_await loop.next_conn_req(endpoint, {}, example::wait_bound);
    const std::size_t offset = static_cast<std::size_t>(i) * echo::slot_size;
    auto spawned = req ? rpmapp::spawn(loop, serve_connection(loop, std::move(*req), mr, offset, memory + offset, tally))
                       : expected<void>(rpmapp::unexpected(req.error()));
    if (!spawned) {
      fmt::print(stderr, "error: {}\n", spawned.error().message());
      tally.accepting_failed = true;
      loop.stop();  // the connections already spawned are cancelled too
      co_return;
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  std::string_view addr, port;
  if (!example::parse_args(argc, argv, addr, port)) return 2;

  auto peer = rpmapp::Peer::from_address(addr, rpmapp::AddressKind::local);
  if (!peer) return example::fail(peer.error());
  std::array<char, echo::connections * echo::slot_size> memory{};
  auto mr = rpmapp::MrLocal::reg(*peer, memory.data(), memory.size(), rpmapp::MrUsage::send | rpmapp::MrUsage::recv);
  if (!mr) return example::fail(mr.error());
  auto endpoint = example::listen_and_print(*peer, addr, port);
  if (!endpoint) return example::fail(endpoint.error());

  // Declared after what the coroutines use: destroying the loop destroys the coroutines
  // it still owns (a failure), and with them their connections, first.
  auto loop = rpmapp::EventLoop::create();
  if (!loop) return example::fail(loop.error());
  Tally tally;
  if (auto ok = rpmapp::spawn(*loop, accept_connections(*loop, *endpoint, *mr, memory.data(), tally)); !ok)
    return example::fail(ok.error());

  // The last connection's coroutine stops the loop; every await in them is bounded, and
  // so is the whole run.
  const auto bound = 4 * example::wait_bound;
  if (auto ran = loop->run_for(bound); !ran) return example::fail(ran.error());
  if (tally.accepting_failed || tally.failed > 0 || tally.served != echo::connections) {
    const char* rest = tally.accepting_failed ? "accepting failed"
                       : tally.ended < echo::connections ? "the rest did not finish in time" : "";
    fmt::print(stderr, "error: served {} of {} connections ({} failed; {})\n", tally.served, echo::connections,
               tally.failed, rest);
    return 1;
  }
  fmt::print("served {} connections: {} private-data echoes, {} messages echoed\n", tally.served, tally.served,
             tally.served);
  if (auto ok = std::move(*endpoint).shutdown(); !ok) return example::fail(ok.error());
  return 0;
}
