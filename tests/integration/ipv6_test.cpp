// IPv6 on a real RDMA stack (Soft-RoCE in tools/rpmapp-vm): listening on and connecting
// to a link-local address with a scope ("fe80::77:1%rxenet0"), the "" wildcard serving
// IPv4 and IPv6 clients, and addresses read back that round-trip into ConnReq::to.
// Needs $SOFTROCE_IP, $SOFTROCE_IP6 (a link-local address of $SOFTROCE_NETDEV) and
// $SOFTROCE_NETDEV; fails, never skips, without them. Every wait is bounded.
#include "support.hpp"

#include <net/if.h>

#include <cstddef>
#include <cstdlib>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace {

using namespace itest;
using rpmapp::AddressKind;
using rpmapp::Conn;
using rpmapp::ConnEvent;
using rpmapp::ConnReq;
using rpmapp::Endpoint;
using rpmapp::errc;
using rpmapp::Peer;

const char* const ip6_hint =
    "run this test in tools/rpmapp-vm, which gives rxenet0 an IPv6 link-local address";

// "$SOFTROCE_IP6%$SOFTROCE_NETDEV", e.g. "fe80::77:1%rxenet0".
std::string scoped_ip6() {
  return env_or_fail("SOFTROCE_IP6", ip6_hint) + "%" + env_or_fail("SOFTROCE_NETDEV", ip6_hint);
}

bool starts_with(std::span<const std::byte> data, std::string_view prefix) {
  return data.size() >= prefix.size() &&
         std::string_view(reinterpret_cast<const char*>(data.data()), prefix.size()) == prefix;
}

// A client on `peer` connects to addr:port of `ep` with private data, the server accepts
// with its own, both see established and each side's private data; returns both sides.
std::pair<Conn, Conn> connect_pair(Endpoint& ep, const Peer& peer, const std::string& addr,
                                   std::string_view hello, std::string_view welcome,
                                   std::string* request_peer = nullptr) {
  Conn client = start_client(peer, addr, port_text(ep), hello);
  ConnReq req = take_request(ep);
  CHECK(starts_with(MUST(req.private_data()), hello));
  if (request_peer != nullptr) *request_peer = MUST(req.peer_address());
  Conn server = MUST(std::move(req).connect(rpmapp::as_bytes(welcome)));
  establish(client, server);
  CHECK(starts_with(MUST(client.private_data()), welcome));
  CHECK(starts_with(MUST(server.private_data()), hello));
  return {std::move(client), std::move(server)};
}

}  // namespace

TEST_CASE("issue 8.8: a listener on a scoped link-local IPv6 address serves a client",
          "[ipv6][scope]") {
  const std::string scoped = scoped_ip6();
  const std::string netdev = env_or_fail("SOFTROCE_NETDEV");
  INFO("address " << scoped);
  Peer peer = MUST(Peer::from_address(scoped, AddressKind::local));
  if (const char* dev = std::getenv("SOFTROCE_DEV")) CHECK(MUST(peer.device_name()) == dev);
  Peer reached = MUST(Peer::from_address(scoped, AddressKind::remote));
  CHECK(MUST(reached.device_name()) == MUST(peer.device_name()));

  Endpoint ep = MUST(Endpoint::listen(peer, scoped, "0"));
  CHECK(MUST(ep.device()) == MUST(peer.device_name()));
  CHECK(MUST(ep.local_address()) == scoped);

  std::string request_peer;
  auto [client, server] = connect_pair(ep, peer, scoped, "hello over IPv6", "welcome over IPv6",
                                       &request_peer);
  CHECK(MUST(client.peer_address()) == scoped);
  // rxe loops back to its own address: the request comes from a link-local address of
  // the same netdev, reported with its scope
  CHECK(request_peer.ends_with("%" + netdev));
  CHECK(request_peer.starts_with("fe80::"));
  CHECK(MUST(server.peer_address()) == request_peer);
  disconnect_both(client, server);

  // the scope as an interface index: the same address, read back with the name
  const std::string by_index =
      env_or_fail("SOFTROCE_IP6") + "%" + std::to_string(if_nametoindex(netdev.c_str()));
  Endpoint ep2 = MUST(Endpoint::listen(peer, by_index, "0"));
  CHECK(MUST(ep2.local_address()) == scoped);
  auto [c2, s2] = connect_pair(ep2, peer, by_index, "by index", "welcome by index");
  disconnect_both(c2, s2);
}

TEST_CASE("issue 8.8: addresses read back round-trip into ConnReq::to", "[ipv6][scope]") {
  const std::string scoped = scoped_ip6();
  Peer peer = local_peer(scoped);
  Endpoint ep = MUST(Endpoint::listen(peer, scoped, "0"));

  // the listener's own address, as local_address reports it
  std::string request_peer;
  auto [c1, s1] = connect_pair(ep, peer, MUST(ep.local_address()), "one", "first", &request_peer);
  // the address the server saw the client at (on rxe, an address of the same netdev)
  auto [c2, s2] = connect_pair(ep, peer, request_peer, "two", "second");
  // the address the client connected to, as it reports it
  auto [c3, s3] = connect_pair(ep, peer, MUST(c1.peer_address()), "three", "third");
  disconnect_both(c1, s1);
  disconnect_both(c2, s2);
  disconnect_both(c3, s3);
}

TEST_CASE("issue 8.8: \"\" listens for IPv4 and IPv6 clients (IPv6 only on iWARP); 0.0.0.0 only for "
          "IPv4",
          "[ipv6][wildcard]") {
  const std::string ip4 = ip1();
  const std::string scoped = scoped_ip6();
  Peer peer = local_peer(ip4);

  Endpoint all = MUST(Endpoint::listen(peer, "", "0"));
  CHECK(MUST(all.local_address()) == "::");
  CHECK(MUST(all.device()).empty());
  std::string from_v6;
  auto [c6, s6] = connect_pair(all, peer, scoped, "IPv6 client", "IPv6 welcome", &from_v6);
  CHECK(from_v6.starts_with("fe80::"));
  if (is_iwarp(ip4)) {
    ipv4_client_refused_by_dual_stack(all, peer, ip4);
  } else {
    std::string from_v4;
    auto [c4, s4] = connect_pair(all, peer, ip4, "IPv4 client", "IPv4 welcome", &from_v4);
    // rdma_cm hands an IPv4 request on an IPv6 wildcard over with IPv4 addresses
    CHECK(from_v4 == ip4);
    disconnect_both(c4, s4);
  }
  disconnect_both(c6, s6);

  // "0.0.0.0" is IPv4 only: rdma_cm finds no listener for an IPv6 request (rejected)
  Endpoint v4 = MUST(Endpoint::listen(peer, "0.0.0.0", "0"));
  CHECK(MUST(v4.local_address()) == "0.0.0.0");
  if (is_iwarp(ip4)) {
    connect_refused_by_tcp(peer, scoped, port_text(v4));
  } else {
    Conn refused = start_client(peer, scoped, port_text(v4), "IPv6 to an IPv4 listener");
    CHECK(wait_event(refused, "IPv6 client") == ConnEvent::rejected);
  }
  CHECK(MUST_FAIL(v4.try_next_conn_req()).code() == errc::no_event);
  auto [c, s] = connect_pair(v4, peer, ip4, "IPv4 client", "IPv4 welcome");
  disconnect_both(c, s);
}

TEST_CASE("issue 8.8: \"\" serves IPv6 clients on both devices", "[ipv6][wildcard][devices]") {
  const std::string second = env_or_fail("SOFTROCE_IP6_2", ip6_hint) + "%" +
                             env_or_fail("SOFTROCE_NETDEV2", ip6_hint);
  Peer peer0 = local_peer(scoped_ip6());
  Peer peer1 = local_peer(second);
  CHECK(MUST(peer0.device_name()) != MUST(peer1.device_name()));
  std::vector<Peer> peers;
  peers.push_back(std::move(peer0));
  peers.push_back(std::move(peer1));
  Endpoint all = MUST(Endpoint::listen(peers, "", "0"));
  auto [c0, s0] = connect_pair(all, peers[0], scoped_ip6(), "to rxe0", "from rxe0");
  auto [c1, s1] = connect_pair(all, peers[1], second, "to rxe1", "from rxe1");
  CHECK(std::string(MUST(s0.device())) == MUST(peers[0].device_name()));
  CHECK(std::string(MUST(s1.device())) == MUST(peers[1].device_name()));
  disconnect_both(c0, s0);
  disconnect_both(c1, s1);
}
