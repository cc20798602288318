// Threads on a real RDMA stack (Soft-RoCE in tools/rpmapp-vm), for docs/THREAD_SAFETY.md:
// listen_shared and shutdown from 8 threads on one port; N threads each with their own
// connection (server and client in this process); handles of one shared listener taking
// requests in several threads; and issue 8.7's shared-listener keys and joining Peers on
// the real stack. Runs in the ASan builds' integration suite and, built with
// ThreadSanitizer, in tools/check's TSan run. Catch2 v2 assertions are not thread-safe:
// the threads record what they saw, the main thread asserts.
// Needs $SOFTROCE_IP; fails, never skips, without it. Every wait is bounded.
#include "support.hpp"

#include <fcntl.h>

#include <cerrno>

#include <atomic>
#include <chrono>
#include <cstddef>
#include <latch>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace {

using namespace std::chrono_literals;
using namespace itest;
using rpmapp::Conn;
using rpmapp::ConnEvent;
using rpmapp::ConnReq;
using rpmapp::Endpoint;
using rpmapp::errc;
using rpmapp::Peer;

// What the threads saw that was wrong, one line each; the main thread asserts it is empty.
class Problems {
 public:
  void add(std::string what) {
    std::lock_guard lock(mutex_);
    lines_.push_back(std::move(what));
  }
  template <class T> bool failed(const rpmapp::expected<T>& r, const std::string& what) {
    if (r) return false;
    add(what + ": " + r.error().message());
    return true;
  }
  std::string text() {
    std::lock_guard lock(mutex_);
    std::string out;
    for (const auto& line : lines_) out += line + "\n";
    return out;
  }

 private:
  std::mutex mutex_;
  std::vector<std::string> lines_;
};

// The next event of `conn` within event_wait, "" when it is `want`, else what came.
std::string expect_event(Conn& conn, ConnEvent want) {
  auto event = conn.next_event_for(event_wait);
  if (!event) return "Conn::next_event_for: " + event.error().message();
  if (*event != want)
    return "got " + std::string(rpmapp::to_string(*event)) + ", expected " +
           std::string(rpmapp::to_string(want));
  return {};
}

}  // namespace

// THREAD_SAFETY.md, Endpoint: "listen, listen_shared and shutdown (and destruction) may be
// called concurrently". Issue 8.4: the last handle stops the listener before the port can
// be listened on again, so no listen_shared ever sees EADDRINUSE.
TEST_CASE("threads: listen_shared and shutdown from 8 threads on one port",
          "[threads][shared]") {
  const std::string ip = ip1();
  Peer peer = local_peer(ip);
  const std::string port = "47341";
  constexpr int threads = 8, rounds = 25;
  Problems problems;
  std::atomic<int> listened{0}, plain{0};
  std::latch start(threads);
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t)
    pool.emplace_back([&, t] {
      start.arrive_and_wait();
      for (int i = 0; i < rounds; ++i) {
        const std::string where = "thread " + std::to_string(t) + " round " + std::to_string(i);
        auto ep = Endpoint::listen_shared(peer, ip, port);
        if (problems.failed(ep, where + ": listen_shared")) continue;
        ++listened;
        auto count = ep->share_count();
        if (!problems.failed(count, where + ": share_count") && *count < 1)
          problems.add(where + ": share_count " + std::to_string(*count));
        if (t % 2 == 0) {
          problems.failed(std::move(*ep).shutdown(), where + ": shutdown");
        } else {
          Endpoint dropped = std::move(*ep);  // destruction releases too
        }
        // A plain listener on a port of its own, at the same time.
        if (i % 5 == 0) {
          auto own = Endpoint::listen(peer, ip, "0");
          if (!problems.failed(own, where + ": listen")) ++plain;
        }
      }
    });
  for (auto& th : pool) th.join();
  INFO(problems.text());
  CHECK(problems.text().empty());
  CHECK(listened == threads * rounds);
  CHECK(plain == threads * rounds / 5);
  // Every listener was stopped: the port is free for a plain listen, which serves.
  Endpoint again = MUST(Endpoint::listen(peer, ip, port));
  Conn client = start_client(peer, ip, port, "after");
  Conn server = MUST(take_request(again).connect());
  establish(client, server);
  disconnect_both(client, server);
}

// THREAD_SAFETY.md: Peer "may be used from several threads at once", "creating and
// destroying Peers is thread-safe", "a Peer may be destroyed while endpoints and
// connections made from it are in use in other threads"; ConnReq "ConnReq::to and
// ConnReq::start may be called concurrently"; Conn "one thread per connection needs no
// locking"; Endpoint "listen ... may be called concurrently".
TEST_CASE("threads: N threads each with their own connection, server and client",
          "[threads][conn]") {
  const std::string ip = ip1();
  constexpr int threads = 8;
  std::optional<Peer> server_peer(local_peer(ip));  // shared by all threads
  Problems problems;
  std::latch established(threads + 1), go(1);
  std::atomic<int> closed{0};
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t)
    pool.emplace_back([&, t] {
      const std::string who = "thread " + std::to_string(t);
      bool arrived = false;
      auto arrive = [&] {
        if (!arrived) established.count_down();
        arrived = true;
      };
      [&] {
        auto client_peer = Peer::from_address(ip, rpmapp::AddressKind::local);  // its own
        if (problems.failed(client_peer, who + ": Peer::from_address")) return;
        auto ep = Endpoint::listen(*server_peer, ip, "0");
        if (problems.failed(ep, who + ": listen")) return;
        auto port = ep->port();
        if (problems.failed(port, who + ": port")) return;
        const std::string tag = "client " + std::to_string(t);
        // Even threads ConnReq::to, odd ones ConnReq::start: both concurrently.
        auto out = [&]() -> rpmapp::expected<ConnReq> {
          if (t % 2 == 0) return ConnReq::to(*client_peer, ip, std::to_string(*port));
          auto pending = ConnReq::start(*client_peer, ip, std::to_string(*port));
          if (!pending) return rpmapp::unexpected(pending.error());
          return std::move(*pending).wait();
        }();
        if (problems.failed(out, who + ": ConnReq::to/start")) return;
        auto client = std::move(*out).connect(rpmapp::as_bytes(tag));
        if (problems.failed(client, who + ": ConnReq::connect")) return;
        { Peer gone = std::move(*client_peer); }  // destroyed; its connection lives on
        auto req = ep->next_conn_req_for(event_wait);
        if (problems.failed(req, who + ": next_conn_req_for")) return;
        auto data = req->private_data();
        if (problems.failed(data, who + ": private_data")) return;
        if (rpmapp::as_text(*data) != tag)
          problems.add(who + ": took \"" + std::string(rpmapp::as_text(*data)) + "\"");
        auto server = std::move(*req).connect();
        if (problems.failed(server, who + ": server connect")) return;
        if (auto e = expect_event(*client, ConnEvent::established); !e.empty())
          return problems.add(who + ": client: " + e);
        if (auto e = expect_event(*server, ConnEvent::established); !e.empty())
          return problems.add(who + ": server: " + e);
        problems.failed(std::move(*ep).shutdown(), who + ": shutdown");
        arrive();
        go.wait();  // the main thread destroys the server Peer meanwhile
        if (problems.failed(client->disconnect(), who + ": client disconnect")) return;
        if (auto e = expect_event(*server, ConnEvent::closed); !e.empty())
          return problems.add(who + ": server: " + e);
        if (problems.failed(server->disconnect(), who + ": server disconnect")) return;
        if (auto e = expect_event(*client, ConnEvent::closed); !e.empty())
          return problems.add(who + ": client: " + e);
        ++closed;
      }();
      arrive();
    });
  established.arrive_and_wait();
  server_peer.reset();  // while every thread still holds connections made from it
  go.count_down();
  for (auto& th : pool) th.join();
  INFO(problems.text());
  CHECK(problems.text().empty());
  CHECK(closed == threads);
}

// THREAD_SAFETY.md, Endpoint: "Handles that share one listener (listen_shared) ... may be
// used from different threads at once, each request going to exactly one caller";
// "Requests taken from an Endpoint do not depend on it and may be handed to other
// threads"; ConnReq "A request (and the Conn made from it) may be moved to another thread";
// Endpoint: taken with O_NONBLOCK set, as several threads wait on the one fd.
TEST_CASE("threads: handles of one shared listener take requests in several threads",
          "[threads][shared]") {
  const std::string ip = ip1();
  Peer peer = local_peer(ip);
  constexpr int takers = 4, requests = 8;
  const std::string port = "47342";
  std::vector<Endpoint> handles;
  for (int t = 0; t < takers; ++t) handles.push_back(MUST(Endpoint::listen_shared(peer, ip, port)));
  CHECK(MUST(handles[0].share_count()) == takers);

  Problems problems;
  std::mutex taken_mutex;
  std::vector<ConnReq> taken;  // handed from the taker threads to this one
  std::atomic<int> count{0};
  std::vector<std::thread> pool;
  const auto deadline = std::chrono::steady_clock::now() + 60s;
  for (int t = 0; t < takers; ++t)
    pool.emplace_back([&, t] {
      Endpoint ep = std::move(handles[static_cast<std::size_t>(t)]);
      // Non-blocking, as every taker waits on the one shared fd (see THREAD_SAFETY.md).
      if (auto fd = ep.fd(); !problems.failed(fd, "fd"))
        if (fcntl(*fd, F_SETFL, fcntl(*fd, F_GETFL) | O_NONBLOCK) != 0)
          problems.add("fcntl: errno " + std::to_string(errno));
      while (count < requests && std::chrono::steady_clock::now() < deadline) {
        auto req = ep.next_conn_req_for(100ms);
        if (!req) {
          if (req.error().code() != errc::no_event)
            problems.add("taker " + std::to_string(t) + ": " + req.error().message());
          continue;
        }
        ++count;
        std::lock_guard lock(taken_mutex);
        taken.push_back(std::move(*req));
      }
      // ep goes here, in this thread, while other handles may still be waiting
    });
  std::vector<Conn> clients;
  for (int i = 0; i < requests; ++i)
    clients.push_back(start_client(peer, ip, port, "request " + std::to_string(i)));
  for (auto& th : pool) th.join();
  INFO(problems.text());
  CHECK(problems.text().empty());
  REQUIRE(count == requests);
  REQUIRE(taken.size() == static_cast<std::size_t>(requests));
  // Each request was taken exactly once; the listener is gone, the requests live on.
  std::map<std::string, int> seen;
  std::vector<Conn> servers;
  for (auto& req : taken) {
    ++seen[std::string(rpmapp::as_text(MUST(req.private_data())))];
    servers.push_back(MUST(std::move(req).connect()));
  }
  CHECK(seen.size() == static_cast<std::size_t>(requests));
  // Clients first: the active side sends its RTU when it reads the CONNECT_RESPONSE
  // (librdmacm), so a server's established waits for its own client's event.
  for (auto& client : clients) CHECK(wait_event(client, "client") == ConnEvent::established);
  // The Conns made from the handed-over requests move on to another thread.
  std::vector<std::string> server_events;
  std::thread([&server_events, moved = std::move(servers)]() mutable {
    for (auto& server : moved) server_events.push_back(expect_event(server, ConnEvent::established));
  }).join();
  CHECK(server_events == std::vector<std::string>(static_cast<std::size_t>(requests)));
}

// Issue 8.7 on the real stack: a Peer on the second device joins a wildcard listener
// (before: its device's requests were rejected, "no peer"); "::0" and "::" share one
// listener (before: EADDRINUSE); ("0.0.0.0", P) then ("::", P) is inval, not the IPv4-only
// listener. Needs $SOFTROCE_IP2 (the VM's second device).
TEST_CASE("issue 8.7: shared listener keys and joining Peers on two devices",
          "[threads][shared][issue8]") {
  const std::string ip0 = ip1();
  const std::string ip_other = env_or_fail("SOFTROCE_IP2", "tools/rpmapp-vm sets it (rxe1)");
  Peer peer0 = local_peer(ip0);
  Peer peer1 = local_peer(ip_other);
  const std::string dev1 = MUST(peer1.device_name());
  const std::string port = "47343";
  Endpoint a = MUST(Endpoint::listen_shared(peer0, "0.0.0.0", port));
  Endpoint b = MUST(Endpoint::listen_shared(peer1, "0.0.0.0", port));  // joins with rxe1
  CHECK(MUST(a.share_count()) == 2);
  {
    Conn client = start_client(peer1, ip_other, port, "to rxe1");
    ConnReq req = take_request(a);
    CHECK(MUST(req.device()) == dev1);
    Conn server = MUST(std::move(req).connect());
    establish(client, server);
    disconnect_both(client, server);
  }
  {
    Conn client = start_client(peer0, ip0, port, "to rxe0");
    Conn server = MUST(take_request(b).connect());
    establish(client, server);
    disconnect_both(client, server);
  }
  auto v6 = MUST_FAIL(Endpoint::listen_shared(peer0, "::", port));
  INFO(v6.message());
  CHECK(v6.code() == errc::inval);
  CHECK(v6.message().find("IPv4-only wildcard") != std::string::npos);

  const std::string port6 = "47344";
  Endpoint c = MUST(Endpoint::listen_shared(peer0, "::0", port6));
  Endpoint d = MUST(Endpoint::listen_shared(peer0, "::", port6));
  Endpoint e = MUST(Endpoint::listen_shared(peer0, "", port6));  // "" binds "::"
  CHECK(MUST(c.fd()) == MUST(d.fd()));
  CHECK(MUST(e.fd()) == MUST(d.fd()));
  CHECK(MUST(d.share_count()) == 3);
  CHECK(MUST(d.local_address()) == "::");
}
