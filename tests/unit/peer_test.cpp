// Peer: open, from_address, close, moved-from.
#include "test_util.hpp"

namespace peer_test {

using namespace test;

TEST_CASE("Peer::open allocates a protection domain on the device, probes it and registers "
          "the flush buffer; close deregisters it", "[peer]") {
  fake::FakeProvider fake;
  {
    Peer peer = open_peer(fake, 1);
    CHECK(peer);
    CHECK(*peer.context() == fake.context(1));
    CHECK(*peer.device_name() == "fake1");
    CHECK((*peer.pd())->context == fake.context(1));
    CHECK(fake.alive("pd") == 1);
    CHECK(fake.alive("mr") == 1);  // the flush buffer: 8 bytes, a READ destination
    const auto regs = fake.registrations();
    REQUIRE(regs.size() == 1);
    CHECK(regs[0].pd == *peer.pd());
    CHECK(regs[0].length == detail::PeerState::flush_read_size);
    CHECK(regs[0].access == IBV_ACCESS_LOCAL_WRITE);
    CHECK(*peer.odp_capable() == false);
    CHECK(*peer.native_atomic_write() == false);
    CHECK(fake.calls() == std::vector<std::string>{"rdma_get_devices", "rdma_free_devices",
                                                   "ibv_query_device_ex", "ibv_alloc_pd",
                                                   "ibv_reg_mr"});
  }
  CHECK(fake.calls() == std::vector<std::string>{"rdma_get_devices", "rdma_free_devices",
                                                 "ibv_query_device_ex", "ibv_alloc_pd",
                                                 "ibv_reg_mr", "ibv_dereg_mr", "ibv_dealloc_pd"});
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
    fail_each_call({"rdma_get_devices", "rdma_free_devices", "ibv_query_device_ex", "ibv_alloc_pd",
                    "ibv_reg_mr"},
                   err,
                   [](fake::FakeProvider& fake, Probe& probe) {
      probe.begin();
      auto peer = Peer::open(fake.context(0));
      probe.end();
      probe.check_outcome(peer);
    });
  }
}

TEST_CASE("Peer::open: a provider call failing without errno is unknown", "[peer]") {
  for (const char* call : {"rdma_get_devices", "ibv_alloc_pd"}) {
    INFO(call);
    fake::FakeProvider fake;
    fake.fail(call, 0);
    auto peer = Peer::open(fake.context(0));
    REQUIRE_FALSE(peer);
    CHECK(peer.error().code() == errc::unknown);
    CHECK(peer.error().call() == call);
    fake.expect_clean();
  }
}

TEST_CASE("issue 8.1: Peer::open refuses a context librdmacm does not own, naming the device",
          "[peer][inval][issue8]") {
  fake::FakeProvider fake;
  ibv_context* foreign = fake.foreign_context(1);
  REQUIRE(foreign != fake.context(1));
  REQUIRE(foreign->device == fake.context(1)->device);  // the same device
  auto peer = Peer::open(foreign);
  REQUIRE_FALSE(peer);
  check_inval(peer.error(), "Peer::open", "device fake1 is not librdmacm's");
  CHECK_THAT(peer.error().message(), Catch::Contains("rdma_get_devices()") &&
                                         Catch::Contains("Peer::from_address"));
  CHECK(fake.calls() == std::vector<std::string>{"rdma_get_devices", "rdma_free_devices"});
  CHECK(fake.alive("pd") == 0);
  // librdmacm's own context of the same device is accepted.
  CHECK(Peer::open(fake.context(1)));
  fake.expect_clean();
}

// After librdmacm has reopened a device (fake.swap_contexts), a Peer opened before holds a
// context of the same name that the cm_ids no longer carry: names match, pointers do not.
TEST_CASE("issue 8.1: listen compares the bound id's context with the Peer's by pointer",
          "[peer][endpoint][inval][issue8]") {
  fake::FakeProvider fake;
  {
    Peer peer = open_peer(fake, 0);
    fake.swap_contexts(0);
    auto ep = Endpoint::listen(peer, "169.254.77.1", "7471");
    REQUIRE_FALSE(ep);
    check_inval(ep.error(), "Endpoint::listen", "belongs to device fake0 (librdmacm's context)");
    CHECK_THAT(ep.error().message(), Catch::Contains("another context of fake0"));
    auto shared = Endpoint::listen_shared(peer, "169.254.77.1", "7471");
    REQUIRE_FALSE(shared);
    check_inval(shared.error(), "Endpoint::listen_shared", "another context of fake0");
    CHECK(fake.alive("cm_id") == 0);
    CHECK(fake.alive("qp") == 0);
  }
  fake.expect_clean();
}

TEST_CASE("issue 8.1: a wildcard listener compares the request's context with the Peer's by "
          "pointer",
          "[peer][endpoint][inval][issue8]") {
  fake::FakeProvider fake;
  {
    Peer peer = open_peer(fake, 0);
    Endpoint ep = listen_on(peer, "");
    fake.swap_contexts(0);
    fake.inject_connect_request(*ep.fd(), {});
    const auto mark = fake.mark();
    auto req = ep.next_conn_req();
    REQUIRE_FALSE(req);
    check_inval(req.error(), "Endpoint::next_conn_req",
                "a request arrived on device fake0 (librdmacm's context)");
    CHECK_THAT(req.error().message(), Catch::Contains("another context of fake0"));
    for (const auto& call : fake.calls_since(mark)) CHECK(call != "rdma_create_qp");
    CHECK(fake.rejects.size() == 1);  // the request was refused, not left hanging
    CHECK(fake.alive("qp") == 0);
  }
  fake.expect_clean();
}

TEST_CASE("issue 8.1: ConnReq::to compares the resolved id's context with the Peer's by pointer",
          "[peer][conn_req][inval][issue8]") {
  fake::FakeProvider fake;
  {
    Peer peer = open_peer(fake, 0);
    fake.swap_contexts(0);
    const auto mark = fake.mark();
    auto req = ConnReq::to(peer, "169.254.77.9", "7471");
    REQUIRE_FALSE(req);
    check_inval(req.error(), "PendingConnReq::wait",
                "the address is reached through device fake0 (librdmacm's context)");
    CHECK_THAT(req.error().message(), Catch::Contains("another context of fake0"));
    for (const auto& call : fake.calls_since(mark)) CHECK(call != "rdma_create_qp");
    CHECK(fake.alive("cm_id") == 0);
  }
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
    std::vector<std::string> calls = {"rdma_create_id", local ? "rdma_bind_addr" : "rdma_resolve_addr",
                                      "rdma_get_devices", "rdma_free_devices",
                                      "ibv_query_device_ex", "ibv_alloc_pd", "ibv_reg_mr",
                                      "rdma_destroy_id"};
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
  fail_each_call({"ibv_dereg_mr", "ibv_dealloc_pd"}, kErr, [](fake::FakeProvider& fake, Probe& probe) {
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

}  // namespace peer_test
