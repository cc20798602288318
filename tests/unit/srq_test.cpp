// Srq: creation and its failures, receives (bounds, usage, queue full), close, reading its CQ
// with provider calls failing, and the lifetime rules: connections keep the queue alive; a
// queue of another Peer is inval.
#include "data_util.hpp"

#include <cstring>

namespace srq_test {

using namespace test;

TEST_CASE("Srq::create: the queue and its receive CQ", "[srq]") {
  fake::FakeProvider fake;
  {
    Peer peer = open_peer(fake);
    const auto mark = fake.mark();
    auto srq = Srq::create(peer, SrqConfig{7, 9});
    REQUIRE(srq);
    CHECK(fake.calls_since(mark) == std::vector<std::string>{"ibv_create_srq", "ibv_create_comp_channel",
                                                             "ibv_create_cq", "ibv_req_notify_cq"});
    CHECK((*srq->native())->pd == *peer.pd());
    Cq rcq = *srq->rcq();
    REQUIRE(rcq);
    CHECK((*rcq.native())->cqe == 9);
    CHECK(fake.armed(*rcq.native()));
    CHECK_FALSE(*rcq.shared_channel());
    CHECK(fake.alive("srq") == 1);
    REQUIRE(std::move(*srq).close());
    CHECK(fake.alive("srq") == 0);
    CHECK(fake.alive("cq") == 0);
  }
  fake.expect_clean();
}

TEST_CASE("Srq::create with rcq_size 0: no receive CQ", "[srq]") {
  fake::FakeProvider fake;
  {
    Peer peer = open_peer(fake);
    const auto mark = fake.mark();
    auto srq = Srq::create(peer, SrqConfig{4, 0});
    REQUIRE(srq);
    CHECK(fake.calls_since(mark) == std::vector<std::string>{"ibv_create_srq"});
    Cq rcq = *srq->rcq();
    CHECK_FALSE(rcq);
    ibv_wc wc;
    check_inval(rcq.get({&wc, 1}).error(), "Cq::get");
    // A connection on it gets its receive completions on its own CQ.
    ConnConfig cfg;
    cfg.srq = &*srq;
    Conn conn = connected(fake, peer, cfg);
    CHECK_FALSE(*conn.rcq());
    Buffer buf(16);
    MrLocal mr = reg(peer, buf, MrUsage::recv);
    REQUIRE(srq->recv(mr, 0, 16, 5));
    REQUIRE(fake.deliver_recv(*conn.qp()));
    REQUIRE(conn.cq()->get({&wc, 1}));
    CHECK(wc.wr_id == 5);
    CHECK(wc.opcode == IBV_WC_RECV);
  }
  fake.expect_clean();
}

TEST_CASE("Srq::create: bad sizes and an empty Peer are inval, nothing called", "[srq][inval]") {
  fake::FakeProvider fake;
  {
    Peer peer = open_peer(fake);
    const auto mark = fake.mark();
    check_inval(Srq::create(peer, SrqConfig{0, 10}).error(), "Srq::create", "rq_size");
    check_inval(Srq::create(peer, SrqConfig{0x80000000u, 10}).error(), "Srq::create");
    check_inval(Srq::create(peer, SrqConfig{10, 0x80000000u}).error(), "Srq::create");
    Peer moved = std::move(peer);
    check_inval(Srq::create(peer).error(), "Srq::create");
    CHECK(fake.calls_since(mark).empty());
  }
  fake.expect_clean();
}

TEST_CASE("Srq::create and close: each provider call fails in turn", "[srq][fail-each]") {
  for (int err : {kErr, ENOMEM}) {
    fail_each_call({"ibv_create_srq", "ibv_create_comp_channel", "ibv_create_cq", "ibv_req_notify_cq"},
                   err, [](fake::FakeProvider& fake, Probe& probe) {
      Peer peer = open_peer(fake);
      probe.begin();
      auto srq = Srq::create(peer);
      probe.end();
      if (!probe.check_outcome(srq)) return;
      CHECK(fake.alive("srq") == 0);  // nothing leaked, the Peer still usable
      CHECK(fake.alive("cq") == 0);
      CHECK(fake.alive("comp_channel") == 0);
      CHECK(Srq::create(peer));
    });
  }
  fail_each_call({"ibv_destroy_cq", "ibv_destroy_comp_channel", "ibv_destroy_srq"}, kErr,
                 [](fake::FakeProvider& fake, Probe& probe) {
    Peer peer = open_peer(fake);
    auto srq = Srq::create(peer);
    REQUIRE(srq);
    probe.begin();
    auto closed = std::move(*srq).close();
    probe.end();
    CHECK_FALSE(*srq);
    probe.check_outcome(closed);
  });
}

TEST_CASE("Srq::recv: the work request, bounds, usage, Peer and a full queue", "[srq][recv]") {
  fake::FakeProvider fake;
  {
    Peer peer = open_peer(fake);
    Peer other = open_peer(fake, 1);
    auto srq = Srq::create(peer, SrqConfig{2, 4});
    REQUIRE(srq);
    Buffer buf(256);
    MrLocal mr = reg(peer, buf, MrUsage::recv);
    MrLocal send_only = reg(peer, buf, MrUsage::send);
    MrLocal foreign = reg(other, buf, MrUsage::recv);

    auto before = fake.posted().size();
    REQUIRE(srq->recv(mr, 16, 64, 0x51));
    auto now = posted_since(fake, before);
    REQUIRE(now.size() == 1);
    CHECK(now[0].queue == fake::PostedWr::Queue::srq);
    CHECK(now[0].srq == *srq->native());
    REQUIRE(now[0].sge.size() == 1);
    CHECK(now[0].sge[0].addr == addr_of(buf.data()) + 16);
    CHECK(now[0].sge[0].length == 64);
    CHECK(now[0].sge[0].lkey == (*mr.native())->lkey);
    CHECK(now[0].wr_id == 0x51);

    before = fake.posted().size();
    const auto mark = fake.mark();
    check_inval(srq->recv(mr, 200, 57).error(), "Srq::recv", "not within");
    check_inval(srq->recv(mr, SIZE_MAX, 2).error(), "Srq::recv");
    check_inval(srq->recv(send_only, 0, 8).error(), "Srq::recv", "recv");
    check_inval(srq->recv(foreign, 0, 8).error(), "Srq::recv", "another Peer");
    CHECK(fake.calls_since(mark).empty());
    CHECK(posted_since(fake, before).empty());

    REQUIRE(srq->recv(mr, 0, 0));  // a receive without payload (immediate data only)
    auto full = srq->recv(mr, 0, 8);
    REQUIRE_FALSE(full);
    CHECK(full.error().code() == errc::provider);
    CHECK(full.error().sys_errno() == ENOMEM);
    CHECK(full.error().call() == "ibv_post_srq_recv");
    CHECK_THAT(full.error().message(), Catch::Contains("queue is full"));
    CHECK(fake.outstanding_srq_recvs(*srq->native()) == 2);

    fake.fail("ibv_post_srq_recv", kErr);
    auto failed = srq->recv(mr, 0, 8);
    REQUIRE_FALSE(failed);
    check_injected(failed.error(), "ibv_post_srq_recv", kErr);
    fake.fail("ibv_post_srq_recv", -ENOMEM);  // siw's provider: the errno negated
    auto negated = srq->recv(mr, 0, 8);
    REQUIRE_FALSE(negated);
    CHECK(negated.error().sys_errno() == ENOMEM);
    CHECK_THAT(negated.error().message(), Catch::Contains("queue is full"));
  }
  fake.expect_clean();
}

TEST_CASE("Srq::recv on an iWARP device (siw's provider): a receive of 0 bytes has one empty entry",
          "[srq][recv][iwarp]") {
  fake::FakeProvider fake;
  fake.set_caps(1, fake::DeviceCaps::siw());
  {
    Peer peer = open_peer(fake, 1);
    auto srq = Srq::create(peer, SrqConfig{2, 4});
    REQUIRE(srq);
    Buffer buf(256);
    MrLocal mr = reg(peer, buf, MrUsage::recv);
    const auto before = fake.posted().size();
    REQUIRE(srq->recv(mr, 16, 0, 0x52));
    auto now = posted_since(fake, before);
    REQUIRE(now.size() == 1);
    REQUIRE(now[0].sge.size() == 1);
    CHECK(now[0].sge[0].addr == addr_of(buf.data()) + 16);
    CHECK(now[0].sge[0].length == 0);
    CHECK(now[0].sge[0].lkey == (*mr.native())->lkey);
    REQUIRE(srq->recv(mr, 0, 8));
    auto full = srq->recv(mr, 0, 8);  // siw: -ENOMEM
    REQUIRE_FALSE(full);
    CHECK(full.error().sys_errno() == ENOMEM);
    CHECK_THAT(full.error().message(), Catch::Contains("queue is full"));
  }
  fake.expect_clean();
}

TEST_CASE("a moved-from Srq: every call is inval", "[srq][moved]") {
  fake::FakeProvider fake;
  {
    Peer peer = open_peer(fake);
    auto srq = Srq::create(peer);
    REQUIRE(srq);
    Srq other = std::move(*srq);
    Buffer buf(16);
    MrLocal mr = reg(peer, buf, MrUsage::recv);
    const auto mark = fake.mark();
    check_inval(srq->recv(mr, 0, 8).error(), "Srq::recv");
    check_inval(srq->rcq().error(), "Srq::rcq");
    check_inval(srq->native().error(), "Srq::native");
    check_inval(std::move(*srq).close().error(), "Srq::close");
    ConnConfig cfg;
    cfg.srq = &*srq;
    auto req = ConnReq::to(peer, "169.254.77.9", "7471", cfg);
    REQUIRE_FALSE(req);
    check_inval(req.error(), "ConnReq::to", "empty Srq");
    CHECK(fake.calls_since(mark).empty());
  }
  fake.expect_clean();
}

TEST_CASE("connections keep the shared receive queue alive after the Srq is gone", "[srq]") {
  fake::FakeProvider fake;
  {
    Peer peer = open_peer(fake);
    std::optional<Conn> a, b;
    {
      auto srq = Srq::create(peer);
      REQUIRE(srq);
      ConnConfig cfg;
      cfg.srq = &*srq;
      a.emplace(connected(fake, peer, cfg));
      b.emplace(connected(fake, peer, cfg));
      CHECK(std::move(*srq).close());  // not destroyed: two connections use it
      CHECK(fake.alive("srq") == 1);
    }
    CHECK(fake.alive("srq") == 1);
    Cq rcq = *a->rcq();  // the queue's receive CQ, still there
    REQUIRE(rcq);
    CHECK(*b->rcq() == rcq);
    REQUIRE(std::move(*a).close());
    CHECK(fake.alive("srq") == 1);
    REQUIRE(std::move(*b).close());  // the last user: destroyed after its queue pair
    CHECK(fake.alive("srq") == 0);
    CHECK(std::move(peer).close());
  }
  fake.expect_clean();
}

TEST_CASE("ConnConfig::srq of another Peer is inval", "[srq][inval]") {
  fake::FakeProvider fake;
  {
    Peer peer = open_peer(fake, 0);
    Peer other = open_peer(fake, 0);  // the same device, another protection domain
    auto srq = Srq::create(other);
    REQUIRE(srq);
    ConnConfig cfg;
    cfg.srq = &*srq;
    auto mark = fake.mark();
    auto req = ConnReq::to(peer, "169.254.77.9", "7471", cfg);
    REQUIRE_FALSE(req);
    check_inval(req.error(), "ConnReq::to", "another Peer");
    CHECK(fake.calls_since(mark).empty());

    Endpoint ep = listen_on(peer, "169.254.77.1");
    fake.inject_connect_request(*ep.fd(), {});
    auto incoming = ep.next_conn_req(cfg);
    REQUIRE_FALSE(incoming);
    CHECK(incoming.error().code() == errc::inval);
    CHECK_THAT(incoming.error().message(), Catch::Contains("another Peer"));
    CHECK(fake.alive("qp") == 0);
  }
  fake.expect_clean();
}

TEST_CASE("a shared completion channel with a shared receive queue that has its own CQ is inval",
          "[srq][inval]") {
  fake::FakeProvider fake;
  {
    Peer peer = open_peer(fake);
    auto with_cq = Srq::create(peer, SrqConfig{4, 4});
    auto without_cq = Srq::create(peer, SrqConfig{4, 0});
    REQUIRE(with_cq);
    REQUIRE(without_cq);
    ConnConfig cfg;
    cfg.shared_completion_channel = true;
    cfg.rcq_size = 3;
    cfg.srq = &*with_cq;
    const auto mark = fake.mark();
    auto req = ConnReq::to(peer, "169.254.77.9", "7471", cfg);
    REQUIRE_FALSE(req);
    check_inval(req.error(), "ConnReq::to", "shared completion channel");
    CHECK(fake.calls_since(mark).empty());
    // Without a CQ of its own, the connection's receive CQ shares the channel.
    cfg.srq = &*without_cq;
    Conn conn = connected(fake, peer, cfg);
    Cq rcq = *conn.rcq();
    REQUIRE(rcq);
    CHECK(*rcq.shared_channel());
    CHECK(*rcq.fd() == *conn.completion_fd());
    Buffer buf(16);
    MrLocal mr = reg(peer, buf, MrUsage::recv);
    REQUIRE(without_cq->recv(mr, 0, 16, 8));
    REQUIRE(fake.deliver_recv(*conn.qp()));
    auto fired = conn.wait_completion_for(std::chrono::seconds(1));
    REQUIRE(fired);
    CHECK(*fired == rcq);
  }
  fake.expect_clean();
}

TEST_CASE("a shared receive queue's CQ: next_for with each provider call failing in turn", "[srq][fail-each]") {
  const std::vector<std::string> calls = {"ibv_poll_cq",       "poll",        "ibv_get_cq_event",
                                          "ibv_ack_cq_events", "ibv_req_notify_cq", "ibv_poll_cq"};
  fail_each_call(calls, kErr, [](fake::FakeProvider& fake, Probe& probe) {
    Peer peer = open_peer(fake);
    auto srq = Srq::create(peer, SrqConfig{4, 4});
    REQUIRE(srq);
    Cq rcq = *srq->rcq();
    ibv_wc arrives{};
    arrives.wr_id = 8;
    arrives.opcode = IBV_WC_RECV;
    fake.complete_after_empty_poll(*rcq.native(), arrives);
    ibv_wc out[2];
    std::memset(out, 0xAB, sizeof out);
    ibv_wc poisoned[2];
    std::memset(poisoned, 0xAB, sizeof poisoned);
    probe.begin();
    auto got = rcq.next_for(out, std::chrono::seconds(1));
    probe.end();
    if (!probe.failing()) {
      REQUIRE(got);
      REQUIRE(got->size() == 1);
      CHECK(out[0].wr_id == 8);
      return;
    }
    REQUIRE_FALSE(got);
    if (probe.injected()->call == "ibv_poll_cq") {  // no errno: what it returned
      CHECK(got.error().code() == errc::provider);
      CHECK(got.error().sys_errno() == 0);
      CHECK(got.error().call() == "ibv_poll_cq");
      CHECK_THAT(got.error().message(), Catch::Contains("returned -" + std::to_string(kErr)));
    } else {
      probe.check(got.error());
    }
    CHECK(std::memcmp(out, poisoned, sizeof out) == 0);  // untouched
    CHECK(fake.alive("unacked_cq_event") == 0);
    auto again = rcq.next_for(out, std::chrono::seconds(1));
    REQUIRE(again);
    REQUIRE(again->size() == 1);
    CHECK(out[0].wr_id == 8);
  });
}

}  // namespace srq_test
