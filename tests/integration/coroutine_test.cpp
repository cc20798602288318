// Coroutines on rpmapp's EventLoop on a real RDMA stack (Soft-RoCE in tools/rpmapp-vm):
// a coroutine server with 32 coroutine clients (16 on iWARP) on one loop in one thread (private data
// and a send/recv echo per connection, checked by content), next_event seeing the peer's
// disconnect, connect to a port nobody listens on, next_conn_req cancelled by its timeout,
// by stop() from another thread and by the endpoint's shutdown, and completions() of a
// real send and receive (main and receive queues).
// Server and clients run in one process, over $SOFTROCE_IP. Needs $SOFTROCE_IP; fails,
// never skips, without it. Every await has a timeout and every loop run is bounded.
#include "support.hpp"
#include "../sysctl.hpp"

#include <rpmapp/task.hpp>

#include <infiniband/verbs.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <coroutine>
#include <cstddef>
#include <cstring>
#include <exception>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

namespace {

using namespace std::chrono_literals;
using namespace itest;
using rpmapp::Conn;
using rpmapp::ConnConfig;
using rpmapp::ConnEvent;
using rpmapp::ConnReq;
using rpmapp::CqKind;
using rpmapp::Endpoint;
using rpmapp::errc;
using rpmapp::EventLoop;
using rpmapp::expected;
using rpmapp::MrLocal;
using rpmapp::MrUsage;
using rpmapp::Peer;
using rpmapp::Task;
using clock_type = std::chrono::steady_clock;

constexpr std::chrono::milliseconds await_bound = event_wait;  // each co_await
constexpr std::chrono::milliseconds run_bound = 120s;          // a whole loop run

EventLoop make_loop() { return MUST(EventLoop::create()); }

rpmapp::Error failure(std::string reason) { return rpmapp::Error(errc::unknown, 0, "coroutine_test", reason); }

// Runs `loop` until `done()` or `bound` has passed.
template <class Done> void run_until(EventLoop& loop, Done done, std::chrono::milliseconds bound = run_bound) {
  const auto deadline = clock_type::now() + bound;
  while (!done() && clock_type::now() < deadline) MUST(loop.run_once(100ms));
  REQUIRE(done());
}

// Takes completions of `conn`'s queue `which` until one with `opcode` came; checks its
// status.
Task<expected<ibv_wc>> next_completion(EventLoop& loop, Conn& conn, ibv_wc_opcode opcode,
                                       CqKind which = CqKind::main) {
  ibv_wc wc{};
  auto got = co_await loop.completions(conn, std::span(&wc, 1), which, await_bound);
  if (!got) co_return rpmapp::unexpected(got.error());
  if (got->size() != 1) co_return rpmapp::unexpected(failure("completions returned an empty batch"));
  if (auto ok = rpmapp::check(wc); !ok) co_return rpmapp::unexpected(ok.error());
  if (wc.opcode != opcode)
    co_return rpmapp::unexpected(failure("got a " + std::string(rpmapp::to_string(wc.opcode)) + " completion, expected " +
                                         std::string(rpmapp::to_string(opcode))));
  co_return wc;
}

// ---- the coroutine echo server and its clients

constexpr std::size_t slot = 64;

std::string private_data_of(int n) { return "coroutine client " + std::to_string(n); }
// Distinct per connection, so a message answered on the wrong connection is seen.
std::string message_of(int n) { return "message " + std::to_string(n * 7919) + " of client " + std::to_string(n); }

struct EchoServer {
  EchoServer(EventLoop& l, Endpoint& e, MrLocal& m, char* mem) : loop(l), endpoint(e), mr(m), memory(mem) {}
  EventLoop& loop;
  Endpoint& endpoint;
  MrLocal& mr;
  char* memory;  // `slot` bytes per connection, registered by mr
  rpmapp::ConnConfig config{};  // each accepted connection's
  int clients = 0;              // how many it accepts
  int accepted = 0;
  int served = 0;
  std::vector<std::string> errors;
  std::map<std::string, std::string> received;  // private data -> message

  Task<expected<void>> echo(ConnReq req, std::size_t offset) {
    auto data = req.private_data();
    if (!data) co_return rpmapp::unexpected(data.error());
    const std::string text(rpmapp::as_text(*data));
    if (auto ok = req.recv(mr, offset, slot); !ok) co_return ok;
    auto conn = std::move(req).connect(rpmapp::as_bytes(text));
    if (!conn) co_return rpmapp::unexpected(conn.error());
    auto event = co_await loop.next_event(*conn, await_bound);
    if (!event) co_return rpmapp::unexpected(event.error());
    if (*event != ConnEvent::established) co_return rpmapp::unexpected(failure(text + ": not established"));
    auto wc = co_await next_completion(loop, *conn, IBV_WC_RECV);
    if (!wc) co_return rpmapp::unexpected(wc.error());
    received[text] = std::string(memory + offset, wc->byte_len);
    if (auto ok = conn->send(mr, offset, wc->byte_len); !ok) co_return ok;
    if (auto sent = co_await next_completion(loop, *conn, IBV_WC_SEND); !sent) co_return rpmapp::unexpected(sent.error());
    event = co_await loop.next_event(*conn, await_bound);
    if (!event) co_return rpmapp::unexpected(event.error());
    if (*event != ConnEvent::closed) co_return rpmapp::unexpected(failure(text + ": not closed by the client"));
    co_return std::move(*conn).close();
  }
  Task<> serve(ConnReq req, std::size_t offset) {
    auto done = co_await echo(std::move(req), offset);
    if (done) ++served;
    else errors.push_back("server: " + done.error().message());
  }
  Task<> accept_all() {
    for (; accepted < clients; ++accepted) {
      auto req = co_await loop.next_conn_req(endpoint, config, await_bound);
      if (!req) {
        errors.push_back("server: " + req.error().message());
        co_return;
      }
      const std::size_t offset = static_cast<std::size_t>(accepted) * slot;
      if (auto ok = rpmapp::spawn(loop, serve(std::move(*req), offset)); !ok) errors.push_back(ok.error().message());
    }
  }
};

struct EchoClients {
  EchoClients(EventLoop& l, const Peer& p, std::string i, std::string po, MrLocal& m, char* mem)
      : loop(l), peer(p), ip(std::move(i)), port(std::move(po)), mr(m), memory(mem) {}
  EventLoop& loop;
  const Peer& peer;
  std::string ip, port;
  MrLocal& mr;
  char* memory;  // what mr registers; from `clients * slot` on, 2 * `slot` bytes per client: message, answer
  rpmapp::ConnConfig config{};  // each client's
  int clients = 0;              // how many there are
  int echoed = 0;
  int ended = 0;
  std::vector<std::string> errors;

  Task<expected<void>> echo(int n) {
    const std::string data = private_data_of(n);
    const std::string message = message_of(n);
    const std::size_t offset = static_cast<std::size_t>(clients) * slot + static_cast<std::size_t>(n) * 2 * slot;
    auto conn = co_await loop.connect(peer, ip, port, config, rpmapp::as_bytes(data), await_bound);
    if (!conn) co_return rpmapp::unexpected(conn.error());
    auto accepted = conn->private_data();
    if (!accepted) co_return rpmapp::unexpected(accepted.error());
    if (rpmapp::as_text(*accepted) != data)
      co_return rpmapp::unexpected(failure(data + ": accepted with \"" + std::string(rpmapp::as_text(*accepted)) + "\""));
    if (auto ok = conn->recv(mr, offset + slot, slot); !ok) co_return ok;
    std::memcpy(memory + offset, message.data(), message.size());
    if (auto ok = conn->send(mr, offset, message.size()); !ok) co_return ok;
    // One completion at a time: the send's and the receive's may come in either order.
    bool sent = false;
    std::optional<std::uint32_t> answer_size;
    while (!sent || !answer_size) {
      ibv_wc wc{};
      auto got = co_await loop.completions(*conn, std::span(&wc, 1), CqKind::main, await_bound);
      if (!got) co_return rpmapp::unexpected(got.error());
      if (auto ok = rpmapp::check(wc); !ok) co_return ok;
      if (wc.opcode == IBV_WC_SEND) sent = true;
      else if (wc.opcode == IBV_WC_RECV) answer_size = wc.byte_len;
    }
    const std::string answer(memory + offset + slot, *answer_size);
    if (answer != message) co_return rpmapp::unexpected(failure(data + ": sent \"" + message + "\", got \"" + answer + "\""));
    if (auto ok = conn->disconnect(); !ok) co_return ok;
    auto event = co_await loop.next_event(*conn, await_bound);
    if (!event) co_return rpmapp::unexpected(event.error());
    if (*event != ConnEvent::closed) co_return rpmapp::unexpected(failure(data + ": not closed"));
    co_return std::move(*conn).close();
  }
  Task<> run(int n) {
    auto done = co_await echo(n);
    if (done) ++echoed;
    else errors.push_back("client " + std::to_string(n) + ": " + done.error().message());
    ++ended;
  }
};

// A connected pair (blocking API), both sides established.
struct Pair {
  Conn client;
  Conn server;
};
Pair connect_pair(const Peer& peer, Endpoint& ep, const std::string& ip, const ConnConfig& server_config = {},
                  std::string_view pdata = "pair") {
  Conn client = start_client(peer, ip, port_text(ep), pdata);
  ConnReq req = take_request(ep, server_config);
  Conn server = MUST(std::move(req).connect());
  establish(client, server);
  return {std::move(client), std::move(server)};
}

// A coroutine type of the user's own, not rpmapp::Task: starts at once, nobody awaits it,
// its frame goes when it ends. The loop's awaitables only need it resumed on the loop's
// thread, which they do themselves.
struct Detached {
  struct promise_type {
    Detached get_return_object() noexcept { return {}; }
    std::suspend_never initial_suspend() noexcept { return {}; }
    std::suspend_never final_suspend() noexcept { return {}; }
    void return_void() noexcept {}
    void unhandled_exception() noexcept { std::terminate(); }
  };
};

std::string as_text_of(const Conn& conn) { return std::string(rpmapp::as_text(MUST(conn.private_data()))); }

std::string unused_port(const Peer& peer, const std::string& ip) {
  Endpoint ep = MUST(Endpoint::listen(peer, ip, "0"));
  std::string port = port_text(ep);
  MUST(std::move(ep).shutdown());
  return port;
}

}  // namespace

// The echo: `clients` coroutine clients (with `client_config`) and a coroutine server (with
// `server_config`) on one loop; each client's message comes back on its own connection.
static void check_echo(const rpmapp::ConnConfig& server_config, const rpmapp::ConnConfig& client_config) {
  const std::string ip = ip1();
  Peer peer = local_peer(ip);
  const int clients = clients_on(ip, 32);
  std::vector<char> memory(static_cast<std::size_t>(clients) * slot + static_cast<std::size_t>(clients + 1) * 2 * slot);
  MrLocal mr = MUST(MrLocal::reg(peer, memory.data(), memory.size(), MrUsage::send | MrUsage::recv));
  Endpoint ep = MUST(Endpoint::listen(peer, ip, "0"));
  EventLoop loop = make_loop();

  EchoServer server{loop, ep, mr, memory.data()};
  server.config = server_config;
  server.clients = clients;
  EchoClients users{loop, peer, ip, port_text(ep), mr, memory.data()};
  users.config = client_config;
  users.clients = clients;
  MUST(rpmapp::spawn(loop, server.accept_all()));
  for (int n = 1; n <= clients; ++n) MUST(rpmapp::spawn(loop, users.run(n)));

  run_until(loop, [&] {
    return users.ended == clients && server.served + static_cast<int>(server.errors.size()) >= clients;
  });
  CHECK(server.errors == std::vector<std::string>{});
  CHECK(users.errors == std::vector<std::string>{});
  CHECK(server.accepted == clients);
  CHECK(server.served == clients);
  CHECK(users.echoed == clients);
  // Each connection's message reached the server under that connection's private data.
  REQUIRE(server.received.size() == static_cast<std::size_t>(clients));
  for (int n = 1; n <= clients; ++n) CHECK(server.received[private_data_of(n)] == message_of(n));
}

TEST_CASE("a coroutine server and 32 coroutine clients (16 on iWARP) on one loop in one thread: private data and a "
          "send/recv echo per connection",
          "[coroutine][echo]") {
  check_echo({}, {});
}

// The kernel's rdma_cm events of 64 connections through two channels: resolution, connect,
// accept (rdma_migrate_id onto the shared channel), established and disconnected, each
// routed to its own connection's coroutine.
TEST_CASE("the coroutine echo with every connection on a shared event channel: the server's 32 on one, "
          "the clients' 32 on another",
          "[coroutine][echo][shared-events]") {
  rpmapp::SharedEventChannel server_events = MUST(rpmapp::SharedEventChannel::create());
  rpmapp::SharedEventChannel client_events = MUST(rpmapp::SharedEventChannel::create());
  check_echo({.shared_event_channel = &server_events}, {.shared_event_channel = &client_events});
  CHECK(MUST(server_events.connections()) == 0);  // all released
  CHECK(MUST(client_events.connections()) == 0);
}

TEST_CASE("next_event: a coroutine waiting on a Conn sees closed when the peer disconnects",
          "[coroutine][next_event]") {
  const std::string ip = ip1();
  Peer peer = local_peer(ip);
  Endpoint ep = MUST(Endpoint::listen(peer, ip, "0"));
  Pair pair = connect_pair(peer, ep, ip);
  EventLoop loop = make_loop();

  // The waiter is suspended (nothing pending) before the client disconnects.
  bool waiting = false, disconnected = false;
  std::optional<clock_type::time_point> disconnected_at;
  auto disconnect_later = [&]() -> Task<> {
    auto slept = co_await loop.sleep_for(100ms);
    if (!slept) co_return;
    disconnected = static_cast<bool>(pair.client.disconnect());
    disconnected_at = clock_type::now();
  };
  auto wait_closed = [&]() -> Task<expected<ConnEvent>> {
    waiting = true;
    co_return co_await loop.next_event(pair.server, await_bound);
  };
  MUST(rpmapp::spawn(loop, disconnect_later()));
  auto event = MUST(rpmapp::block_on(loop, wait_closed()));
  CHECK(waiting);
  REQUIRE(disconnected);
  REQUIRE(event);
  CHECK(*event == ConnEvent::closed);

  // And the other way round: the server disconnects, the client's coroutine sees closed.
  MUST(pair.server.disconnect());
  auto client_event = MUST(rpmapp::block_on(loop, [&]() -> Task<expected<ConnEvent>> {
    co_return co_await loop.next_event(pair.client, await_bound);
  }()));
  REQUIRE(client_event);
  CHECK(*client_event == ConnEvent::closed);
}

TEST_CASE("connect to a port nobody listens on: the coroutine resumes with ECONNREFUSED on both transports",
          "[coroutine][connect]") {
  const std::string ip = ip1();
  Peer peer = local_peer(ip);
  const std::string port = unused_port(peer, ip);
  EventLoop loop = make_loop();
  const auto t0 = clock_type::now();
  auto conn = MUST(rpmapp::block_on(loop, [&]() -> Task<expected<Conn>> {
    co_return co_await loop.connect(peer, ip, port, {}, rpmapp::as_bytes("anyone?"), await_bound);
  }()));
  const auto took = clock_type::now() - t0;
  REQUIRE_FALSE(conn);
  INFO(conn.error().message());
  // rxe: the passive side's CM answers a request for a service ID nobody listens on with a
  // REJ (invalid service ID), which rdma_cm reports as REJECTED; iWARP: rdma_connect's own
  // TCP connection is refused.
  CHECK(conn.error().code() == errc::provider);
  CHECK(conn.error().sys_errno() == ECONNREFUSED);
  CHECK(conn.error().call() == "rdma_connect");
  CHECK(took < await_bound);
}

TEST_CASE("connect to an address nobody has: the await's timeout ends it and the loop runs on meanwhile, on both "
          "transports (iWARP's blocking rdma_connect is made on a thread of its own)",
          "[coroutine][connect][stall]") {
  const std::string ip = ip1();
  Peer peer = local_peer(ip);
  // siw's rdma_connect takes TCP's SYN retries: 1 makes it 3 s (1 s, then 2 s), not 130 s
  rpmapp_tests::Sysctl syn_retries("/proc/sys/net/ipv4/tcp_syn_retries", "1");
  // the VM's netdevs are dummies: nothing answers for another host of the subnet
  const std::string nobody = ip.substr(0, ip.rfind('.') + 1) + "9";
  const auto bound = 500ms;
  std::optional<EventLoop> loop(make_loop());
  std::vector<clock_type::time_point> ticks;
  bool connecting = true;
  auto ticker = [&]() -> Task<void> {
    while (connecting) {
      auto slept = co_await loop->sleep_for(20ms);
      if (!slept) co_return;
      ticks.push_back(clock_type::now());
    }
  };
  MUST(rpmapp::spawn(*loop, ticker()));
  const auto t0 = clock_type::now();
  auto conn = MUST(rpmapp::block_on(*loop, [&]() -> Task<expected<Conn>> {
    auto c = co_await loop->connect(peer, nobody, "7471", {}, {}, bound);
    connecting = false;
    co_return c;
  }()));
  const auto took = clock_type::now() - t0;
  REQUIRE_FALSE(conn);
  INFO(conn.error().message());
  CHECK(conn.error().code() == errc::no_event);
  CHECK(conn.error().call() == "EventLoop::connect");
  CHECK(took >= bound);
  CHECK(took < 2500ms);  // before siw's rdma_connect returns (3 s)
  // the loop ran its other coroutine all along: no gap near the connect's length
  REQUIRE(ticks.size() >= 2);
  auto largest = ticks.front() - t0;
  for (std::size_t i = 1; i < ticks.size(); ++i) largest = std::max(largest, ticks[i] - ticks[i - 1]);
  CHECK(largest < 1s);
  // the loop keeps an iWARP call in progress and waits for it when destroyed
  loop.reset();
}

TEST_CASE("next_conn_req: a timeout resumes the coroutine with no_event, and the endpoint still works",
          "[coroutine][next_conn_req][cancel]") {
  const std::string ip = ip1();
  Peer peer = local_peer(ip);
  Endpoint ep = MUST(Endpoint::listen(peer, ip, "0"));
  EventLoop loop = make_loop();

  int resumed = 0;
  const auto t0 = clock_type::now();
  auto req = MUST(rpmapp::block_on(loop, [&]() -> Task<expected<ConnReq>> {
    auto r = co_await loop.next_conn_req(ep, {}, 300ms);
    ++resumed;
    co_return r;
  }()));
  const auto took = clock_type::now() - t0;
  REQUIRE_FALSE(req);
  CHECK(req.error().code() == errc::no_event);
  CHECK(req.error().call() == "EventLoop::next_conn_req");
  CHECK(took >= 300ms);
  CHECK(took < 5s);
  CHECK(resumed == 1);

  // A request that comes later is taken by the next await.
  Conn client = start_client(peer, ip, port_text(ep), "after the timeout");
  auto later = MUST(rpmapp::block_on(loop, [&]() -> Task<expected<ConnReq>> {
    co_return co_await loop.next_conn_req(ep, {}, await_bound);
  }()));
  REQUIRE(later);
  CHECK(rpmapp::as_text(MUST(later->private_data())) == "after the timeout");
  MUST(std::move(*later).reject());
  CHECK(wait_event(client, "client") == ConnEvent::rejected);
}

TEST_CASE("next_conn_req: stop() from another thread resumes the awaiting coroutine once, with no_event",
          "[coroutine][next_conn_req][cancel]") {
  const std::string ip = ip1();
  Peer peer = local_peer(ip);
  Endpoint ep = MUST(Endpoint::listen(peer, ip, "0"));
  EventLoop loop = make_loop();

  int resumed = 0;
  std::optional<expected<ConnReq>> result;
  auto accept_one = [&]() -> Task<> {
    auto r = co_await loop.next_conn_req(ep);  // no timeout of its own: only stop() ends it
    ++resumed;
    result.emplace(std::move(r));
  };
  MUST(rpmapp::spawn(loop, accept_one()));
  std::atomic<bool> stopped{false};
  std::thread stopper([&] {
    std::this_thread::sleep_for(300ms);
    stopped = true;
    loop.stop();
  });
  const auto t0 = clock_type::now();
  auto ran = loop.run_for(30s);
  const auto took = clock_type::now() - t0;
  stopper.join();
  MUST(ran);
  CHECK(stopped);
  CHECK(took < 20s);
  CHECK(resumed == 1);
  REQUIRE(result.has_value());
  REQUIRE_FALSE(*result);
  CHECK(result->error().code() == errc::no_event);
  CHECK(std::string(result->error().reason()).find("stopped") != std::string::npos);

  // The loop is usable again; the coroutine is gone and is not resumed a second time.
  MUST(loop.run_for(200ms));
  CHECK(resumed == 1);
}

TEST_CASE("next_conn_req: shutting the endpoint down resumes the awaiting coroutine with inval",
          "[coroutine][next_conn_req][cancel]") {
  const std::string ip = ip1();
  Peer peer = local_peer(ip);
  Endpoint ep = MUST(Endpoint::listen(peer, ip, "0"));
  EventLoop loop = make_loop();

  int resumed = 0;
  std::optional<expected<ConnReq>> result;
  auto accept_one = [&]() -> Task<> {
    auto r = co_await loop.next_conn_req(ep, {}, await_bound);
    ++resumed;
    result.emplace(std::move(r));
  };
  auto shut_down_later = [&]() -> Task<> {
    if (auto slept = co_await loop.sleep_for(100ms); slept) MUST(std::move(ep).shutdown());
  };
  MUST(rpmapp::spawn(loop, accept_one()));
  MUST(rpmapp::spawn(loop, shut_down_later()));
  run_until(loop, [&] { return result.has_value(); }, 20s);
  CHECK(resumed == 1);
  REQUIRE_FALSE(*result);
  CHECK(result->error().code() == errc::inval);
}

TEST_CASE("completions: a coroutine awaits a real send and receive, the receive CQ too",
          "[coroutine][completions]") {
  const std::string ip = ip1();
  Peer peer = local_peer(ip);
  Endpoint ep = MUST(Endpoint::listen(peer, ip, "0"));
  std::array<char, 256> memory{};
  MrLocal mr = MUST(MrLocal::reg(peer, memory.data(), memory.size(), MrUsage::send | MrUsage::recv));
  EventLoop loop = make_loop();

  const CqKind which = GENERATE(CqKind::main, CqKind::receive);
  ConnConfig server_config;
  if (which == CqKind::receive) server_config.rcq_size = 4;
  INFO((which == CqKind::main ? "receive completions on the main CQ" : "receive completions on the receive CQ"));
  Pair pair = connect_pair(peer, ep, ip, server_config);

  // The receiver awaits first (its queue is empty: it suspends on the completion channel);
  // the sender sends 100 ms later.
  constexpr std::string_view text = "a message the coroutine receives";
  MUST(pair.server.recv(mr, 128, 128, 0x5e7));
  bool suspended_before_send = false;
  auto send_later = [&]() -> Task<expected<ibv_wc>> {
    auto slept = co_await loop.sleep_for(100ms);
    if (!slept) co_return rpmapp::unexpected(slept.error());
    std::memcpy(memory.data(), text.data(), text.size());
    if (auto ok = pair.client.send(mr, 0, text.size(), rpmapp::Completion::always, 0x5e0d); !ok)
      co_return rpmapp::unexpected(ok.error());
    co_return co_await next_completion(loop, pair.client, IBV_WC_SEND);
  };
  std::optional<expected<ibv_wc>> sent;
  auto sender = [&]() -> Task<> { sent.emplace(co_await send_later()); };
  MUST(rpmapp::spawn(loop, sender()));
  auto received = MUST(rpmapp::block_on(loop, [&]() -> Task<expected<ibv_wc>> {
    suspended_before_send = !sent.has_value();
    co_return co_await next_completion(loop, pair.server, IBV_WC_RECV, which);
  }()));
  run_until(loop, [&] { return sent.has_value(); }, 20s);

  CHECK(suspended_before_send);
  REQUIRE(received);
  CHECK(received->wr_id == 0x5e7);
  CHECK(received->byte_len == text.size());
  CHECK(std::string_view(memory.data() + 128, text.size()) == text);
  REQUIRE(*sent);
  CHECK((*sent)->wr_id == 0x5e0d);
  CHECK((*sent)->qp_num == MUST(pair.client.qp_num()));
  CHECK(received->qp_num == MUST(pair.server.qp_num()));
  disconnect_both(pair.client, pair.server);
}

TEST_CASE("a coroutine of the user's own type (not Task) awaits a request and the connection's events",
          "[coroutine][own-type]") {
  const std::string ip = ip1();
  Peer peer = local_peer(ip);
  Endpoint ep = MUST(Endpoint::listen(peer, ip, "0"));
  EventLoop loop = make_loop();

  std::optional<std::string> request_data;
  std::optional<expected<ConnEvent>> established, closed;
  std::optional<rpmapp::Error> failed;
  bool ended = false;
  // Started here, on the loop's thread: it suspends in the first co_await and is resumed by
  // the loop from then on.
  auto serve_one = [&]() -> Detached {
    auto req = co_await loop.next_conn_req(ep, {}, await_bound);
    if (!req) {
      failed = req.error();
      ended = true;
      co_return;
    }
    if (auto data = req->private_data(); data) request_data = std::string(rpmapp::as_text(*data));
    auto conn = std::move(*req).connect(rpmapp::as_bytes("welcome"));
    if (!conn) {
      failed = conn.error();
      ended = true;
      co_return;
    }
    established = co_await loop.next_event(*conn, await_bound);
    closed = co_await loop.next_event(*conn, await_bound);
    ended = true;
  };
  serve_one();
  CHECK_FALSE(ended);  // suspended: nothing has come yet

  Conn client = start_client(peer, ip, port_text(ep), "own type");
  run_until(loop, [&] { return request_data.has_value() || ended; }, 30s);
  // librdmacm sends the RTU that completes the server's side when the client reads its
  // CONNECT_RESPONSE: the client's event first, then the server's.
  CHECK(wait_event(client, "client") == ConnEvent::established);
  CHECK(as_text_of(client) == "welcome");
  run_until(loop, [&] { return established.has_value() || ended; }, 30s);
  MUST(client.disconnect());
  run_until(loop, [&] { return ended; }, 30s);

  if (failed) FAIL(failed->message());
  CHECK(request_data == "own type");
  REQUIRE(established);
  if (!*established) FAIL("established: " << established->error().message());
  CHECK(**established == ConnEvent::established);
  REQUIRE(closed);
  if (!*closed) FAIL("closed: " << closed->error().message());
  CHECK(**closed == ConnEvent::closed);
}
