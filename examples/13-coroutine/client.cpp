// 13-coroutine, client: echo::connections connections at once, each a coroutine on ONE
// EventLoop in one thread. Each connects with its own private data (co_await
// loop.connect: resolution, connect and ESTABLISHED in one await), checks that the server
// echoed it, sends a message and checks that the same bytes come back, then disconnects.
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
  int echoed = 0;  // connections whose private data and message came back
  int failed = 0;
  int ended = 0;   // coroutines that have finished
};

/// Connects, retrying a few times when the request is refused or unreachable (the server
/// may not listen yet): waits between attempts without blocking the other coroutines.
Task<expected<rpmapp::Conn>> connect_with_retry(rpmapp::EventLoop& loop, const rpmapp::Peer& peer,
                                                std::string_view addr, std::string_view port,
                                                std::string_view private_data) {
  for (int attempt = 1;; ++attempt) {
    auto conn = co_await loop.connect(peer, addr, port, {}, rpmapp::as_bytes(private_data), example::wait_bound);
    const bool refused = !conn && conn.error().code() == rpmapp::errc::provider &&
                         (conn.error().sys_errno() == ECONNREFUSED || conn.error().sys_errno() == EHOSTUNREACH);
    if (!refused || attempt == example::connect_attempts) co_return conn;
    fmt::print("{}: attempt {}: {}, retrying\n", private_data, attempt, conn.error().message());
    if (auto slept = co_await loop.sleep_for(std::chrono::milliseconds(500)); !slept)
      co_return rpmapp::unexpected(slept.error());
  }
}

/// Connection `number`, from connect to disconnect. `memory` holds its two slots, at
/// `offset` in what `mr` registers.
Task<expected<void>> echo_connection(rpmapp::EventLoop& loop, const rpmapp::Peer& peer, std::string_view addr,
                                     std::string_view port, const rpmapp::MrLocal& mr, std::size_t offset,
                                     char* memory, int number) {
  const std::string private_data = echo::private_data_of(number);
  auto conn = co_await connect_with_retry(loop, peer, addr, port, private_data);
  if (!conn) co_return rpmapp::unexpected(conn.error());

  // The server accepts with our own private data (zero-padded by rdma_cm).
  auto received = conn->private_data();
  if (!received) co_return rpmapp::unexpected(received.error());
  if (rpmapp::as_text(*received) != private_data)
    co_return rpmapp::unexpected(echo::mismatch(
        "13-coroutine client", fmt::format("{}: the server accepted with \"{}\"", private_data, rpmapp::as_text(*received))));

  // The answer's receive first, then the message.
  const std::string message = echo::message_of(number);
  const char* const answer = memory + echo::slot_size;
  std::memcpy(memory, message.data(), message.size());
  if (auto ok = conn->recv(mr, offset + echo::slot_size, echo::slot_size); !ok) co_return ok;
  if (auto ok = conn->send(mr, offset, message.size()); !ok) co_return ok;
  echo::Pending pending{.send = true, .recv = true};
  if (auto ok = co_await echo::complete(loop, *conn, pending); !ok) co_return ok;
  if (std::string_view(answer, pending.received) != message)
    co_return rpmapp::unexpected(echo::mismatch(
        "13-coroutine client",
        fmt::format("{}: sent \"{}\", got {} bytes back: \"{}\"", private_data, message, pending.received,
                    std::string_view(answer, pending.received))));
  fmt::print("{}: private data echoed, message echoed\n", private_data);

  // rdma_cm: our closed event comes once the server has disconnected (or closed) too.
  if (auto ok = conn->disconnect(); !ok) co_return ok;
  auto event = co_await loop.next_event(*conn, example::wait_bound);
  if (!event) co_return rpmapp::unexpected(event.error());
  if (*event != rpmapp::ConnEvent::closed)
    co_return rpmapp::unexpected(echo::mismatch(
        "13-coroutine client", fmt::format("{}: {} instead of closed", private_data, rpmapp::to_string(*event))));
  co_return std::move(*conn).close();
}

/// A connection's coroutine as spawned: runs it, counts the result, and stops the loop
/// after the last one.
Task<> run_connection(rpmapp::EventLoop& loop, const rpmapp::Peer& peer, std::string_view addr,
                      std::string_view port, const rpmapp::MrLocal& mr, char* memory, int number, Tally& tally) {
  const std::size_t offset = static_cast<std::size_t>(number - 1) * 2 * echo::slot_size;
  auto done = co_await echo_connection(loop, peer, addr, port, mr, offset, memory + offset, number);
  if (done) {
    ++tally.echoed;
  } else {
    ++tally.failed;
    fmt::print(stderr, "error: connection {:02}: {}\n", number, done.error().message());
  }
  if (++tally.ended == echo::connections) loop.stop();
}

}  // namespace

int main(int argc, char** argv) {
  std::string_view addr, port;
  if (!example::parse_args(argc, argv, addr, port)) return 2;

  auto peer = rpmapp::Peer::from_address(addr, rpmapp::AddressKind::remote);
  if (!peer) return example::fail(peer.error());
  // Two slots per connection: its message and the answer.
  std::array<char, echo::connections * 2 * echo::slot_size> memory{};
  auto mr = rpmapp::MrLocal::reg(*peer, memory.data(), memory.size(), rpmapp::MrUsage::send | rpmapp::MrUsage::recv);
  if (!mr) return example::fail(mr.error());

  // Declared after what the coroutines use: destroying the loop destroys the coroutines it
  // still owns (after a failure), and their connections with them, first.
  auto loop = rpmapp::EventLoop::create();
  if (!loop) return example::fail(loop.error());
  Tally tally;
  for (int number = 1; number <= echo::connections; ++number)
    if (auto ok = rpmapp::spawn(*loop, run_connection(*loop, *peer, addr, port, *mr, memory.data(), number, tally)); !ok)
      return example::fail(ok.error());

  // All of them run concurrently in here; the last to finish stops the loop.
  if (auto ran = loop->run_for(4 * example::wait_bound); !ran) return example::fail(ran.error());
  if (tally.failed > 0 || tally.echoed != echo::connections) {
    fmt::print(stderr, "error: {} of {} connections echoed ({} failed{})\n", tally.echoed, echo::connections,
               tally.failed, tally.ended < echo::connections ? ", the rest did not finish in time" : "");
    return 1;
  }
  fmt::print("{} connections at once: {} private-data echoes, {} messages echoed, all disconnected\n",
             echo::connections, tally.echoed, tally.echoed);
  return 0;
}
