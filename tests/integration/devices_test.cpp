// Listeners and two RDMA devices (tools/rpmapp-vm: rxe0 at $SOFTROCE_IP, rxe1 at
// $SOFTROCE_IP2): a listener bound to one device's address never sees the other's
// requests; a wildcard listener with one Peer per device serves each request with the
// Peer of its device; a request on a device without a Peer is rejected and reported.
// Needs $SOFTROCE_IP and $SOFTROCE_IP2; fails, never skips, without them.
#include "support.hpp"

#include <chrono>
#include <cstdlib>
#include <map>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace {

using namespace std::chrono_literals;
using namespace itest;
using rpmapp::AddressKind;
using rpmapp::Conn;
using rpmapp::ConnEvent;
using rpmapp::ConnReq;
using rpmapp::Endpoint;
using rpmapp::errc;
using rpmapp::Peer;

constexpr const char* two_devices_hint =
    "run this test where two RDMA devices have addresses "
    "(tools/rpmapp-vm sets SOFTROCE_IP and SOFTROCE_IP2)";

// The two devices, each with a Peer, and their addresses.
struct Devices {
  std::string ip0 = env_or_fail("SOFTROCE_IP", two_devices_hint);
  std::string ip1 = env_or_fail("SOFTROCE_IP2", two_devices_hint);
  Peer peer0 = MUST(Peer::from_address(ip0, AddressKind::local));
  Peer peer1 = MUST(Peer::from_address(ip1, AddressKind::local));
  std::string dev0 = MUST(peer0.device_name());
  std::string dev1 = MUST(peer1.device_name());
};

// A client on `peer` to ip:port; ConnReq::to may fail (the caller decides what that means).
rpmapp::expected<Conn> try_client(const Peer& peer, const std::string& ip, const std::string& port,
                                  std::string_view pdata) {
  auto req = ConnReq::to(peer, ip, port);
  if (!req) return rpmapp::unexpected(req.error());
  return std::move(*req).connect(rpmapp::as_bytes(pdata));
}

}  // namespace

TEST_CASE("the two devices are distinct and Peers find them by address", "[devices]") {
  Devices d;
  CHECK(d.dev0 != d.dev1);
  if (const char* dev = std::getenv("SOFTROCE_DEV")) CHECK(d.dev0 == dev);
  if (const char* dev = std::getenv("SOFTROCE_DEV2")) CHECK(d.dev1 == dev);
  Peer remote1 = MUST(Peer::from_address(d.ip1, AddressKind::remote));
  CHECK(MUST(remote1.device_name()) == d.dev1);
}

TEST_CASE("listening on one device's address with the other device's Peer is inval naming both",
          "[devices][listen]") {
  Devices d;
  auto error = MUST_FAIL(Endpoint::listen(d.peer0, d.ip1, "0"));
  const std::string message = error.message();
  INFO(message);
  CHECK(error.code() == errc::inval);
  CHECK(message.find(d.dev0) != std::string::npos);
  CHECK(message.find(d.dev1) != std::string::npos);

  // And a client Peer on the wrong device for the destination.
  auto wrong = MUST_FAIL(ConnReq::to(d.peer0, d.ip1, "7471"));
  INFO(wrong.message());
  CHECK(wrong.code() == errc::inval);
}

TEST_CASE("a listener bound to the first address never sees a request for the second",
          "[devices][listen]") {
  Devices d;
  Endpoint ep = MUST(Endpoint::listen(d.peer0, d.ip0, "0"));
  CHECK(MUST(ep.device()) == d.dev0);
  const std::string port = port_text(ep);

  {
    auto other = try_client(d.peer1, d.ip1, port, "wrong address");
    if (other) {
      const ConnEvent event = wait_event(*other, "client on the second address");
      CAPTURE(event);
      CHECK((event == ConnEvent::rejected || event == ConnEvent::unreachable));
    } else {
      INFO("ConnReq::to the second address failed (acceptable): " << other.error().message());
      SUCCEED();
    }
    auto none = MUST_FAIL(ep.next_conn_req_for(2s));
    INFO(none.message());
    CHECK(none.code() == errc::no_event);
  }

  Conn client = MUST(try_client(d.peer0, d.ip0, port, "right address"));
  ConnReq req = MUST(ep.next_conn_req_for(event_wait));
  CHECK(rpmapp::as_text(MUST(req.private_data())) == "right address");
  CHECK(MUST(req.device()) == d.dev0);
  Conn server = MUST(std::move(req).connect());
  establish(client, server);
  disconnect_both(client, server);
}

TEST_CASE("a wildcard listener with one Peer per device serves clients on both devices",
          "[devices][wildcard]") {
  Devices d;
  // On iWARP "" refuses IPv4 clients (endpoint_test); the devices' transports may differ.
  const bool any_iwarp = MUST(d.peer0.iwarp()) || MUST(d.peer1.iwarp());
  const Peer peers[] = {std::move(d.peer0), std::move(d.peer1)};
  Endpoint ep = MUST(Endpoint::listen(std::span<const Peer>(peers), any_iwarp ? "0.0.0.0" : "", "0"));
  CHECK(MUST(ep.device()).empty());
  const std::string port = port_text(ep);

  // Separate client Peers (the server's were moved into `peers`).
  Peer c0 = MUST(Peer::from_address(d.ip0, AddressKind::local));
  Peer c1 = MUST(Peer::from_address(d.ip1, AddressKind::local));
  Conn client0 = MUST(try_client(c0, d.ip0, port, "to-dev0"));
  Conn client1 = MUST(try_client(c1, d.ip1, port, "to-dev1"));

  std::map<std::string, Conn> servers;  // by the client's tag
  for (int i = 0; i < 2; ++i) {
    ConnReq req = MUST(ep.next_conn_req_for(event_wait));
    const std::string tag(rpmapp::as_text(MUST(req.private_data())));
    const std::string device(MUST(req.device()));
    INFO("request " << tag << " arrived on " << device);
    if (tag == "to-dev0") {
      CHECK(device == d.dev0);
    } else {
      CHECK(tag == "to-dev1");
      CHECK(device == d.dev1);
    }
    Conn server = MUST(std::move(req).connect());
    CHECK(MUST(server.device()) == device);
    servers.emplace(tag, std::move(server));
  }
  REQUIRE(servers.size() == 2);
  CHECK(wait_event(client0, "client 0") == ConnEvent::established);
  CHECK(wait_event(client1, "client 1") == ConnEvent::established);
  for (auto& [tag, server] : servers) {
    INFO(tag);
    CHECK(wait_event(server, "server") == ConnEvent::established);
  }
  MUST(client0.disconnect());
  MUST(client1.disconnect());
  for (auto& [tag, server] : servers) {
    INFO(tag);
    CHECK(wait_event(server, "server") == ConnEvent::closed);
    MUST(server.disconnect());
  }
  CHECK(wait_event(client0, "client 0") == ConnEvent::closed);
  CHECK(wait_event(client1, "client 1") == ConnEvent::closed);
}

TEST_CASE("a wildcard listener rejects a request on a device it has no Peer for, naming it",
          "[devices][wildcard]") {
  Devices d;
  Endpoint ep = MUST(Endpoint::listen(d.peer0, "0.0.0.0", "0"));
  const std::string port = port_text(ep);

  Conn stranger = MUST(try_client(d.peer1, d.ip1, port, "no peer here"));
  auto error = MUST_FAIL(ep.next_conn_req_for(event_wait));
  const std::string message = error.message();
  INFO(message);
  CHECK(error.code() == errc::inval);
  CHECK(message.find(d.dev1) != std::string::npos);
  CHECK(wait_event(stranger, "client on the second device") == ConnEvent::rejected);

  // The listener still serves its own device.
  Conn client = MUST(try_client(d.peer0, d.ip0, port, "has peer"));
  ConnReq req = MUST(ep.next_conn_req_for(event_wait));
  CHECK(MUST(req.device()) == d.dev0);
  Conn server = MUST(std::move(req).connect());
  establish(client, server);
}

TEST_CASE("two Peers on one device are inval", "[devices][listen]") {
  Devices d;
  const Peer peers[] = {MUST(Peer::from_address(d.ip0, AddressKind::local)),
                        MUST(Peer::from_address(d.ip0, AddressKind::remote))};
  auto error = MUST_FAIL(Endpoint::listen(std::span<const Peer>(peers), "", "0"));
  INFO(error.message());
  CHECK(error.code() == errc::inval);
}
