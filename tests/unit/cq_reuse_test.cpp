// ConnConfig::reuse_completion_queues: a released connection's CQs (without a completion
// channel) polled empty, kept by its Peer and given to the next connection of the same
// sizes. Never a completion of another connection; only CQs of the same size; inval with a
// completion channel; a CQ whose polling fails is destroyed; fail-each with spares; the cap;
// threads.
#include "data_util.hpp"

#include <algorithm>
#include <thread>

namespace cq_reuse_test {

using namespace test;
using namespace std::chrono_literals;

namespace {

ConnConfig reusing(std::uint32_t rcq_size = 0, std::uint32_t cq_size = 10) {
  ConnConfig cfg;
  cfg.completion_channel = false;
  cfg.reuse_completion_queues = true;
  cfg.cq_size = cq_size;
  cfg.rcq_size = rcq_size;
  return cfg;
}

bool has(const std::vector<std::string>& calls, std::string_view call) {
  return std::find(calls.begin(), calls.end(), call) != calls.end();
}

long count(const std::vector<std::string>& calls, std::string_view call) {
  return std::count(calls.begin(), calls.end(), call);
}

Conn connected_to(expected<Conn> conn) {
  INFO((conn ? std::string() : conn.error().message()));
  REQUIRE(conn);
  return std::move(*conn);
}

}  // namespace

TEST_CASE("reuse_completion_queues: an outgoing connection's CQs serve the next one",
          "[conn_req][reuse_cq]") {
  fake::FakeProvider fake;
  {
    Peer peer = open_peer(fake);
    for (std::uint32_t rcq : {0u, 4u}) {
      INFO("rcq_size " << rcq);
      Conn first = connected_to(outgoing(peer, "169.254.77.9", reusing(rcq)).connect());
      ibv_cq* cq = fake.last_qp_attr.send_cq;
      ibv_cq* rcq_made = fake.last_qp_attr.recv_cq;
      auto mark = fake.mark();
      REQUIRE(std::move(first).close());
      CHECK_FALSE(has(fake.calls_since(mark), "ibv_destroy_cq"));
      CHECK(fake.alive("cq") == (rcq ? 2 : 1));  // kept by the Peer
      CHECK(fake.alive("qp") == 0);

      mark = fake.mark();
      Conn second = connected_to(outgoing(peer, "169.254.77.9", reusing(rcq)).connect());
      CHECK_FALSE(has(fake.calls_since(mark), "ibv_create_cq"));
      CHECK(fake.last_qp_attr.send_cq == cq);
      CHECK(fake.last_qp_attr.recv_cq == rcq_made);
      CHECK(*second.cq()->native() == cq);
      CHECK(fake.alive("cq") == (rcq ? 2 : 1));
      REQUIRE(std::move(second).close());
    }
  }
  fake.expect_clean();  // the spares went with the Peer's last reference
}

TEST_CASE("reuse_completion_queues: an incoming connection takes a spare CQ too",
          "[conn_req][reuse_cq]") {
  fake::FakeProvider fake;
  {
    Peer peer = open_peer(fake);
    Endpoint ep = listen_on(peer, "169.254.77.1");
    Conn first = connected_to(outgoing(peer, "169.254.77.9", reusing()).connect());
    ibv_cq* cq = fake.last_qp_attr.send_cq;
    REQUIRE(std::move(first).close());
    const auto mark = fake.mark();
    Conn accepted = connected_to(take_request(fake, ep, {}, reusing()).connect());
    CHECK_FALSE(has(fake.calls_since(mark), "ibv_create_cq"));
    CHECK(fake.last_qp_attr.send_cq == cq);
    Conn other = connected_to(take_request(fake, ep, {}, reusing()).connect());
    CHECK(fake.last_qp_attr.send_cq != cq);  // no spare left: the first one is in use
    CHECK(fake.alive("cq") == 2);
  }
  fake.expect_clean();
}

TEST_CASE("reuse_completion_queues: the released connection's completions are gone",
          "[conn_req][reuse_cq][data]") {
  fake::FakeProvider fake;
  {
    Peer peer = open_peer(fake);
    Buffer buf(64);
    MrLocal mr = reg(peer, buf, all_usages);
    Conn first = connected(fake, peer, reusing(4));
    REQUIRE(first.recv(mr, 0, 32, 1));
    REQUIRE(first.send(mr, 32, 8, Completion::always, 2));
    CHECK(fake.complete_sends(*first.qp()) == 1);
    REQUIRE(fake.deliver_recv(*first.qp(), as_bytes("old")));
    REQUIRE(first.recv(mr, 0, 32, 3));  // outstanding at the release: no completion
    // never polled: a send completion in the CQ, a receive one in the receive CQ
    ibv_cq* cq = fake.last_qp_attr.send_cq;
    ibv_cq* rcq = fake.last_qp_attr.recv_cq;
    REQUIRE(std::move(first).close());

    Conn second = connected(fake, peer, reusing(4));
    REQUIRE(fake.last_qp_attr.send_cq == cq);
    REQUIRE(fake.last_qp_attr.recv_cq == rcq);
    PoisonedWcs<4> out;
    auto none = second.cq()->get(out.span());
    REQUIRE_FALSE(none);
    CHECK(none.error().code() == errc::no_completion);
    auto none_received = second.rcq()->get(out.span());
    REQUIRE_FALSE(none_received);
    CHECK(none_received.error().code() == errc::no_completion);
    CHECK(out.untouched());
    // and the queues carry the new connection's completions
    REQUIRE(second.send(mr, 32, 8, Completion::always, 20));
    CHECK(fake.complete_sends(*second.qp()) == 1);
    ibv_wc wc[2];
    auto got = second.cq()->get(wc);
    REQUIRE(got);
    REQUIRE(got->size() == 1);
    CHECK(wc[0].wr_id == 20);
  }
  fake.expect_clean();
}

TEST_CASE("reuse_completion_queues: only a CQ of the same size is taken",
          "[conn_req][reuse_cq]") {
  fake::FakeProvider fake;
  {
    Peer peer = open_peer(fake);
    REQUIRE(outgoing(peer, "169.254.77.9", reusing(0, 10)).close());
    auto mark = fake.mark();
    ConnReq bigger = outgoing(peer, "169.254.77.9", reusing(0, 20));
    CHECK(count(fake.calls_since(mark), "ibv_create_cq") == 1);
    CHECK(fake.last_qp_attr.send_cq->cqe == 20);
    REQUIRE(std::move(bigger).close());
    CHECK(fake.alive("cq") == 2);  // both kept
    mark = fake.mark();
    ConnReq smaller = outgoing(peer, "169.254.77.9", reusing(0, 10));
    CHECK_FALSE(has(fake.calls_since(mark), "ibv_create_cq"));
    CHECK(fake.last_qp_attr.send_cq->cqe == 10);
    // a receive CQ of 10 takes the other 10 only when one is left: here a new one
    mark = fake.mark();
    ConnReq with_rcq = outgoing(peer, "169.254.77.9", reusing(20, 10));
    CHECK(count(fake.calls_since(mark), "ibv_create_cq") == 1);  // the CQ of 10 is new
    CHECK(fake.last_qp_attr.recv_cq->cqe == 20);                 // the receive CQ a spare
  }
  fake.expect_clean();
}

TEST_CASE("reuse_completion_queues: without it, or without the option on the next "
          "connection, CQs are made and destroyed",
          "[conn_req][reuse_cq]") {
  fake::FakeProvider fake;
  {
    Peer peer = open_peer(fake);
    SECTION("completion_channel false alone destroys the CQ with the connection") {
      ConnConfig plain;
      plain.completion_channel = false;
      ConnReq req = outgoing(peer, "169.254.77.9", plain);
      const auto mark = fake.mark();
      REQUIRE(std::move(req).close());
      CHECK(has(fake.calls_since(mark), "ibv_destroy_cq"));
      CHECK(fake.alive("cq") == 0);
    }
    SECTION("a connection without it takes no spare") {
      REQUIRE(outgoing(peer, "169.254.77.9", reusing()).close());
      ConnConfig plain;
      plain.completion_channel = false;
      const auto mark = fake.mark();
      ConnReq req = outgoing(peer, "169.254.77.9", plain);
      CHECK(has(fake.calls_since(mark), "ibv_create_cq"));
      CHECK(fake.alive("cq") == 2);
    }
  }
  fake.expect_clean();
}

TEST_CASE("reuse_completion_queues with a completion channel is inval, before any call",
          "[conn_req][reuse_cq]") {
  fake::FakeProvider fake;
  {
    Peer peer = open_peer(fake);
    Endpoint ep = listen_on(peer, "169.254.77.1");
    ConnConfig cfg = reusing();
    cfg.completion_channel = true;
    const auto mark = fake.mark();
    auto req = ConnReq::to(peer, "169.254.77.9", "7471", cfg);
    REQUIRE_FALSE(req);
    check_inval(req.error(), "ConnReq::to", "reuse_completion_queues needs CQs without a completion channel");
    auto started = ConnReq::start(peer, "169.254.77.9", "7471", cfg);
    REQUIRE_FALSE(started);
    check_inval(started.error(), "ConnReq::start", "set completion_channel to false");
    CHECK(fake.calls_since(mark).empty());
    fake.inject_connect_request(*ep.fd(), {0, "first", "169.254.77.20", 40001});
    auto incoming = ep.next_conn_req(cfg);
    REQUIRE_FALSE(incoming);
    CHECK(incoming.error().code() == errc::inval);
    CHECK(fake.alive("cq") == 0);
  }
  fake.expect_clean();
}

TEST_CASE("reuse_completion_queues: a CQ whose polling fails at the release is destroyed",
          "[conn_req][reuse_cq]") {
  fake::FakeProvider fake;
  {
    Peer peer = open_peer(fake);
    ConnReq req = outgoing(peer, "169.254.77.9", reusing());
    fake.fail("ibv_poll_cq", kErr);
    const auto mark = fake.mark();
    REQUIRE(std::move(req).close());  // polling is part of the release, not a failure of it
    const auto calls = fake.calls_since(mark);
    CHECK(has(calls, "ibv_destroy_cq"));
    CHECK(fake.alive("cq") == 0);
    CHECK(fake.pending_faults() == 0);
  }
  fake.expect_clean();
}

TEST_CASE("review 2.D: a CQ whose queue pair survived a failed ibv_destroy_qp is never "
          "reused",
          "[conn_req][reuse_cq]") {
  for (std::uint32_t rcq : {0u, 4u}) {
    INFO("rcq_size " << rcq);
    fake::FakeProvider fake;
    {
      Peer peer = open_peer(fake);
      // a spare of the right size, which the next connection takes
      REQUIRE(std::move(connected_to(outgoing(peer, "169.254.77.9", reusing(rcq)).connect())).close());
      Conn first = connected_to(outgoing(peer, "169.254.77.9", reusing(rcq)).connect());
      ibv_cq* cq = fake.last_qp_attr.send_cq;
      ibv_cq* rcq_made = fake.last_qp_attr.recv_cq;
      fake.fail("ibv_destroy_qp", EBUSY);
      auto closed = std::move(first).close();
      REQUIRE_FALSE(closed);
      check_injected(closed.error(), "ibv_destroy_qp", EBUSY);
      CHECK(fake.alive("qp") == 1);  // the kernel kept it, and with it its CQs
      CHECK(fake.refused("cq") == (rcq ? 2 : 1));

      const auto mark = fake.mark();
      Conn second = connected_to(outgoing(peer, "169.254.77.9", reusing(rcq)).connect());
      CHECK(count(fake.calls_since(mark), "ibv_create_cq") == (rcq ? 2 : 1));
      CHECK(fake.last_qp_attr.send_cq != cq);
      CHECK(fake.last_qp_attr.recv_cq != rcq_made);
      REQUIRE(std::move(second).close());
    }
    fake.close_contexts();
    fake.expect_clean();  // nothing else left: the second connection's CQs were spares
  }
}

TEST_CASE("reuse_completion_queues: each provider call of a request on a spare fails in turn",
          "[conn_req][reuse_cq][fail-each]") {
  const std::vector<std::string> calls = {
      "rdma_create_event_channel", "fcntl",          "rdma_create_id",    "rdma_resolve_addr",
      "poll",                      "rdma_get_cm_event", "rdma_resolve_route", "rdma_ack_cm_event",
      "poll",                      "rdma_get_cm_event", "rdma_create_qp",  "rdma_ack_cm_event"};
  fail_each_call(calls, kErr, [&](fake::FakeProvider& fake, Probe& probe) {
    Peer peer = open_peer(fake);
    REQUIRE(outgoing(peer, "169.254.77.9", reusing()).close());
    probe.begin();
    auto req = ConnReq::to(peer, "169.254.77.9", "7471", reusing());
    probe.end();
    CHECK(fake.alive("cq") == 1);  // in use, or given back after the failure
    if (!probe.check_outcome(req)) return;
    CHECK(fake.alive("cm_id") == 0);
    CHECK(fake.alive("qp") == 0);
    auto again = ConnReq::to(peer, "169.254.77.9", "7471", reusing());
    REQUIRE(again);
    CHECK(fake.alive("cq") == 1);
  });
}

TEST_CASE("reuse_completion_queues: a Peer keeps at most max_spare_completion_queues",
          "[conn_req][reuse_cq]") {
  fake::FakeProvider fake;
  {
    Peer peer = open_peer(fake);
    std::vector<ConnReq> reqs;
    for (std::size_t i = 0; i < Peer::max_spare_completion_queues + 3; ++i)
      reqs.push_back(outgoing(peer, "169.254.77.9", reusing()));
    reqs.clear();
    CHECK(fake.alive("cq") == static_cast<long>(Peer::max_spare_completion_queues));
    CHECK(fake.alive("qp") == 0);
  }
  fake.expect_clean();
}

TEST_CASE("reuse_completion_queues: connections made and released on several threads",
          "[conn_req][reuse_cq][threads]") {
  fake::FakeProvider fake;
  {
    Peer peer = open_peer(fake);
    std::vector<std::thread> threads;
    for (int t = 0; t < 4; ++t)
      threads.emplace_back([&peer, t] {
        for (int i = 0; i < 25; ++i) {
          auto req = ConnReq::to(peer, "169.254.77.9", "7471", reusing(t % 2 == 0 ? 0 : 4));
          if (!req || !std::move(*req).close()) std::abort();
        }
      });
    for (auto& t : threads) t.join();
    CHECK(fake.alive("cq") >= 1);
    CHECK(fake.alive("cq") <= 8);
  }
  fake.expect_clean();
}

}  // namespace cq_reuse_test
