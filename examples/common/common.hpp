// Helpers shared by the examples: argument parsing, error reporting, bounded event waits,
// a client-side connect that retries when the server is not ready yet, and bounded
// completion waits for the data path (librpma's private data: librpma_data.hpp).
#pragma once

#include <rpmapp/rpmapp.hpp>

#include <fmt/core.h>

#include <cerrno>
#include <charconv>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <span>
#include <string>
#include <string_view>
#include <system_error>
#include <thread>
#include <utility>

namespace example {

using namespace std::chrono_literals;

/// The environment variable that sets wait_bound, in whole seconds (1 to 86400): a runner
/// that slows the programs down, e.g. valgrind on an emulated machine, raises it.
inline constexpr const char* wait_seconds_variable = "RPMAPP_EXAMPLE_WAIT_SECONDS";

/// wait_bound's value: RPMAPP_EXAMPLE_WAIT_SECONDS when set, 30 s otherwise. Any other
/// value ends the program with a message and exit status 2: a wrong bound must not pass
/// unnoticed.
inline std::chrono::milliseconds wait_bound_from_environment() {
  constexpr long max_seconds = 86400;  // in milliseconds it still fits an int (epoll_wait)
  const char* text = std::getenv(wait_seconds_variable);
  if (text == nullptr) return 30s;
  const char* end = text + std::strlen(text);
  long seconds = 0;
  auto [last, ec] = std::from_chars(text, end, seconds);
  if (ec != std::errc{} || last != end || seconds < 1 || seconds > max_seconds) {
    fmt::print(stderr, "error: {}=\"{}\": expected a whole number of seconds from 1 to {}\n",
               wait_seconds_variable, text, max_seconds);
    std::exit(2);
  }
  return std::chrono::seconds(seconds);
}

/// Every wait in the examples is bounded, so that a failure never hangs. Generous: under
/// software emulation on a busy machine a client process can take seconds to start.
/// Read once, before main() (wait_bound_from_environment).
inline const std::chrono::milliseconds wait_bound = wait_bound_from_environment();
/// How often a client tries to connect before giving up.
inline constexpr int connect_attempts = 5;

/// Checks `prog ADDR PORT`; prints the usage line and returns false otherwise.
inline bool parse_args(int argc, char** argv, std::string_view& addr, std::string_view& port) {
  if (argc != 3) {
    fmt::print(stderr, "usage: {} ADDR PORT\n", argc > 0 ? argv[0] : "example");
    return false;
  }
  addr = argv[1];
  port = argv[2];
  return true;
}

/// Prints the error's one-line message and returns the exit status for main().
inline int fail(const rpmapp::Error& error) {
  fmt::print(stderr, "error: {}\n", error.message());
  return 1;
}

/// Prints "error: CALL: " and errno's text (a failed system call, e.g. epoll_ctl) and
/// returns the exit status for main().
inline int fail_errno(const char* call) {
  fmt::print(stderr, "error: {}: {}\n", call, std::strerror(errno));
  return 1;
}

/// Prints "listening on ADDR port PORT" with what the endpoint actually bound, and
/// flushes: the test runner starts the clients when it sees this line.
inline rpmapp::expected<void> print_listening(const rpmapp::Endpoint& endpoint) {
  auto addr = endpoint.local_address();
  if (!addr) return rpmapp::unexpected(addr.error());
  auto port = endpoint.port();
  if (!port) return rpmapp::unexpected(port.error());
  fmt::print("listening on {} port {}\n", *addr, *port);
  std::fflush(stdout);
  return {};
}

/// Listens on ADDR:PORT with `peer` and prints the "listening on" line (print_listening).
inline rpmapp::expected<rpmapp::Endpoint> listen_and_print(const rpmapp::Peer& peer,
                                                           std::string_view addr,
                                                           std::string_view port) {
  auto endpoint = rpmapp::Endpoint::listen(peer, addr, port);
  if (!endpoint) return endpoint;
  if (auto ok = print_listening(*endpoint); !ok) return rpmapp::unexpected(ok.error());
  return endpoint;
}

/// True when `data` starts with the bytes of `text`. rdma_cm zero-pads private data to
/// the protocol's size (56 bytes on connect, 196 on accept), so compare the sent prefix.
inline bool has_prefix(std::span<const std::byte> data, std::string_view text) {
  return data.size() >= text.size() && std::memcmp(data.data(), text.data(), text.size()) == 0;
}

/// Waits up to wait_bound for the next event of `conn` and checks that it is `want`.
inline rpmapp::expected<void> expect_event(rpmapp::Conn& conn, rpmapp::ConnEvent want) {
  auto event = conn.next_event_for(wait_bound);
  if (!event) return rpmapp::unexpected(event.error());
  if (*event != want)
    return rpmapp::unexpected(rpmapp::Error(
        rpmapp::errc::unknown, 0, "expect_event",
        fmt::format("expected {}, got {}", rpmapp::to_string(want), rpmapp::to_string(*event))));
  return {};
}

/// How a server takes its one client: waits up to wait_bound for the next request of
/// `endpoint`, lets `prepare(ConnReq&)` (returning expected<void>) act on it before
/// accepting, e.g. post a receive, accepts it with `private_data` and waits for the
/// connection to be established.
template <class Prepare>
rpmapp::expected<rpmapp::Conn> accept_next(rpmapp::Endpoint& endpoint,
                                           std::span<const std::byte> private_data,
                                           Prepare prepare) {
  auto req = endpoint.next_conn_req_for(wait_bound);
  if (!req) return rpmapp::unexpected(req.error());
  if (auto ok = prepare(*req); !ok) return rpmapp::unexpected(ok.error());
  auto conn = std::move(*req).connect(private_data);
  if (!conn) return conn;
  if (auto ok = expect_event(*conn, rpmapp::ConnEvent::established); !ok)
    return rpmapp::unexpected(ok.error());
  return conn;
}

/// accept_next with nothing to do before accepting.
inline rpmapp::expected<rpmapp::Conn> accept_next(rpmapp::Endpoint& endpoint,
                                                  std::span<const std::byte> private_data = {}) {
  return accept_next(endpoint, private_data,
                     [](rpmapp::ConnReq&) -> rpmapp::expected<void> { return {}; });
}

/// How a server learns that its client is done: waits for the closed event and prints
/// "connection closed by the client".
inline rpmapp::expected<void> wait_closed_by_client(rpmapp::Conn& conn) {
  if (auto ok = expect_event(conn, rpmapp::ConnEvent::closed); !ok) return ok;
  fmt::print("connection closed by the client\n");
  return {};
}

/// How a server of one client ends: closes the connection, deregisters its region and
/// shuts the endpoint down, in that order.
inline rpmapp::expected<void> close_server(rpmapp::Conn&& conn, rpmapp::MrLocal&& mr,
                                           rpmapp::Endpoint&& endpoint) {
  if (auto ok = std::move(conn).close(); !ok) return ok;
  if (auto ok = std::move(mr).dereg(); !ok) return ok;
  return std::move(endpoint).shutdown();
}

/// Prints the server's private data, read from the established `conn` (the accept's data),
/// and checks that it starts with `prefix`. Returns 0, or, having printed the error, the
/// exit status for main().
inline int check_server_data(const rpmapp::Conn& conn, std::string_view prefix) {
  auto received = conn.private_data();
  if (!received) return fail(received.error());
  fmt::print("received from the server: \"{}\"\n", rpmapp::as_text(*received));
  if (!has_prefix(*received, prefix)) {
    fmt::print(stderr, "error: unexpected private data from the server\n");
    return 1;
  }
  return 0;
}

/// How a client ends: disconnects, waits for closed, closes `conn` and prints
/// "disconnected".
inline rpmapp::expected<void> disconnect_and_close(rpmapp::Conn& conn) {
  if (auto ok = conn.disconnect(); !ok) return ok;
  if (auto ok = expect_event(conn, rpmapp::ConnEvent::closed); !ok) return ok;
  if (auto ok = std::move(conn).close(); !ok) return ok;
  fmt::print("disconnected\n");
  return {};
}

/// Makes an outgoing request with `resolve()` (a callable returning expected<ConnReq>),
/// connects with `private_data` and waits for the connection to be established. A request
/// that is rejected or unreachable (the server may not listen yet) is retried a few times.
template <class Resolve>
rpmapp::expected<rpmapp::Conn> connect_with_retry(Resolve resolve,
                                                  std::span<const std::byte> private_data) {
  for (int attempt = 1;; ++attempt) {
    rpmapp::expected<rpmapp::ConnReq> req = resolve();
    if (!req) return rpmapp::unexpected(req.error());
    auto conn = std::move(*req).connect(private_data);
    if (!conn) return rpmapp::unexpected(conn.error());
    auto event = conn->next_event_for(wait_bound);
    if (!event) return rpmapp::unexpected(event.error());
    if (*event == rpmapp::ConnEvent::established) return std::move(*conn);
    const bool retry = *event == rpmapp::ConnEvent::rejected ||
                       *event == rpmapp::ConnEvent::unreachable;
    if (!retry || attempt == connect_attempts)
      return rpmapp::unexpected(rpmapp::Error(
          rpmapp::errc::unknown, 0, "connect_with_retry",
          fmt::format("connection {} after {} attempt(s)", rpmapp::to_string(*event), attempt)));
    fmt::print("attempt {}: connection {}, retrying\n", attempt, rpmapp::to_string(*event));
    std::this_thread::sleep_for(500ms);
  }
}

/// connect_with_retry with the blocking ConnReq::to.
inline rpmapp::expected<rpmapp::Conn> connect_with_retry(const rpmapp::Peer& peer,
                                                         std::string_view addr,
                                                         std::string_view port,
                                                         std::span<const std::byte> private_data) {
  return connect_with_retry([&] { return rpmapp::ConnReq::to(peer, addr, port); }, private_data);
}

// ---- The data path: completions.

/// Waits up to wait_bound for the next completion of `cq`, checks its status and returns it.
inline rpmapp::expected<ibv_wc> next_completion(rpmapp::Cq& cq) {
  ibv_wc wc{};
  auto got = cq.next_for(std::span(&wc, 1), wait_bound);
  if (!got) return rpmapp::unexpected(got.error());
  if (auto ok = rpmapp::check(wc); !ok) return rpmapp::unexpected(ok.error());
  return wc;
}

/// An error for a completion that was not expected.
inline rpmapp::Error unexpected_completion(const ibv_wc& wc, std::string_view wanted) {
  return rpmapp::Error(rpmapp::errc::unknown, 0, "next_completion",
                       fmt::format("expected {}, got a {} completion (wr_id {:#x})", wanted,
                                   rpmapp::to_string(wc.opcode), wc.wr_id));
}

/// The opcode of a flush's completion on `peer`: IBV_WC_FLUSH (8; rdma-core 45 on) where
/// the Peer flushes natively, else IBV_WC_RDMA_READ (librpma 1.2's emulation).
inline rpmapp::expected<ibv_wc_opcode> flush_completion(const rpmapp::Peer& peer) {
  auto native = peer.native_flush();
  if (!native) return rpmapp::unexpected(native.error());
  return *native ? static_cast<ibv_wc_opcode>(8) : IBV_WC_RDMA_READ;
}

/// As next_completion, and checks that it is `opcode`.
inline rpmapp::expected<ibv_wc> next_completion(rpmapp::Cq& cq, ibv_wc_opcode opcode) {
  auto wc = next_completion(cq);
  if (wc && wc->opcode != opcode)
    return rpmapp::unexpected(unexpected_completion(*wc, fmt::format("a {} completion", rpmapp::to_string(opcode))));
  return wc;
}

/// Takes completions of `cq` until those still pending have come: a send's and a
/// receive's can complete in either order. Returns the receive's byte count (0 when no
/// receive was pending).
inline rpmapp::expected<std::uint32_t> await_send_recv(rpmapp::Cq& cq, bool send_pending,
                                                       bool recv_pending) {
  std::uint32_t received = 0;
  while (send_pending || recv_pending) {
    auto wc = next_completion(cq);
    if (!wc) return rpmapp::unexpected(wc.error());
    if (wc->opcode == IBV_WC_SEND && send_pending) {
      send_pending = false;
    } else if (wc->opcode == IBV_WC_RECV && recv_pending) {
      recv_pending = false;
      received = wc->byte_len;
    } else {
      return rpmapp::unexpected(unexpected_completion(*wc, "a send or a receive"));
    }
  }
  return received;
}

}  // namespace example
