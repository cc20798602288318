// ConnConfig::completion_channel false: connections whose CQs have no completion channel
// and are never armed. The provider calls of ConnReq::to, Endpoint::next_conn_req and
// Conn::close (each failing in turn); every call that waits for a completion event is
// inval without touching the caller's buffer or the queues; polling, and the lost
// connection found by polling, work as with a channel; the option with a shared
// completion channel is inval; a shared receive queue's CQ keeps its own channel.
#include "data_util.hpp"
#include "loop_util.hpp"

#include <algorithm>
#include <cstring>

namespace completion_channel_test {

using namespace test;
using namespace std::chrono_literals;

namespace {

ConnConfig no_channel(std::uint32_t rcq_size = 0) {
  ConnConfig cfg;
  cfg.rcq_size = rcq_size;
  cfg.completion_channel = false;
  return cfg;
}

constexpr std::string_view reason = "ConnConfig::completion_channel is false";

/// ConnReq::to's calls without a completion channel: the CQs are created and not armed.
std::vector<std::string> to_calls(bool rcq) {
  std::vector<std::string> calls = {
      "rdma_create_event_channel", "fcntl",
      "rdma_create_id",    "rdma_resolve_addr",         "poll",
      "rdma_get_cm_event", "rdma_resolve_route",        "rdma_ack_cm_event", "poll",
      "rdma_get_cm_event", "ibv_create_cq"};
  if (rcq) calls.push_back("ibv_create_cq");
  calls.insert(calls.end(), {"rdma_create_qp", "rdma_ack_cm_event"});
  return calls;
}

/// Endpoint::next_conn_req's calls without a completion channel.
std::vector<std::string> request_calls(bool rcq) {
  std::vector<std::string> calls = {"poll", "rdma_get_cm_event", "ibv_create_cq"};
  if (rcq) calls.push_back("ibv_create_cq");
  calls.insert(calls.end(), {"rdma_create_qp", "rdma_ack_cm_event", "rdma_create_event_channel",
                             "fcntl", "rdma_migrate_id"});
  return calls;
}

/// Conn::close's calls: no completion channel to destroy.
std::vector<std::string> close_calls(bool rcq) {
  std::vector<std::string> calls = {"ibv_destroy_qp", "ibv_destroy_cq"};
  if (rcq) calls.push_back("ibv_destroy_cq");
  calls.insert(calls.end(), {"rdma_destroy_id", "rdma_destroy_event_channel"});
  return calls;
}

bool has_call(const std::vector<std::string>& calls, std::string_view name) {
  return std::find(calls.begin(), calls.end(), name) != calls.end();
}

/// The queue pair's CQs (as the fake recorded rdma_create_qp) have no channel, are not
/// armed, and no completion channel is alive.
void check_no_channel(const fake::FakeProvider& fake, bool rcq) {
  ibv_cq* send = fake.last_qp_attr.send_cq;
  ibv_cq* recv = fake.last_qp_attr.recv_cq;
  REQUIRE(send != nullptr);
  REQUIRE(recv != nullptr);
  CHECK(send->channel == nullptr);
  CHECK(recv->channel == nullptr);
  CHECK((send != recv) == rcq);
  CHECK_FALSE(fake.armed(send));
  CHECK_FALSE(fake.armed(recv));
  CHECK(fake.alive("comp_channel") == 0);
  CHECK(fake.alive("cq") == (rcq ? 2 : 1));
}

/// Every waiting call of `cq` (a queue without a channel) is inval, names the option and
/// writes nothing.
void check_cq_waits_inval(Cq cq) {
  REQUIRE(cq);
  check_inval(cq.fd().error(), "Cq::fd", reason);
  check_inval(cq.wait().error(), "Cq::wait", reason);
  check_inval(cq.try_wait().error(), "Cq::try_wait", reason);
  check_inval(cq.wait_for(1s).error(), "Cq::wait_for", reason);
  check_inval(cq.arm().error(), "Cq::arm", reason);
  PoisonedWcs<2> out;
  check_inval(cq.next(out.span()).error(), "Cq::next", reason);
  check_inval(cq.next_for(out.span(), 1s).error(), "Cq::next_for", reason);
  CHECK(out.untouched());
  CHECK(*cq.shared_channel() == false);
  CHECK(cq.native());
}


}  // namespace

TEST_CASE("completion_channel false: ConnReq::to creates the CQs without a channel, unarmed",
          "[completion_channel]") {
  for (bool rcq : {false, true}) {
    INFO("receive CQ: " << rcq);
    fake::FakeProvider fake;
    {
      Peer peer = open_peer(fake);
      const auto mark = fake.mark();
      auto req = ConnReq::to(peer, "169.254.77.9", "7471", no_channel(rcq ? 4 : 0));
      REQUIRE(req);
      const auto calls = fake.calls_since(mark);
      CHECK(calls == to_calls(rcq));
      CHECK_FALSE(has_call(calls, "ibv_create_comp_channel"));
      CHECK_FALSE(has_call(calls, "ibv_req_notify_cq"));
      check_no_channel(fake, rcq);
      auto conn = std::move(*req).connect();
      REQUIRE(conn);
      CHECK((*conn->cq()->native())->channel == nullptr);
      CHECK(static_cast<bool>(*conn->rcq()) == rcq);
      const auto closing = fake.mark();
      REQUIRE(std::move(*conn).close());
      CHECK(fake.calls_since(closing) == close_calls(rcq));
    }
    fake.expect_clean();
  }
}

TEST_CASE("completion_channel false: Endpoint::next_conn_req creates the CQs without a channel, "
          "unarmed", "[completion_channel]") {
  for (bool rcq : {false, true}) {
    INFO("receive CQ: " << rcq);
    fake::FakeProvider fake;
    {
      Peer peer = open_peer(fake);
      Endpoint ep = listen_on(peer, "169.254.77.1");
      fake.inject_connect_request(*ep.fd(), {});
      const auto mark = fake.mark();
      auto req = ep.next_conn_req(no_channel(rcq ? 4 : 0));
      REQUIRE(req);
      const auto calls = fake.calls_since(mark);
      CHECK(calls == request_calls(rcq));
      CHECK_FALSE(has_call(calls, "ibv_create_comp_channel"));
      CHECK_FALSE(has_call(calls, "ibv_req_notify_cq"));
      check_no_channel(fake, rcq);
    }
    fake.expect_clean();
  }
}

TEST_CASE("completion_channel false: ConnReq::to, each provider call fails in turn",
          "[completion_channel][fail-each]") {
  for (bool rcq : {false, true}) {
    for (int err : {kErr, ENOMEM}) {
      fail_each_call(to_calls(rcq), err, [&](fake::FakeProvider& fake, Probe& probe) {
        Peer peer = open_peer(fake);
        probe.begin();
        auto req = ConnReq::to(peer, "169.254.77.9", "7471", no_channel(rcq ? 4 : 0));
        probe.end();
        if (!probe.check_outcome(req)) return;
        CHECK(fake.alive("cm_id") == 0);
        CHECK(fake.alive("cq") == 0);
        CHECK(fake.alive("qp") == 0);
      });
    }
  }
}

TEST_CASE("completion_channel false: Endpoint::next_conn_req, each provider call fails in turn",
          "[completion_channel][fail-each]") {
  for (bool rcq : {false, true}) {
    for (int err : {kErr, ENOMEM}) {
      fail_each_call(request_calls(rcq), err, [&](fake::FakeProvider& fake, Probe& probe) {
        Peer peer = open_peer(fake);
        Endpoint ep = listen_on(peer, "169.254.77.1");
        fake.inject_connect_request(*ep.fd(), {0, "first", "169.254.77.20", 40001});
        probe.begin();
        auto req = ep.next_conn_req(no_channel(rcq ? 4 : 0));
        probe.end();
        if (!probe.failing()) {
          REQUIRE(req);
          return;
        }
        REQUIRE_FALSE(req);
        probe.check(req.error());
        const bool taken = probe.injected()->call != "poll" && probe.injected()->call != "rdma_get_cm_event";
        CHECK(fake.rejects.size() == (taken ? 1u : 0u));
        CHECK(fake.alive("cq") == 0);
        CHECK(fake.alive("qp") == 0);
      });
    }
  }
}

TEST_CASE("completion_channel false: Conn::close, each provider call fails in turn",
          "[completion_channel][fail-each]") {
  for (bool incoming : {true, false}) {
    for (bool rcq : {false, true}) {
      fail_each_call(close_calls(rcq), kErr, [&](fake::FakeProvider& fake, Probe& probe) {
        Peer peer = open_peer(fake);
        Endpoint ep = listen_on(peer, "169.254.77.1");
        const ConnConfig cfg = no_channel(rcq ? 3 : 0);
        ConnReq req = incoming ? take_request(fake, ep, {}, cfg) : outgoing(peer, "169.254.77.9", cfg);
        auto conn = std::move(req).connect();
        REQUIRE(conn);
        probe.begin();
        auto done = std::move(*conn).close();
        probe.end();
        CHECK(fake.alive("cq") == fake.refused("cq"));
        probe.check_outcome(done);
      });
    }
  }
}

TEST_CASE("completion_channel false: every wait is inval, nothing called, nothing written; polling "
          "works", "[completion_channel][cq]") {
  fake::FakeProvider fake;
  {
    Peer peer = open_peer(fake);
    Conn conn = connected(fake, peer, no_channel(4));
    Cq cq = *conn.cq();
    Cq rcq = *conn.rcq();
    REQUIRE(rcq);
    // A completion is queued: next() must not take it, the waits must not wait.
    fake.add_completion(*cq.native(), completion(7));
    fake.add_completion(*rcq.native(), completion(8, IBV_WC_SUCCESS, IBV_WC_RECV));
    const auto mark = fake.mark();
    check_cq_waits_inval(cq);
    check_cq_waits_inval(rcq);
    check_inval(conn.completion_fd().error(), "Conn::completion_fd", reason);
    check_inval(conn.wait_completion().error(), "Conn::wait_completion", reason);
    check_inval(conn.try_wait_completion().error(), "Conn::try_wait_completion", reason);
    check_inval(conn.wait_completion_for(1s).error(), "Conn::wait_completion_for", reason);
    CHECK(fake.calls_since(mark).empty());
    CHECK(fake.cq_entries(*cq.native()) == 1);
    CHECK(fake.cq_entries(*rcq.native()) == 1);
    CHECK_FALSE(fake.armed(*cq.native()));

    ibv_wc wc[2];
    auto sent = cq.get(wc);
    REQUIRE(sent);
    REQUIRE(sent->size() == 1);
    CHECK(wc[0].wr_id == 7);
    auto received = rcq.get(wc);
    REQUIRE(received);
    REQUIRE(received->size() == 1);
    CHECK(wc[0].wr_id == 8);
    auto empty = cq.get(wc);
    REQUIRE_FALSE(empty);
    CHECK(empty.error().code() == errc::no_completion);
    CHECK(fake.alive("unacked_cq_event") == 0);
  }
  fake.expect_clean();
}

TEST_CASE("completion_channel false: the data path completes into the polled queues, both sides",
          "[completion_channel][data]") {
  fake::FakeProvider fake;
  {
    Peer peer = open_peer(fake);
    Buffer buf(64);
    MrLocal mr = reg(peer, buf, all_usages);
    SECTION("outgoing, one CQ") {
      Conn conn = connected(fake, peer, no_channel());
      Cq cq = *conn.cq();
      REQUIRE(conn.recv(mr, 0, 32, 1));
      REQUIRE(conn.send(mr, 32, 8, Completion::always, 2));
      REQUIRE(conn.write(remote(addr_of(buf.data()), 64, 0x77, MrUsage::write_dst), 0, mr, 0, 8,
                         Completion::always, 3));
      CHECK(fake.complete_sends(*conn.qp()) == 2);
      REQUIRE(fake.deliver_recv(*conn.qp(), as_bytes("abc")));
      ibv_wc wc[4];
      auto got = cq.get(wc);
      REQUIRE(got);
      REQUIRE(got->size() == 3);
      CHECK(wc[0].wr_id == 2);
      CHECK(wc[1].wr_id == 3);
      CHECK(wc[2].wr_id == 1);
      CHECK(wc[2].byte_len == 3);
    }
    SECTION("incoming, receives posted on the request, a receive CQ") {
      Endpoint ep = listen_on(peer, "169.254.77.1");
      ConnReq req = take_request(fake, ep, {}, no_channel(4));
      REQUIRE(req.recv(mr, 0, 32, 9));
      auto conn = std::move(req).connect();
      REQUIRE(conn);
      REQUIRE(fake.connected(*conn->qp()));
      REQUIRE(fake.deliver_recv(*conn->qp(), as_bytes("hello")));
      REQUIRE(conn->send(mr, 32, 8, Completion::always, 10));
      CHECK(fake.complete_sends(*conn->qp()) == 1);
      ibv_wc wc[2];
      auto received = conn->rcq()->get(wc);
      REQUIRE(received);
      REQUIRE(received->size() == 1);
      CHECK(wc[0].wr_id == 9);
      CHECK(wc[0].opcode == IBV_WC_RECV);
      auto sent = conn->cq()->get(wc);
      REQUIRE(sent);
      REQUIRE(sent->size() == 1);
      CHECK(wc[0].wr_id == 10);
    }
  }
  fake.expect_clean();
}

TEST_CASE("completion_channel false: a retry-exceeded completion read by polling reports lost",
          "[completion_channel][lost]") {
  fake::FakeProvider fake;
  {
    Peer peer = open_peer(fake);
    Conn conn = connected(fake, peer, no_channel(4));
    ibv_wc wc[2];
    SECTION("the CQ") {
      fake.add_completion(*conn.cq()->native(), completion(1, IBV_WC_RETRY_EXC_ERR));
      auto before = conn.try_next_event();
      REQUIRE_FALSE(before);
      CHECK(before.error().code() == errc::no_event);
      REQUIRE(conn.cq()->get(wc));
    }
    SECTION("the receive CQ") {
      fake.add_completion(*conn.rcq()->native(), completion(1, IBV_WC_RETRY_EXC_ERR, IBV_WC_RECV));
      REQUIRE(conn.rcq()->get(wc));
    }
    CHECK(conn.try_next_event() == ConnEvent::lost);
    auto after = conn.try_next_event();
    REQUIRE_FALSE(after);
    CHECK(after.error().code() == errc::no_event);
  }
  fake.expect_clean();
}

TEST_CASE("completion_channel false with shared_completion_channel is inval, before any call",
          "[completion_channel][inval]") {
  fake::FakeProvider fake;
  {
    Peer peer = open_peer(fake);
    Endpoint ep = listen_on(peer, "169.254.77.1");
    EventLoop loop = make_loop();
    ConnConfig cfg = no_channel(3);
    cfg.shared_completion_channel = true;
    fake.inject_connect_request(*ep.fd(), {});
    const auto mark = fake.mark();
    check_inval(ConnReq::to(peer, "169.254.77.9", "7471", cfg).error(), "ConnReq::to", "shared_completion_channel");
    check_inval(ConnReq::start(peer, "169.254.77.9", "7471", cfg).error(), "ConnReq::start",
                "completion_channel is false");
    check_inval(ep.next_conn_req(cfg).error(), "Endpoint::next_conn_req", "completion_channel is false");
    check_inval(ep.try_next_conn_req(cfg).error(), "Endpoint::try_next_conn_req", "completion_channel");
    check_inval(loop.serve(ep, [](expected<ConnReq>) { FAIL("called"); }, cfg).error(), "EventLoop::serve",
                "completion_channel");
    CHECK(fake.calls_since(mark).empty());
    CHECK(fake.queued(*ep.fd()) == 1);  // the request is still there
    cfg.shared_completion_channel = false;
    CHECK(ep.try_next_conn_req(cfg));
  }
  fake.expect_clean();
}

TEST_CASE("completion_channel false with a shared receive queue: its CQ keeps its own channel",
          "[completion_channel][srq]") {
  fake::FakeProvider fake;
  {
    Peer peer = open_peer(fake);
    Buffer buf(16);
    MrLocal mr = reg(peer, buf, MrUsage::recv);
    SECTION("the Srq has a CQ: receives are waited for on the Srq's channel") {
      auto srq = Srq::create(peer, SrqConfig{4, 4});
      REQUIRE(srq);
      ConnConfig cfg = no_channel(3);  // rcq_size ignored: the Srq's CQ takes the receives
      cfg.srq = &*srq;
      Conn conn = connected(fake, peer, cfg);
      CHECK(fake.alive("comp_channel") == 1);  // the Srq's
      CHECK(fake.alive("cq") == 2);
      Cq rcq = *conn.rcq();
      CHECK(rcq == *srq->rcq());
      CHECK(rcq.fd());
      check_cq_waits_inval(*conn.cq());
      REQUIRE(srq->recv(mr, 0, 16, 5));
      REQUIRE(fake.deliver_recv(*conn.qp()));
      REQUIRE(rcq.wait_for(1s));  // the event on the Srq's channel; the queue re-armed
      CHECK(fake.armed(*rcq.native()));
      ibv_wc wc[2];
      auto got = rcq.get(wc);
      REQUIRE(got);
      REQUIRE(got->size() == 1);
      CHECK(wc[0].wr_id == 5);
    }
    SECTION("the Srq has no CQ: receives land in the connection's CQ, polled") {
      auto srq = Srq::create(peer, SrqConfig{4, 0});
      REQUIRE(srq);
      ConnConfig cfg = no_channel();
      cfg.srq = &*srq;
      Conn conn = connected(fake, peer, cfg);
      CHECK(fake.alive("comp_channel") == 0);
      CHECK_FALSE(*conn.rcq());
      REQUIRE(srq->recv(mr, 0, 16, 6));
      REQUIRE(fake.deliver_recv(*conn.qp()));
      ibv_wc wc[2];
      PoisonedWcs<2> out;
      check_inval(conn.cq()->next(out.span()).error(), "Cq::next", reason);
      CHECK(out.untouched());
      auto got = conn.cq()->get(wc);
      REQUIRE(got);
      REQUIRE(got->size() == 1);
      CHECK(wc[0].wr_id == 6);
    }
  }
  fake.expect_clean();
}

TEST_CASE("completion_channel false: EventLoop::watch_completions and completions are inval",
          "[completion_channel][event_loop]") {
  fake::FakeProvider fake;
  {
    Peer peer = open_peer(fake);
    EventLoop loop = make_loop();
    Conn conn = connected(fake, peer, no_channel(4));
    fake.add_completion(*conn.cq()->native(), completion(7));
    const auto mark = fake.mark();
    for (CqKind which : {CqKind::main, CqKind::receive}) {
      auto reg = loop.watch_completions(conn, [](auto) { FAIL("called"); }, which);
      REQUIRE_FALSE(reg);
      check_inval(reg.error(), "EventLoop::watch_completions", reason);
    }
    PoisonedWcs<2> out;
    auto await_completions = [&](CqKind which) -> Task<expected<std::span<ibv_wc>>> {
      co_return co_await loop.completions(conn, out.span(), which, 1000ms);
    };
    for (CqKind which : {CqKind::main, CqKind::receive}) {
      auto got = block_on(loop, await_completions(which));
      REQUIRE(got);
      REQUIRE_FALSE(*got);
      check_inval(got->error(), "EventLoop::completions", reason);
    }
    CHECK(out.untouched());
    auto calls = fake.calls_since(mark);
    CHECK_FALSE(has_call(calls, "fcntl"));
    CHECK_FALSE(has_call(calls, "epoll_ctl"));
    CHECK_FALSE(has_call(calls, "ibv_poll_cq"));
    CHECK(fake.cq_entries(*conn.cq()->native()) == 1);
    // The loop still watches the connection's events.
    auto events = loop.watch(conn, [](expected<ConnEvent>) {});
    CHECK(events);
  }
  CHECK(fake.closed_while_watched() == 0);
  fake.expect_clean();
}

}  // namespace completion_channel_test
