// Numeric addresses: IPv6 scope ids, the "" wildcard, and the text the library reports.
// The fake's devices have IPv6 link-local addresses fe80::77:1 (fake0) and fe80::78:1
// (fake1) on the netdev `lo`, the one interface every host has.
#include "test_util.hpp"

#include <rpmapp/detail/address.hpp>

#include <net/if.h>
#include <netdb.h>

#include <cstring>
#include <random>
#include <string>

namespace address_test {

using namespace test;

namespace {

const std::string lo_index = std::to_string(if_nametoindex("lo"));

sockaddr_in6 in6(const char* text, std::uint32_t scope) {
  sockaddr_in6 sa{};
  sa.sin6_family = AF_INET6;
  REQUIRE(inet_pton(AF_INET6, text, &sa.sin6_addr) == 1);
  sa.sin6_scope_id = scope;
  return sa;
}

std::string text_of(const sockaddr_in6& sa) {
  return detail::address_of(reinterpret_cast<const sockaddr*>(&sa));
}

// An interface index no interface has (the kernel hands them out from 1 upwards).
constexpr std::uint32_t unused_index = 3999999999u;

}  // namespace

TEST_CASE("issue 8.8: a scoped link-local address is accepted everywhere and passed through",
          "[address][ipv6]") {
  REQUIRE(lo_index != "0");
  fake::FakeProvider fake;
  {
    for (const std::string& scoped :
         std::vector<std::string>{"fe80::77:1%lo", "fe80::77:1%" + lo_index, "FE80::0077:1%lo"}) {
      INFO("address \"" << scoped << "\"");
      auto local = Peer::from_address(scoped, AddressKind::local);
      INFO((local ? std::string() : local.error().message()));
      REQUIRE(local);
      CHECK(*local->device_name() == "fake0");
      auto remote = Peer::from_address(scoped, AddressKind::remote);
      REQUIRE(remote);
      CHECK(*remote->device_name() == "fake0");

      auto ep = Endpoint::listen(*local, scoped, "7471");
      INFO((ep ? std::string() : ep.error().message()));
      REQUIRE(ep);
      CHECK(*ep->device() == "fake0");
      CHECK(*ep->local_address() == "fe80::77:1%lo");  // the scope read back as a name

      auto shared = Endpoint::listen_shared(*local, scoped, "7472");
      INFO((shared ? std::string() : shared.error().message()));
      REQUIRE(shared);
      CHECK(*shared->local_address() == "fe80::77:1%lo");

      auto out = ConnReq::to(*local, scoped, "7471");
      INFO((out ? std::string() : out.error().message()));
      REQUIRE(out);
      CHECK(*out->peer_address() == "fe80::77:1%lo");
      auto pending = ConnReq::start(*local, scoped, "7471");
      REQUIRE(pending);
      CHECK(std::move(*pending).wait());
    }
  }
  fake.expect_clean();
}

TEST_CASE("issue 8.8: a link-local address on the other device reaches it, scoped",
          "[address][ipv6]") {
  fake::FakeProvider fake;
  {
    Peer peer1 = open_peer(fake, 1);
    Endpoint ep = listen_on(peer1, "fe80::78:1%lo", "7471");
    CHECK(*ep.device() == "fake1");
    ConnReq out = outgoing(peer1, "fe80::78:1%lo");
    CHECK(*out.peer_address() == "fe80::78:1%lo");
    // the address this side reports round-trips into ConnReq::to
    ConnReq again = outgoing(peer1, *out.peer_address());
    CHECK(*again.peer_address() == "fe80::78:1%lo");
    ConnReq from_local = outgoing(peer1, *ep.local_address());
    CHECK(*from_local.peer_address() == "fe80::78:1%lo");
  }
  fake.expect_clean();
}

TEST_CASE("issue 8.8: \"\" binds the IPv6 wildcard (dual-stack); 0.0.0.0 stays IPv4",
          "[address][ipv6]") {
  fake::FakeProvider fake;
  {
    Peer peer = open_peer(fake);
    Endpoint all = listen_on(peer, "", "7471");
    CHECK(*all.local_address() == "::");
    CHECK(*all.device() == "");
    Endpoint v4 = listen_on(peer, "0.0.0.0", "7472");
    CHECK(*v4.local_address() == "0.0.0.0");
    Endpoint v6 = listen_on(peer, "::0", "7473");
    CHECK(*v6.local_address() == "::");
    CHECK(*v6.device() == "");
    // the IPv6 wildcard serves both families' requests (no afonly in the fake either)
    fake::Request v4_request;
    ConnReq from_v4 = take_request(fake, all, v4_request);
    CHECK(*from_v4.peer_address() == "169.254.77.2");
    fake::Request v6_request;
    v6_request.peer = "fe80::77:2";
    ConnReq from_v6 = take_request(fake, all, v6_request);
    CHECK(str(*from_v6.peer_address()).starts_with("fe80::77:2"));
  }
  fake.expect_clean();
}

TEST_CASE("issue 8.8: \"\" falls back to 0.0.0.0 when the IPv6 wildcard is refused",
          "[address][ipv6]") {
  {
    fake::FakeProvider fake;
    Peer peer = open_peer(fake);
    fake.fail("rdma_bind_addr", EAFNOSUPPORT);
    const auto mark = fake.mark();
    Endpoint ep = listen_on(peer, "", "7471");
    CHECK(*ep.local_address() == "0.0.0.0");
    CHECK(fake.calls_since(mark) ==
          std::vector<std::string>{"rdma_create_event_channel", "fcntl",
                                   "rdma_create_id", "rdma_bind_addr", "rdma_bind_addr",
                                   "rdma_listen"});
    CHECK(std::move(ep).shutdown());
    CHECK(std::move(peer).close());
    fake.expect_clean();
  }
  {
    fake::FakeProvider other;
    Peer peer = open_peer(other);
    // only EAFNOSUPPORT falls back: another failure of the IPv6 bind is reported
    other.fail("rdma_bind_addr", EADDRINUSE);
    auto ep = Endpoint::listen(peer, "", "7471");
    REQUIRE_FALSE(ep);
    check_injected(ep.error(), "rdma_bind_addr", EADDRINUSE);
    // and an IPv6-only text does not fall back
    other.fail("rdma_bind_addr", EAFNOSUPPORT);
    auto v6 = Endpoint::listen(peer, "::", "7471");
    REQUIRE_FALSE(v6);
    check_injected(v6.error(), "rdma_bind_addr", EAFNOSUPPORT);
    CHECK(std::move(peer).close());
    other.expect_clean();
  }
}

TEST_CASE("issue 8.8: address_of keeps the scope id; canonical_address keeps the scope",
          "[address][ipv6]") {
  CHECK(text_of(in6("fe80::77:1", if_nametoindex("lo"))) == "fe80::77:1%lo");
  CHECK(text_of(in6("fe80::77:1", unused_index)) == "fe80::77:1%" + std::to_string(unused_index));
  CHECK(text_of(in6("fe80::77:1", 0)) == "fe80::77:1");
  CHECK(text_of(in6("::", 0)) == "::");
  CHECK(text_of(in6("2001:db8::5", 0)) == "2001:db8::5");

  CHECK(detail::canonical_address("::0") == "::");
  CHECK(detail::canonical_address("0:0::0") == "::");
  CHECK(detail::canonical_address("169.254.77.1") == "169.254.77.1");
  CHECK(detail::canonical_address("FE80::0077:1%lo") == "fe80::77:1%lo");
  CHECK(detail::canonical_address("fe80::77:1%" + lo_index) == "fe80::77:1%lo");
  CHECK(detail::canonical_address("fe80::77:1") == "fe80::77:1");
  CHECK(detail::canonical_address("abc") == "");
  CHECK(detail::canonical_address("169.254.77.1%lo") == "");
  CHECK(detail::canonical_address("fe80::1%") == "");

  CHECK(detail::is_wildcard(""));
  CHECK(detail::is_wildcard("0.0.0.0"));
  CHECK(detail::is_wildcard("::"));
  CHECK(detail::is_wildcard("::0"));
  CHECK(detail::is_wildcard("0::0:0"));
  CHECK_FALSE(detail::is_wildcard("::1"));
  CHECK_FALSE(detail::is_wildcard("::%lo"));
  CHECK_FALSE(detail::is_wildcard("169.254.77.1"));
}

TEST_CASE("issue 8.8: bad scopes and unscoped link-local addresses are inval before any call",
          "[address][ipv6][inval]") {
  fake::FakeProvider fake;
  {
    Peer peer = open_peer(fake);
    struct Bad {
      std::string addr;
      const char* words;
    };
    const std::vector<Bad> bad = {
        {"fe80::77:1", "needs a scope"},
        {"fe80::77:1%nosuchif0", "no network interface \"nosuchif0\""},
        {"fe80::77:1%" + std::to_string(unused_index), "no network interface"},
        {"fe80::77:1%0", "no network interface \"0\""},
        {"fe80::77:1%99999999999", "no network interface"},
        {"fe80::77:1%", "no network interface \"\""},
        {"fe80::77:1%lo%lo", "no network interface"},
        {"169.254.77.1%lo", "IPv6 link-local addresses only"},
        {"2001:db8::1%lo", "IPv6 link-local addresses only"},
        {"::%lo", "IPv6 link-local addresses only"},
        {"%lo", "not a numeric"},
    };
    const auto mark = fake.mark();
    for (const auto& [addr, words] : bad) {
      INFO("address \"" << addr << "\"");
      auto ep = Endpoint::listen(peer, addr, "7471");
      REQUIRE_FALSE(ep);
      check_inval(ep.error(), "Endpoint::listen", words);
      auto shared = Endpoint::listen_shared(peer, addr, "7471");
      REQUIRE_FALSE(shared);
      check_inval(shared.error(), "Endpoint::listen_shared", words);
      auto to = ConnReq::to(peer, addr, "7471");
      REQUIRE_FALSE(to);
      check_inval(to.error(), "ConnReq::to", words);
      auto start = ConnReq::start(peer, addr, "7471");
      REQUIRE_FALSE(start);
      check_inval(start.error(), "ConnReq::start", words);
      for (auto kind : {AddressKind::local, AddressKind::remote}) {
        auto from = Peer::from_address(addr, kind);
        REQUIRE_FALSE(from);
        check_inval(from.error(), "Peer::from_address", words);
      }
    }
    CHECK(fake.calls_since(mark).empty());
  }
  fake.expect_clean();
}

TEST_CASE("issue 8.8: an accepted link-local peer gets a scope rdma_cm does not report",
          "[address][ipv6]") {
  // rdma_cm fills an accepted request's addresses without scope ids (cma_save_ip6_info)
  rdma_cm_id id{};
  auto* local = reinterpret_cast<sockaddr_in6*>(&id.route.addr.src_storage);
  auto* peer = reinterpret_cast<sockaddr_in6*>(&id.route.addr.dst_storage);
  *local = in6("fe80::77:1", if_nametoindex("lo"));
  *peer = in6("fe80::77:2", 0);
  CHECK(detail::peer_address_of(&id) == "fe80::77:2%lo");  // the local address's scope
  *peer = in6("fe80::77:2", unused_index);  // a scope of its own is kept
  CHECK(detail::peer_address_of(&id) == "fe80::77:2%" + std::to_string(unused_index));
  *peer = in6("2001:db8::2", 0);  // only link-local peers get one
  CHECK(detail::peer_address_of(&id) == "2001:db8::2");
  // no scope, and no interface carries the local address: none
  *local = in6("fe80::db8:77:1", 0);
  *peer = in6("fe80::77:2", 0);
  CHECK(detail::peer_address_of(&id) == "fe80::77:2");
  auto* local4 = reinterpret_cast<sockaddr_in*>(&id.route.addr.src_storage);
  auto* peer4 = reinterpret_cast<sockaddr_in*>(&id.route.addr.dst_storage);
  *local4 = sockaddr_in{};
  *peer4 = sockaddr_in{};
  local4->sin_family = peer4->sin_family = AF_INET;
  REQUIRE(inet_pton(AF_INET, "169.254.77.2", &peer4->sin_addr) == 1);
  CHECK(detail::peer_address_of(&id) == "169.254.77.2");
}

TEST_CASE("parse_ipv4 accepts and refuses exactly what inet_pton(AF_INET) does") {
  const auto agree = [](const std::string& text) {
    in_addr ours{}, theirs{};
    std::memset(&ours, 0xa5, sizeof ours);
    const in_addr sentinel = ours;
    const bool parsed = detail::parse_ipv4(text, &ours);
    const bool want = inet_pton(AF_INET, text.c_str(), &theirs) == 1;
    INFO("\"" << text << "\"");
    REQUIRE(parsed == want);
    if (parsed) REQUIRE(ours.s_addr == theirs.s_addr);
    else REQUIRE(ours.s_addr == sentinel.s_addr);  // untouched on failure
  };
  for (const char* text : {"0.0.0.0", "255.255.255.255", "169.254.77.1", "1.2.3.4", "01.2.3.4",
                           "1.2.3.04", "1.2.3.256", "1.2.3", "1.2.3.4.", ".1.2.3.4", "1..2.3",
                           "1.2.3.4.5", "1234.1.1.1", "1.2.3.0000", " 1.2.3.4", "1.2.3.4 ",
                           "1.2.3.-4", "1.2.3.+4", "0x1.2.3.4", "", ".", "...", "1.2.3.4%lo",
                           "::1", "999.1.1.1", "255.255.255.2555", "00.0.0.0", "0.0.0.00"})
    agree(text);
  std::mt19937 random(12345);  // fixed: the same strings every run
  const std::string alphabet = "0123456789..x-";
  for (int i = 0; i < 200000; ++i) {
    std::string text(random() % 18, ' ');
    for (char& c : text) c = alphabet[random() % alphabet.size()];
    agree(text);
  }
}

TEST_CASE("the socket address rpmapp builds is the one getaddrinfo(AI_NUMERICHOST) builds",
          "[address]") {
  // rdma_getaddrinfo passes getaddrinfo's address through; rpmapp builds it itself
  const auto agree = [](const std::string& text, std::uint16_t port) {
    INFO("\"" << text << "\" port " << port);
    detail::SocketAddress ours;
    std::memset(static_cast<void*>(&ours), 0xa5, sizeof ours);
    REQUIRE(detail::check_numeric_address("test", text, &ours));
    ours.set_port(port);
    addrinfo hints{};
    hints.ai_flags = AI_NUMERICHOST | AI_NUMERICSERV | AI_PASSIVE;
    hints.ai_socktype = SOCK_STREAM;
    addrinfo* theirs = nullptr;
    const std::string service = std::to_string(port);
    REQUIRE(getaddrinfo(text.c_str(), service.c_str(), &hints, &theirs) == 0);
    REQUIRE(theirs->ai_next == nullptr);
    const std::size_t size =
        ours.any.sa_family == AF_INET ? sizeof(sockaddr_in) : sizeof(sockaddr_in6);
    REQUIRE(theirs->ai_addrlen == size);
    CHECK(std::memcmp(ours.get(), theirs->ai_addr, size) == 0);  // padding zeroed as theirs
    freeaddrinfo(theirs);
  };
  for (const char* text : {"169.254.77.1", "0.0.0.0", "255.255.255.255", "127.0.0.1", "::",
                           "::1", "2001:db8::17", "::ffff:169.254.77.1", "FE80::0001%lo",
                           "fe80::78:1%lo"})
    for (std::uint16_t port : {0, 1, 7471, 65535}) agree(text, port);
  agree("fe80::1%" + lo_index, 7471);

  detail::SocketAddress untouched;
  std::memset(static_cast<void*>(&untouched), 0x5a, sizeof untouched);
  const detail::SocketAddress before = untouched;
  for (const char* bad : {"", "localhost", "1.2.3.4%lo", "fe80::1", "fe80::1%nosuchif0", "2001:db8::1%lo"}) {
    INFO(bad);
    CHECK_FALSE(detail::check_numeric_address("test", bad, &untouched));
    CHECK(std::memcmp(&untouched, &before, sizeof before) == 0);
  }
  CHECK(detail::SocketAddress::ipv4_any(7471).v4.sin_port == htons(7471));
}

}  // namespace address_test
