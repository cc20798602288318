// Peer: open, from_address, close, moved-from.
#include "test_util.hpp"

using namespace test;

TEST_CASE("Peer::open allocates a protection domain on the device", "[peer]") {
  fake::FakeProvider fake;
  {
    Peer peer = open_peer(fake, 1);
    CHECK(peer);
    CHECK(*peer.context() == fake.context(1));
    CHECK(*peer.device_name() == "fake1");
    CHECK((*peer.pd())->context == fake.context(1));
    CHECK(fake.alive("pd") == 1);
    CHECK(fake.calls() == std::vector<std::string>{"ibv_alloc_pd"});
  }
  CHECK(fake.calls() == std::vector<std::string>{"ibv_alloc_pd", "ibv_dealloc_pd"});
  fake.expect_clean();
}

TEST_CASE("Peer::open with a null context is inval and calls nothing", "[peer][inval]") {
  fake::FakeProvider fake;
  auto peer = Peer::open(nullptr);
  REQUIRE_FALSE(peer);
  check_inval(peer.error(), "Peer::open", "null");
  CHECK(fake.calls().empty());
}

TEST_CASE("Peer::open: each provider call fails in turn", "[peer][fail-each]") {
  for (int err : {kErr, ENOMEM}) {
    fail_each_call({"ibv_alloc_pd"}, err, [](fake::FakeProvider& fake, Probe& probe) {
      probe.begin();
      auto peer = Peer::open(fake.context(0));
      probe.end();
      probe.check_outcome(peer);
    });
  }
}

TEST_CASE("Peer::open: ibv_alloc_pd failing without errno is unknown", "[peer]") {
  fake::FakeProvider fake;
  fake.fail("ibv_alloc_pd", 0);
  auto peer = Peer::open(fake.context(0));
  REQUIRE_FALSE(peer);
  CHECK(peer.error().code() == errc::unknown);
  CHECK(peer.error().call() == "ibv_alloc_pd");
  fake.expect_clean();
}

TEST_CASE("Peer::from_address finds the device owning or reaching an address", "[peer]") {
  fake::FakeProvider fake;
  {
    auto local = Peer::from_address("169.254.78.1", AddressKind::local);
    REQUIRE(local);
    CHECK(*local->device_name() == "fake1");
    auto remote = Peer::from_address("169.254.77.200", AddressKind::remote);
    REQUIRE(remote);
    CHECK(*remote->device_name() == "fake0");
    CHECK(fake.alive("cm_id") == 0);
    CHECK(fake.alive("addrinfo") == 0);
  }
  fake.expect_clean();
}

TEST_CASE("Peer::from_address failures", "[peer]") {
  fake::FakeProvider fake;
  SECTION("an address no device owns") {
    auto p = Peer::from_address("169.254.77.9", AddressKind::local);
    REQUIRE_FALSE(p);
    CHECK(p.error().code() == errc::provider);
    CHECK(p.error().call() == "rdma_bind_addr");
  }
  SECTION("a wildcard is on no device") {
    auto p = Peer::from_address("0.0.0.0", AddressKind::local);
    REQUIRE_FALSE(p);
    check_inval(p.error(), "Peer::from_address", "no RDMA device");
  }
  SECTION("an unreachable address") {
    auto p = Peer::from_address("10.9.9.9", AddressKind::remote);
    REQUIRE_FALSE(p);
    CHECK(p.error().code() == errc::provider);
    CHECK(p.error().sys_errno() == EHOSTUNREACH);
    CHECK(p.error().call() == "rdma_resolve_addr");
  }
  fake.expect_clean();
}

TEST_CASE("Peer::from_address rejects malformed addresses before any call", "[peer][inval]") {
  fake::FakeProvider fake;
  for (const char* addr : {"", "abc", "1.2.3.4.5", "300.1.1.1", " 169.254.77.1", "fake0"}) {
    for (auto kind : {AddressKind::local, AddressKind::remote}) {
      INFO("address \"" << addr << "\"");
      auto p = Peer::from_address(addr, kind);
      REQUIRE_FALSE(p);
      check_inval(p.error(), "Peer::from_address", "numeric");
    }
  }
  CHECK(fake.calls().empty());
}

TEST_CASE("Peer::from_address: each provider call fails in turn", "[peer][fail-each]") {
  for (auto kind : {AddressKind::local, AddressKind::remote}) {
    const bool local = kind == AddressKind::local;
    std::vector<std::string> calls = {"rdma_create_id", "rdma_getaddrinfo",
                                      local ? "rdma_bind_addr" : "rdma_resolve_addr",
                                      "ibv_alloc_pd", "rdma_freeaddrinfo", "rdma_destroy_id"};
    fail_each_call(calls, kErr, [&](fake::FakeProvider&, Probe& probe) {
      probe.begin();
      auto peer = Peer::from_address(local ? "169.254.77.1" : "169.254.77.5", kind);
      probe.end();
      // A failing rdma_destroy_id of the lookup id is a cleanup failure: ignored.
      if (!probe.failing() || probe.injected()->call == "rdma_destroy_id") { CHECK(peer); return; }
      REQUIRE_FALSE(peer);
      probe.check(peer.error());
    });
  }
}

TEST_CASE("Peer::close deallocates now, or when its last user goes", "[peer]") {
  fake::FakeProvider fake;
  SECTION("alone") {
    Peer peer = open_peer(fake);
    CHECK(std::move(peer).close());
    CHECK_FALSE(peer);
    CHECK(fake.alive("pd") == 0);
  }
  SECTION("an endpoint still uses it") {
    Peer peer = open_peer(fake);
    Endpoint ep = listen_on(peer, "169.254.77.1");
    CHECK(std::move(peer).close());
    CHECK_FALSE(peer);
    CHECK(fake.alive("pd") == 1);
    CHECK(std::move(ep).shutdown());
    CHECK(fake.alive("pd") == 0);
  }
  SECTION("ibv_dealloc_pd fails: reported, the Peer is empty anyway") {
    Peer peer = open_peer(fake);
    fake.fail("ibv_dealloc_pd", EBUSY);
    auto closed = std::move(peer).close();
    REQUIRE_FALSE(closed);
    CHECK(closed.error().code() == errc::provider);
    CHECK(closed.error().call() == "ibv_dealloc_pd");
    CHECK_FALSE(peer);
  }
  fake.expect_clean();
}

// BUG (peer.hpp, Peer::close): ibv_dealloc_pd returns the errno value (it does not set
// errno), but close() reports `errno`, so sys_errno() is 0 instead of EBUSY.
TEST_CASE("Peer::close reports ibv_dealloc_pd's returned errno", "[peer]") {
  fake::FakeProvider fake;
  Peer peer = open_peer(fake);
  fake.fail("ibv_dealloc_pd", EBUSY);
  errno = 0;
  auto closed = std::move(peer).close();
  REQUIRE_FALSE(closed);
  check_injected(closed.error(), "ibv_dealloc_pd", EBUSY);
  fake.expect_clean();
}

TEST_CASE("Peer::close: each provider call fails in turn", "[peer][fail-each]") {
  fail_each_call({"ibv_dealloc_pd"}, kErr, [](fake::FakeProvider& fake, Probe& probe) {
    Peer peer = open_peer(fake);
    probe.begin();
    auto closed = std::move(peer).close();
    probe.end();
    CHECK_FALSE(peer);
    probe.check_outcome(closed);
  });
}

TEST_CASE("a moved-from Peer: every call is inval", "[peer][moved]") {
  fake::FakeProvider fake;
  Peer peer = open_peer(fake);
  Peer other = std::move(peer);
  CHECK_FALSE(peer);
  const auto mark = fake.mark();
  check_inval(peer.context().error(), "Peer::context");
  check_inval(peer.pd().error(), "Peer::pd");
  check_inval(peer.device_name().error(), "Peer::device_name");
  check_inval(std::move(peer).close().error(), "Peer::close");
  auto ep = Endpoint::listen(peer, "", "7471");
  REQUIRE_FALSE(ep);
  CHECK(ep.error().code() == errc::inval);
  auto shared = Endpoint::listen_shared(peer, "", "7471");
  REQUIRE_FALSE(shared);
  CHECK(shared.error().code() == errc::inval);
  auto req = ConnReq::to(peer, "169.254.77.9", "7471");
  REQUIRE_FALSE(req);
  CHECK(req.error().code() == errc::inval);
  auto pending = ConnReq::start(peer, "169.254.77.9", "7471");
  REQUIRE_FALSE(pending);
  CHECK(pending.error().code() == errc::inval);
  CHECK(fake.calls_since(mark).empty());
  CHECK(std::move(other).close());
  fake.expect_clean();
}
