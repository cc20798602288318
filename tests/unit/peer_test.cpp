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

TEST_CASE("Peer::capabilities: what each device reports (rxe's and siw's attributes), and "
          "sizes beyond its limits are inval naming the device before anything is created",
          "[peer][capabilities][iwarp]") {
  fake::FakeProvider fake;
  fake.set_caps(1, fake::DeviceCaps::siw());
  {
    Peer rxe = open_peer(fake, 0);
    Peer siw = open_peer(fake, 1);
    DeviceCapabilities want_rxe;
    want_rxe.atomics = true;
    want_rxe.immediate_data = true;
    want_rxe.memory_windows = true;
    want_rxe.max_queue_wr = 1 << 20;
    want_rxe.max_sge = 32;
    want_rxe.max_read_sge = 32;
    want_rxe.max_cqe = 32767;
    want_rxe.max_srq_wr = 1 << 20;
    want_rxe.max_outstanding_reads = 128;
    CHECK(*rxe.capabilities() == want_rxe);
    DeviceCapabilities want_siw;
    want_siw.iwarp = true;
    want_siw.max_queue_wr = 32768;
    want_siw.max_sge = 6;
    want_siw.max_read_sge = 1;
    want_siw.max_cqe = 3276800;
    want_siw.max_srq_wr = 327680;
    want_siw.max_outstanding_reads = 128;
    CHECK(*siw.capabilities() == want_siw);
    check_inval(Peer().capabilities().error(), "Peer::capabilities");

    // Each size one over the limit: inval naming it, its limit and the device; nothing is
    // left (no id, queue or channel); at the limit the request is made.
    struct Over {
      const char* words;
      ConnConfig config;
    };
    auto with = [](auto set) {
      ConnConfig c;
      set(c);
      return c;
    };
    const Over over_siw[] = {
        {"sq_size 32769 is more than the 32768 work requests per queue (max_qp_wr) that fake1 allows",
         with([](ConnConfig& c) { c.sq_size = 32769; })},
        {"rq_size 32769 is more than the 32768", with([](ConnConfig& c) { c.rq_size = 32769; })},
        {"max_sge 7 is more than the 6 scatter/gather entries per work request (max_sge) that fake1",
         with([](ConnConfig& c) { c.max_sge = 7; })},
    };
    for (const Over& o : over_siw) {
      INFO(o.words);
      auto refused = ConnReq::to(siw, "169.254.78.9", "7471", o.config);
      REQUIRE_FALSE(refused);
      check_inval(refused.error(), "ConnConfig", o.words);
      CHECK(fake.alive("id") == 0);
      CHECK(fake.alive("cq") == 0);
      CHECK(fake.alive("comp_channel") == 0);
    }
    ConnConfig at_limit;
    at_limit.sq_size = at_limit.rq_size = 32768;
    at_limit.max_sge = 6;
    CHECK(std::move(outgoing(siw, "169.254.78.9", at_limit)).close());

    // rxe's CQ limit, on an accepted request; rq_size does not count with a shared receive
    // queue, nor cq_size with a shared CQ.
    Endpoint ep = listen_on(rxe, "169.254.77.1");
    ConnConfig big_cq;
    big_cq.cq_size = 32768;
    fake.inject_connect_request(*ep.fd(), {});
    auto refused = ep.next_conn_req(big_cq);
    REQUIRE_FALSE(refused);
    check_inval(refused.error(), "ConnConfig", "cq_size 32768 is more than the 32767 entries per completion "
                                               "queue (max_cqe) that fake0 allows");
    ConnConfig big_rcq;
    big_rcq.rcq_size = 32768;
    fake.inject_connect_request(*ep.fd(), {});
    check_inval(ep.next_conn_req(big_rcq).error(), "ConnConfig", "rcq_size 32768");
    CHECK(fake.alive("cq") == 0);
    auto srq = Srq::create(siw, SrqConfig{10, 0});
    REQUIRE(srq);
    auto shared = SharedCq::create(siw);
    REQUIRE(shared);
    ConnConfig shared_queues = with([](ConnConfig& c) { c.rq_size = c.cq_size = 0x7fffffffu; });
    shared_queues.srq = &*srq;
    shared_queues.shared_cq = &*shared;
    CHECK(std::move(outgoing(siw, "169.254.78.9", shared_queues)).close());

    // A shared receive queue's and a shared CQ's sizes.
    check_inval(Srq::create(siw, SrqConfig{327681, 0}).error(), "Srq::create",
                "rq_size 327681 is more than the 327680 work requests per shared receive queue (max_srq_wr) "
                "that fake1 allows");
    check_inval(Srq::create(rxe, SrqConfig{10, 32768}).error(), "Srq::create",
                "rcq_size 32768 is more than the 32767 entries per completion queue (max_cqe) that fake0");
    check_inval(SharedCq::create(rxe, SharedCqConfig{32768, true, 0}).error(), "SharedCq::create",
                "size 32768 is more than the 32767 entries per completion queue (max_cqe) that fake0");
    CHECK(SharedCq::create(rxe, SharedCqConfig{32767, true, 0}));
    CHECK(Srq::create(siw, SrqConfig{327680, 0}));
  }
  fake.expect_clean();
}

}  // namespace peer_test
