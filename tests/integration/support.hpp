// Helpers shared by the rpmapp integration tests and the reliability suites: Catch2
// printing of errc and ConnEvent, the rpmapp names every test uses (with
// `using namespace itest;`), failing (never skipping) when $SOFTROCE_IP is unset,
// MUST/MUST_FAIL, bounded waits for connection events and requests, and a whole
// connect/serve/close round. raw_cm_test.cpp uses librdmacm directly and does not include
// this.
#pragma once

#include "catch2_compat.hpp"

#include <rpmapp/rpmapp.hpp>

#include <sys/utsname.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace Catch {
template <> struct StringMaker<rpmapp::errc> {
  static std::string convert(rpmapp::errc c) { return std::string(rpmapp::to_string(c)); }
};
template <> struct StringMaker<rpmapp::ConnEvent> {
  static std::string convert(rpmapp::ConnEvent e) { return std::string(rpmapp::to_string(e)); }
};
}  // namespace Catch

namespace itest {

// The names (nearly) every test uses; a test's `using namespace itest;` brings them in.
using namespace std::chrono_literals;
using rpmapp::Completion;
using rpmapp::Conn;
using rpmapp::ConnConfig;
using rpmapp::ConnEvent;
using rpmapp::ConnReq;
using rpmapp::Endpoint;
using rpmapp::errc;
using rpmapp::MrLocal;
using rpmapp::MrRemote;
using rpmapp::MrUsage;
using rpmapp::Peer;

// Generous: the VM may run under TCG (about 5x slower than the host).
inline constexpr std::chrono::seconds event_wait{10};

// The value of environment variable `name`; FAILs (never skips) when it is unset or
// empty, with `hint` saying where to run the test.
inline std::string env_or_fail(
    const char* name,
    const char* hint = "run this test on an RDMA device (tools/rpmapp-vm sets it)") {
  const char* value = std::getenv(name);
  if (value == nullptr || *value == '\0') FAIL(name << " is not set: " << hint);
  return value;
}
inline std::string ip1() { return env_or_fail("SOFTROCE_IP"); }
// The iWARP device's (siw0 in tools/rpmapp-vm).
inline std::string iwarp_ip() { return env_or_fail("SOFTROCE_IWARP_IP"); }

template <class T> T must(rpmapp::expected<T> result, const char* what) {
  if (!result) FAIL(what << " failed: " << result.error().message());
  if (!result) throw std::logic_error("unreachable");
  return std::move(*result);
}
inline void must(rpmapp::expected<void> result, const char* what) {
  if (!result) FAIL(what << " failed: " << result.error().message());
}
template <class T> rpmapp::Error must_fail(const rpmapp::expected<T>& result, const char* what) {
  if (result) FAIL(what << " succeeded; an error was expected");
  if (result) throw std::logic_error("unreachable");
  return result.error();
}
#define MUST(expr) ::itest::must((expr), #expr)
#define MUST_FAIL(expr) ::itest::must_fail((expr), #expr)

inline rpmapp::Peer local_peer(const std::string& ip) {
  return MUST(rpmapp::Peer::from_address(ip, rpmapp::AddressKind::local));
}

// Whether the device at `ip` is iWARP: run-suite's iWARP pass runs every test on siw0, and a
// test whose behaviour differs by transport checks each transport's own.
inline bool is_iwarp(const std::string& ip) { return MUST(local_peer(ip).iwarp()); }

// The `rdma link add ... type TYPE` that makes a device like the one at `ip` (the VM's).
inline std::string link_type_of(const std::string& ip) { return is_iwarp(ip) ? "siw" : "rxe"; }

// The running kernel's major and minor version (uname -r): the guest's, in the VM.
inline std::pair<int, int> kernel_version() {
  utsname u{};
  REQUIRE(uname(&u) == 0);
  int major = 0, minor = 0;
  REQUIRE(std::sscanf(u.release, "%d.%d", &major, &minor) == 2);
  return {major, minor};
}

// How many clients a test of many connections in one process runs on the device at `ip`:
// `wanted`, at most 16 on iWARP: siw's provider fails the queue that a process maps at page
// 144 of its device context (docs/peer.md, "queues per process"), which 32 clients and their
// server, each connection with its CQ and queue pair, pass.
inline int clients_on(const std::string& ip, int wanted) { return is_iwarp(ip) ? std::min(wanted, 16) : wanted; }

inline std::string port_text(const rpmapp::Endpoint& ep) { return std::to_string(MUST(ep.port())); }

// A client on `peer` connecting to ip:port with `pdata` as private data.
inline rpmapp::Conn start_client(const rpmapp::Peer& peer, const std::string& ip,
                                 const std::string& port, std::string_view pdata = {},
                                 const rpmapp::ConnConfig& config = {}) {
  auto req = MUST(rpmapp::ConnReq::to(peer, ip, port, config));
  return MUST(std::move(req).connect(rpmapp::as_bytes(pdata)));
}

// The next event of `conn` within event_wait; FAILs naming `who` otherwise.
inline rpmapp::ConnEvent wait_event(rpmapp::Conn& conn, const char* who) {
  auto event = conn.next_event_for(event_wait);
  if (!event) FAIL(who << ": Conn::next_event_for: " << event.error().message());
  return *event;
}

// The next request on `ep` within event_wait; FAILs otherwise.
inline rpmapp::ConnReq take_request(rpmapp::Endpoint& ep, const rpmapp::ConnConfig& config = {}) {
  auto req = ep.next_conn_req_for(event_wait, config);
  if (!req) FAIL("Endpoint::next_conn_req_for: " << req.error().message());
  return std::move(*req);
}

// Both sides see established.
inline void establish(rpmapp::Conn& client, rpmapp::Conn& server) {
  CHECK(wait_event(client, "client") == rpmapp::ConnEvent::established);
  CHECK(wait_event(server, "server") == rpmapp::ConnEvent::established);
}
// iWARP: the kernel resets an IPv4 client's connection to a dual-stack ("") listener (rping
// on siw0 shows the same: REJECTED, ECONNRESET); the client sees rejected and the listener
// gets nothing. The tests that listen on "" check this on iWARP, and 0.0.0.0 serving.
inline void ipv4_client_refused_by_dual_stack(rpmapp::Endpoint& ep, const rpmapp::Peer& peer,
                                              const std::string& ip) {
  rpmapp::Conn client = start_client(peer, ip, port_text(ep), "IPv4 client");
  CHECK(wait_event(client, "IPv4 client") == rpmapp::ConnEvent::rejected);
  CHECK(MUST_FAIL(ep.try_next_conn_req()).code() == rpmapp::errc::no_event);
}

// iWARP's rdma_connect makes the TCP connection itself, synchronously: where nothing listens
// for the address, the call fails with ECONNREFUSED (IB CM answers with an event instead).
inline void connect_refused_by_tcp(const rpmapp::Peer& peer, const std::string& ip,
                                   const std::string& port) {
  auto req = MUST(rpmapp::ConnReq::to(peer, ip, port));
  const rpmapp::Error e = MUST_FAIL(std::move(req).connect(rpmapp::as_bytes("anyone?")));
  INFO(e.message());
  CHECK(e.code() == rpmapp::errc::provider);
  CHECK(e.call() == "rdma_connect");
  CHECK(e.sys_errno() == ECONNREFUSED);
}

// Both sides see closed. rdma_cm: the active side's DISCONNECTED comes with the passive
// side's DREP, which rdma_disconnect on the passive side sends; so each side disconnects.
inline void disconnect_both(rpmapp::Conn& client, rpmapp::Conn& server) {
  MUST(client.disconnect());
  CHECK(wait_event(server, "server") == rpmapp::ConnEvent::closed);
  MUST(server.disconnect());
  CHECK(wait_event(client, "client") == rpmapp::ConnEvent::closed);
}

// `n` clients on `client_peer` connected to `ep` (listening on `ip`), each accepted with
// `config` and established before the next starts; `before_accept(i, request)` runs on
// each request first (to post receives). index_of maps each server connection's ConnId to i.
struct AcceptedClients {
  std::vector<rpmapp::Conn> clients, servers;
  std::map<rpmapp::ConnId, std::size_t> index_of;
};
template <class BeforeAccept>
AcceptedClients accept_clients(std::size_t n, const rpmapp::Peer& client_peer, const std::string& ip,
                               rpmapp::Endpoint& ep, const rpmapp::ConnConfig& config, BeforeAccept before_accept) {
  AcceptedClients all;
  for (std::size_t i = 0; i < n; ++i) {
    all.clients.push_back(start_client(client_peer, ip, port_text(ep)));
    rpmapp::ConnReq req = take_request(ep, config);
    all.index_of[MUST(req.id())] = i;
    before_accept(i, req);
    all.servers.push_back(MUST(std::move(req).connect()));
    CHECK(all.index_of.count(MUST(all.servers.back().id())) == 1);
    establish(all.clients.back(), all.servers.back());
  }
  return all;
}

// The endpoint serves: a client on `client_peer` connects to `ep` (listening on `ip`), is
// accepted, both sides see established and then closed, and both are closed.
inline void check_serves(const rpmapp::Peer& client_peer, const std::string& ip, rpmapp::Endpoint& ep) {
  rpmapp::Conn client = start_client(client_peer, ip, port_text(ep));
  rpmapp::Conn server = MUST(take_request(ep).connect());
  establish(client, server);
  disconnect_both(client, server);
  MUST(std::move(client).close());
  MUST(std::move(server).close());
}

}  // namespace itest
