// SharedCq: one completion queue for many connections. Creation and its failures; what a
// connection on it has (no CQ or completion channel of its own); completions tagged with
// their connections (also a shared receive queue's CQ); a released connection's completions
// drained at its release, also when the device gives its queue pair number to the next one;
// a lost path found through the shared queue; the configurations it refuses.
#include "data_util.hpp"
#include "loop_util.hpp"

#include <array>
#include <optional>

namespace shared_cq_test {

using namespace test;

/// A Peer, a SharedCq on it, a ConnConfig for connections on that queue, and 64 bytes
/// registered for sends and receives.
struct OnSharedCq {
  explicit OnSharedCq(fake::FakeProvider& fake, const SharedCqConfig& config = {}) : peer(open_peer(fake)) {
    auto made = SharedCq::create(peer, config);
    REQUIRE(made);
    shared = std::move(*made);
    cfg.shared_cq = &shared;
    mr = reg(peer, buf, MrUsage::send | MrUsage::recv);
  }
  Peer peer;
  SharedCq shared;
  ConnConfig cfg;
  Buffer buf{64};
  MrLocal mr;
};

/// A signaled send of `conn` with `context`, completed by the fake.
void send_completed(fake::FakeProvider& fake, Conn& conn, const MrLocal& src, std::uint64_t context) {
  REQUIRE(conn.send(src, 0, 8, Completion::always, context));
  REQUIRE(fake.complete_sends(*conn.qp()) == 1);
}

/// Reads everything `cq` holds: (wr_id, tag) in order.
std::vector<std::pair<std::uint64_t, ConnId>> drain(Cq cq) {
  std::vector<std::pair<std::uint64_t, ConnId>> all;
  std::array<ibv_wc, 3> wcs;  // small: the reads take parked and polled completions together
  std::array<ConnId, 3> conns;
  for (;;) {
    auto got = cq.get(wcs, conns);
    if (!got) {
      CHECK(got.error().code() == errc::no_completion);
      return all;
    }
    for (std::size_t i = 0; i < got->size(); ++i) {
      CHECK((*got)[i].status == IBV_WC_SUCCESS);
      all.emplace_back((*got)[i].wr_id, conns[i]);
    }
  }
}

TEST_CASE("SharedCq::create: a queue with its channel, armed; without a channel; bad configs", "[shared-cq]") {
  fake::FakeProvider fake;
  {
    Peer peer = open_peer(fake);
    auto mark = fake.mark();
    auto shared = SharedCq::create(peer, SharedCqConfig{500, true, 0});
    REQUIRE(shared);
    CHECK(fake.calls_since(mark) ==
          std::vector<std::string>{"ibv_create_comp_channel", "ibv_create_cq", "ibv_req_notify_cq"});
    Cq cq = *shared->cq();
    CHECK((*cq.native())->cqe == 500);
    CHECK(fake.armed(*cq.native()));
    CHECK(*cq.fd() >= 0);
    CHECK(*shared->connections() == 0);

    mark = fake.mark();
    auto polled_only = SharedCq::create(peer, SharedCqConfig{8, false, 0});
    REQUIRE(polled_only);
    CHECK(fake.calls_since(mark) == std::vector<std::string>{"ibv_create_cq"});
    check_inval(polled_only->cq()->fd().error(), "Cq::fd", "no completion channel");

    mark = fake.mark();
    check_inval(SharedCq::create(peer, SharedCqConfig{0, true, 0}).error(), "SharedCq::create", "size 0");
    check_inval(SharedCq::create(peer, SharedCqConfig{0x80000000u, true, 0}).error(), "SharedCq::create");
    check_inval(SharedCq::create(peer, SharedCqConfig{8, true, -1}).error(), "SharedCq::create",
                "completion_vector");
    check_inval(SharedCq::create(peer, SharedCqConfig{8, true, 1}).error(), "SharedCq::create",
                "completion_vector 1");
    check_inval(SharedCq::create(Peer()).error(), "SharedCq::create");
    CHECK(fake.calls_since(mark).empty());

    SharedCq moved = std::move(*shared);
    check_inval(shared->cq().error(), "SharedCq::cq");
    check_inval(shared->connections().error(), "SharedCq::connections");
    check_inval(std::move(*shared).close().error(), "SharedCq::close");
    REQUIRE(std::move(moved).close());
    CHECK(fake.alive("cq") == 1);  // polled_only's
  }
  fake.expect_clean();
}

TEST_CASE("SharedCq::create and close: each provider call fails in turn", "[shared-cq][fail-each]") {
  for (int err : {kErr, ENOMEM}) {
    fail_each_call({"ibv_create_comp_channel", "ibv_create_cq", "ibv_req_notify_cq"}, err,
                   [](fake::FakeProvider& fake, Probe& probe) {
      Peer peer = open_peer(fake);
      probe.begin();
      auto shared = SharedCq::create(peer);
      probe.end();
      if (!probe.check_outcome(shared)) return;
      CHECK(fake.alive("cq") == 0);
      CHECK(fake.alive("comp_channel") == 0);
      CHECK(SharedCq::create(peer));
    });
  }
  fail_each_call({"ibv_destroy_cq", "ibv_destroy_comp_channel"}, kErr, [](fake::FakeProvider& fake, Probe& probe) {
    Peer peer = open_peer(fake);
    auto shared = SharedCq::create(peer);
    REQUIRE(shared);
    probe.begin();
    auto closed = std::move(*shared).close();
    probe.end();
    CHECK_FALSE(*shared);
    probe.check_outcome(closed);
  });
}

TEST_CASE("connections on a SharedCq: no queue or channel of their own, completions tagged with Conn::id",
          "[shared-cq]") {
  fake::FakeProvider fake;
  {
    OnSharedCq s(fake);
    const auto cqs = fake.alive("cq"), channels = fake.alive("comp_channel");
    ConnReq req = outgoing(s.peer, "169.254.77.9", s.cfg);
    const ConnId first = *req.id();
    CHECK(first);
    auto connected_req = std::move(req).connect();
    REQUIRE(connected_req);
    Conn a = std::move(*connected_req);
    fake.inject_event(*a.fd(), RDMA_CM_EVENT_ESTABLISHED);
    REQUIRE(*a.try_next_event() == ConnEvent::established);
    CHECK(*a.id() == first);
    Conn b = connected(fake, s.peer, s.cfg);
    CHECK(*b.id() != *a.id());
    CHECK(fake.alive("cq") == cqs);  // the connections made none
    CHECK(fake.alive("comp_channel") == channels);
    CHECK(*a.cq() == *s.shared.cq());
    CHECK(*b.cq() == *s.shared.cq());
    CHECK_FALSE(*a.rcq());
    CHECK(*s.shared.connections() == 2);
    CHECK((*a.qp())->send_cq == *s.shared.cq()->native());
    CHECK((*a.qp())->recv_cq == *s.shared.cq()->native());

    const MrLocal& mr = s.mr;
    send_completed(fake, b, mr, 1);
    send_completed(fake, a, mr, 2);
    REQUIRE(a.recv(mr, 0, 64, 3));
    REQUIRE(fake.deliver_recv(*a.qp()));
    CHECK(drain(*s.shared.cq()) ==
          std::vector<std::pair<std::uint64_t, ConnId>>{{1, *b.id()}, {2, *a.id()}, {3, *a.id()}});

    // untagged reads work too; the tags of a connection's own queue are its id
    send_completed(fake, b, mr, 4);
    ibv_wc wc;
    REQUIRE(s.shared.cq()->get({&wc, 1}));
    CHECK(wc.wr_id == 4);
    Conn own = connected(fake, s.peer);
    send_completed(fake, own, mr, 5);
    ConnId tag;
    REQUIRE(own.cq()->get({&wc, 1}, {&tag, 1}));
    CHECK(tag == *own.id());

    // too few tags: inval, nothing polled
    send_completed(fake, a, mr, 6);
    std::array<ibv_wc, 2> two;
    const auto mark = fake.mark();
    check_inval(s.shared.cq()->get(two, {&tag, 1}).error(), "Cq::get", "a tag for each");
    CHECK(fake.calls_since(mark).empty());
    CHECK(drain(*s.shared.cq()) == std::vector<std::pair<std::uint64_t, ConnId>>{{6, *a.id()}});
  }
  fake.expect_clean();
}

TEST_CASE("a released connection's completions are dropped from the SharedCq, the others kept in order",
          "[shared-cq][release]") {
  fake::FakeProvider fake;
  {
    OnSharedCq s(fake);
    const MrLocal& mr = s.mr;
    std::optional<Conn> a(connected(fake, s.peer, s.cfg));
    Conn b = connected(fake, s.peer, s.cfg);
    std::optional<Conn> d(connected(fake, s.peer, s.cfg));
    const ConnId b_id = *b.id();
    const std::uint32_t a_qp_num = *a->qp_num();
    for (std::uint64_t i = 1; i <= 6; ++i) send_completed(fake, i % 2 ? *a : b, mr, i);
    send_completed(fake, *d, mr, 10);
    // two read before the release; the rest stays queued
    std::array<ibv_wc, 2> first;
    std::array<ConnId, 2> first_tags;
    REQUIRE(s.shared.cq()->get(first, first_tags)->size() == 2);
    CHECK(first_tags[0] == *a->id());
    // d's release parks the others' completions (3 to 6); a's then drops a's parked ones
    REQUIRE(std::move(*d).close());
    d.reset();

    // the device gives a's queue pair number to the next queue pair at once (mlx5 may)
    fake.next_qp_number(a_qp_num);
    REQUIRE(std::move(*a).close());
    a.reset();
    CHECK(*s.shared.connections() == 1);
    Conn c = connected(fake, s.peer, s.cfg);
    REQUIRE(*c.qp_num() == a_qp_num);
    send_completed(fake, c, mr, 7);
    CHECK(drain(*s.shared.cq()) ==
          std::vector<std::pair<std::uint64_t, ConnId>>{{4, b_id}, {6, b_id}, {7, *c.id()}});

    // the last connection keeps the queue after the SharedCq handle is gone
    REQUIRE(std::move(s.shared).close());
    CHECK(fake.alive("cq") == 1);
    send_completed(fake, b, mr, 8);
    CHECK(drain(*c.cq()) == std::vector<std::pair<std::uint64_t, ConnId>>{{8, b_id}});
    REQUIRE(std::move(b).close());
    REQUIRE(std::move(c).close());
    CHECK(fake.alive("cq") == 0);
    CHECK(fake.alive("comp_channel") == 0);
  }
  fake.expect_clean();
}

TEST_CASE("a retry-exceeded completion read from the SharedCq makes only its connection lost",
          "[shared-cq][lost]") {
  fake::FakeProvider fake;
  {
    OnSharedCq s(fake);
    const MrLocal& mr = s.mr;
    Conn a = connected(fake, s.peer, s.cfg);
    Conn b = connected(fake, s.peer, s.cfg);
    REQUIRE(a.send(mr, 0, 8, Completion::always, 1));
    REQUIRE(fake.complete_sends(*a.qp(), 1, IBV_WC_RETRY_EXC_ERR) == 1);
    send_completed(fake, b, mr, 2);
    std::array<ibv_wc, 4> wcs;
    std::array<ConnId, 4> tags;
    auto got = s.shared.cq()->get(wcs, tags);
    REQUIRE(got->size() == 2);
    CHECK(wcs[0].status == IBV_WC_RETRY_EXC_ERR);
    CHECK(tags[0] == *a.id());
    CHECK(*a.try_next_event() == ConnEvent::lost);
    auto quiet = b.try_next_event();
    REQUIRE_FALSE(quiet);
    CHECK(quiet.error().code() == errc::no_event);
  }
  fake.expect_clean();
}

TEST_CASE("a shared receive queue's CQ tags receives with their connections and drops a released one's",
          "[shared-cq][srq]") {
  fake::FakeProvider fake;
  {
    Peer peer = open_peer(fake);
    auto srq = Srq::create(peer, SrqConfig{8, 8});
    REQUIRE(srq);
    auto shared = SharedCq::create(peer);
    REQUIRE(shared);
    ConnConfig cfg;
    cfg.srq = &*srq;
    cfg.shared_cq = &*shared;
    std::optional<Conn> a(connected(fake, peer, cfg));
    Conn b = connected(fake, peer, cfg);
    CHECK(*a->rcq() == *srq->rcq());
    CHECK((*a->qp())->recv_cq == *srq->rcq()->native());
    CHECK((*a->qp())->send_cq == *shared->cq()->native());
    Buffer buf(64);
    MrLocal mr = reg(peer, buf, MrUsage::recv);
    for (std::uint64_t i = 1; i <= 4; ++i) REQUIRE(srq->recv(mr, 0, 64, i));
    REQUIRE(fake.deliver_recv(*a->qp()));
    REQUIRE(fake.deliver_recv(*b.qp()));
    REQUIRE(fake.deliver_recv(*a->qp()));
    const ConnId b_id = *b.id();
    REQUIRE(std::move(*a).close());
    CHECK(drain(*srq->rcq()) == std::vector<std::pair<std::uint64_t, ConnId>>{{2, b_id}});
    REQUIRE(fake.deliver_recv(*b.qp()));
    CHECK(drain(*b.rcq()) == std::vector<std::pair<std::uint64_t, ConnId>>{{4, b_id}});
  }
  fake.expect_clean();
}

TEST_CASE("ConnConfig::shared_cq: what it cannot be combined with, another device, and waits on the connection",
          "[shared-cq][inval]") {
  fake::FakeProvider fake;
  {
    OnSharedCq s(fake);
    for (auto bad : {+[](ConnConfig& c) { c.rcq_size = 4; }, +[](ConnConfig& c) { c.shared_completion_channel = true; },
                     +[](ConnConfig& c) {
                       c.reuse_completion_queues = true;
                       c.completion_channel = false;
                     }}) {
      ConnConfig cfg = s.cfg;
      bad(cfg);
      const auto mark = fake.mark();
      check_inval(ConnReq::to(s.peer, "169.254.77.9", "7471", cfg).error(), "ConnReq::to", "no CQ of its own");
      CHECK(fake.calls_since(mark).empty());
    }
    SharedCq empty;
    ConnConfig on_empty = s.cfg;
    on_empty.shared_cq = &empty;
    check_inval(ConnReq::to(s.peer, "169.254.77.9", "7471", on_empty).error(), "ConnReq::to", "empty SharedCq");

    // a connection on device 1 with a shared queue of device 0
    Peer other = open_peer(fake, 1);
    auto req = ConnReq::to(other, "169.254.78.9", "7471", s.cfg);
    REQUIRE_FALSE(req);
    check_inval(req.error(), "ConnConfig", "the shared CQ (shared_cq) is on device fake0, but the peer is on fake1");
    CHECK(fake.alive("qp") == 0);

    // waiting is the shared queue's
    Conn conn = connected(fake, s.peer, s.cfg);
    check_inval(conn.completion_fd().error(), "Conn::completion_fd", "SharedCq::cq()");
    check_inval(conn.try_wait_completion().error(), "Conn::try_wait_completion", "shared CQ");
    auto loop = EventLoop::create();
    REQUIRE(loop);
    auto watched = loop->watch_completions(conn, [](expected<std::span<const ibv_wc>>) {});
    REQUIRE_FALSE(watched);
    check_inval(watched.error(), "EventLoop::watch_completions", "shared CQ");
  }
  fake.expect_clean();
}

TEST_CASE("an accepted request on a SharedCq, the config kept by EventLoop::serve", "[shared-cq][loop]") {
  fake::FakeProvider fake;
  {
    Peer peer = open_peer(fake);
    std::optional<SharedCq> shared(*SharedCq::create(peer));
    ConnConfig cfg;
    cfg.shared_cq = &*shared;
    Endpoint ep = listen_on(peer, "169.254.77.1");
    auto loop = EventLoop::create();
    REQUIRE(loop);
    std::optional<ConnReq> taken;
    auto served = loop->serve(ep, [&](expected<ConnReq> req) {
      REQUIRE(req);
      taken.emplace(std::move(*req));
    }, cfg);
    REQUIRE(served);
    Cq cq = *shared->cq();
    shared.reset();  // the loop's kept config holds the queue
    fake.inject_connect_request(*ep.fd(), {});
    REQUIRE(loop->run_once(std::chrono::milliseconds(0)));
    REQUIRE(taken);
    CHECK((*taken->qp_num()) != 0);
    auto conn = std::move(*taken).connect();
    REQUIRE(conn);
    CHECK(*conn->cq() == cq);
    CHECK(fake.alive("cq") == 1);
  }
  fake.expect_clean();
}

TEST_CASE("releasing a connection on a SharedCq: each provider call fails in turn", "[shared-cq][fail-each]") {
  fail_each_call({"ibv_destroy_qp", "ibv_poll_cq", "rdma_destroy_id", "rdma_destroy_event_channel"}, kErr,
                 [](fake::FakeProvider& fake, Probe& probe) {
    OnSharedCq s(fake);
    const MrLocal& mr = s.mr;
    Conn a = connected(fake, s.peer, s.cfg);
    Conn b = connected(fake, s.peer, s.cfg);
    send_completed(fake, a, mr, 1);
    const ConnId a_id = *a.id();
    probe.begin();
    auto closed = std::move(a).close();
    probe.end();
    if (probe.failing() && probe.injected()->call == "ibv_poll_cq") {
      // a provider's negative value, not an errno (as Cq::get reports it)
      REQUIRE_FALSE(closed);
      CHECK(closed.error().code() == errc::provider);
      CHECK(closed.error().call() == "ibv_poll_cq");
      CHECK_THAT(closed.error().message(), Catch::Contains("stays routed to the gone connection"));
    } else {
      probe.check_outcome(closed);
    }
    send_completed(fake, b, mr, 2);
    auto left = drain(*s.shared.cq());
    if (probe.failing() && (probe.injected()->call == "ibv_destroy_qp" || probe.injected()->call == "ibv_poll_cq")) {
      // the queue pair survived, or its draining failed: its completion stays its own
      CHECK(left == std::vector<std::pair<std::uint64_t, ConnId>>{{1, a_id}, {2, *b.id()}});
      CHECK(*s.shared.connections() == 2);
    } else {
      CHECK(left == std::vector<std::pair<std::uint64_t, ConnId>>{{2, *b.id()}});
      CHECK(*s.shared.connections() == 1);
    }
  });
}

TEST_CASE("EventLoop::watch_completions on a SharedCq: batches tagged with their connections; the registration "
          "holds the queue", "[shared-cq][loop]") {
  fake::FakeProvider fake;
  {
    OnSharedCq s(fake);
    const MrLocal& mr = s.mr;
    Conn a = connected(fake, s.peer, s.cfg);
    Conn b = connected(fake, s.peer, s.cfg);
    EventLoop loop = make_loop();
    std::vector<std::pair<std::uint64_t, ConnId>> seen;
    std::vector<Error> errors;
    Registration reg = registered(loop.watch_completions(
        s.shared, [&](expected<std::span<const ibv_wc>> batch, std::span<const ConnId> conns) {
          if (!batch) {
            errors.push_back(batch.error());
            CHECK(conns.empty());
            return;
          }
          REQUIRE(conns.size() == batch->size());
          for (std::size_t i = 0; i < batch->size(); ++i) seen.emplace_back((*batch)[i].wr_id, conns[i]);
        }));
    const ConnId a_id = *a.id(), b_id = *b.id();
    REQUIRE(std::move(s.shared).close());  // the registration holds the queue
    send_completed(fake, a, mr, 1);
    send_completed(fake, b, mr, 2);
    REQUIRE(run_until(loop, [&] { return seen.size() == 2; }));
    CHECK(seen == std::vector<std::pair<std::uint64_t, ConnId>>{{1, a_id}, {2, b_id}});
    // 20 at once: more than a batch, in order, tagged
    for (std::uint64_t i = 0; i < 20; ++i) send_completed(fake, i % 2 ? a : b, mr, 100 + i);
    REQUIRE(run_until(loop, [&] { return seen.size() == 22; }));
    for (std::uint64_t i = 0; i < 20; ++i) CHECK(seen[2 + i] == std::make_pair(100 + i, i % 2 ? a_id : b_id));
    // a failed ibv_get_cq_event is passed on, without tags
    fake.fail("ibv_get_cq_event", kErr);
    send_completed(fake, a, mr, 200);
    REQUIRE(run_until(loop, [&] { return !errors.empty() && seen.size() == 23; }));
    check_injected(errors[0], "ibv_get_cq_event", kErr);
    CHECK(seen.back() == std::make_pair(std::uint64_t{200}, a_id));
    CHECK(errors.size() == 1);
  }
  fake.expect_clean();
}

TEST_CASE("co_await loop.completions on a SharedCq: tagged, also when the handle went while waiting",
          "[shared-cq][loop][task]") {
  fake::FakeProvider fake;
  {
    OnSharedCq s(fake);
    const MrLocal& mr = s.mr;
    Conn a = connected(fake, s.peer, s.cfg);
    EventLoop loop = make_loop();
    ibv_wc wc[4]{};
    ConnId tags[4]{};
    Outcome<expected<std::span<ibv_wc>>> out;
    REQUIRE(spawn(loop, await_once([&] { return loop.completions(s.shared, wc, tags); }, out)));
    REQUIRE(loop.run_once(std::chrono::milliseconds(0)));
    REQUIRE(out.suspended());
    REQUIRE(std::move(s.shared).close());
    send_completed(fake, a, mr, 7);
    REQUIRE(run_until(loop, [&] { return out.resumed > 0; }));
    REQUIRE(*out.result);
    REQUIRE((*out.result)->size() == 1);
    CHECK(wc[0].wr_id == 7);
    CHECK(tags[0] == *a.id());

    // what it refuses: too few tags, an empty SharedCq, a queue without a channel
    SharedCq polled_only = *SharedCq::create(s.peer, SharedCqConfig{8, false, 0});
    SharedCq empty;
    for (auto make : std::vector<std::function<detail::SharedCompletionAwaiter()>>{
             [&] { return loop.completions(polled_only, wc, tags); },
             [&] { return loop.completions(empty, wc, tags); },
             [&] { return loop.completions(polled_only, wc, std::span(tags, 1)); }}) {
      Outcome<expected<std::span<ibv_wc>>> refused;
      REQUIRE(spawn(loop, await_once(make, refused)));
      REQUIRE(run_until(loop, [&] { return refused.resumed > 0; }));
      REQUIRE_FALSE(*refused.result);
      check_inval(refused.result->error(), "EventLoop::completions");
    }
    check_inval(loop.watch_completions(polled_only, [](auto, auto) {}).error(), "EventLoop::watch_completions",
                "no completion channel");
    check_inval(loop.watch_completions(empty, [](auto, auto) {}).error(), "EventLoop::watch_completions", "empty");
  }
  fake.expect_clean();
}

}  // namespace shared_cq_test
