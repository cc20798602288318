// SharedEventChannel: one rdma_cm event channel for many connections. Creation and its
// failures; accepted and outgoing requests on it (no channel of their own, one
// rdma_migrate_id per accepted request); events routed by id, in order, to the blocking
// calls, event loop handlers and coroutines; a released connection's untaken events
// acknowledged; the configurations and calls it refuses.
#include "loop_util.hpp"

#include <rpmapp/shared_event_channel.hpp>

#include <string>
#include <vector>

namespace shared_events_test {

using namespace test;
using namespace std::chrono_literals;

/// A Peer, a listener on it, a SharedEventChannel and a ConnConfig for connections on it.
struct OnSharedChannel {
  explicit OnSharedChannel(fake::FakeProvider& fake) : peer(open_peer(fake)), ep(listen_on(peer, "169.254.77.1")) {
    auto made = SharedEventChannel::create();
    REQUIRE(made);
    channel = std::move(*made);
    cfg.shared_event_channel = &channel;
  }
  /// Takes an injected request and accepts it (no event yet).
  Conn accept(fake::FakeProvider& fake) {
    auto conn = take_request(fake, ep, {}, cfg).connect();
    INFO((conn ? std::string() : conn.error().message()));
    REQUIRE(conn);
    return std::move(*conn);
  }
  Peer peer;
  Endpoint ep;
  SharedEventChannel channel;
  ConnConfig cfg;
};

/// The event a blocking next_event gives `conn` now (no_event when none).
expected<ConnEvent> event_now(Conn& conn) { return conn.try_next_event(); }

TEST_CASE("SharedEventChannel::create: a non-blocking channel; empty handles; bad configs", "[shared-events]") {
  fake::FakeProvider fake;
  {
    auto mark = fake.mark();
    auto channel = SharedEventChannel::create();
    REQUIRE(channel);
    CHECK(fake.calls_since(mark) == std::vector<std::string>{"rdma_create_event_channel", "fcntl"});
    CHECK(fake.nonblocking(*channel->fd()));
    CHECK(*channel->connections() == 0);

    Peer peer = open_peer(fake);
    ConnConfig cfg;
    SharedEventChannel empty;
    cfg.shared_event_channel = &empty;
    check_inval(ConnReq::to(peer, "169.254.77.9", "7471", cfg).error(), "ConnReq::to", "empty SharedEventChannel");
    cfg.shared_event_channel = &*channel;
    cfg.reuse_event_channel = true;
    check_inval(ConnReq::to(peer, "169.254.77.9", "7471", cfg).error(), "ConnReq::to", "reuse_event_channel");

    SharedEventChannel moved = std::move(*channel);
    check_inval(channel->fd().error(), "SharedEventChannel::fd");
    check_inval(channel->connections().error(), "SharedEventChannel::connections");
    check_inval(std::move(*channel).close().error(), "SharedEventChannel::close");
    REQUIRE(std::move(moved).close());
    CHECK(fake.alive("event_channel") == 0);
  }
  fake.expect_clean();
}

TEST_CASE("SharedEventChannel::create: each provider call fails in turn", "[shared-events][fail-each]") {
  for (int err : {kErr, EMFILE}) {
    fail_each_call({"rdma_create_event_channel", "fcntl"}, err, [](fake::FakeProvider& fake, Probe& probe) {
      probe.begin();
      auto channel = SharedEventChannel::create();
      probe.end();
      if (!probe.check_outcome(channel)) return;
      CHECK(fake.alive("event_channel") == 0);
    });
  }
}

TEST_CASE("shared event channel: accepted requests open no channel, move there, and get their own events",
          "[shared-events]") {
  fake::FakeProvider fake;
  {
    OnSharedChannel s(fake);
    fake.inject_connect_request(*s.ep.fd(), {});
    auto mark = fake.mark();
    auto request = s.ep.next_conn_req(s.cfg);
    REQUIRE(request);
    // next_conn_req's calls without the channel's creation: the id moves to the shared one
    std::vector<std::string> calls = next_conn_req_calls;
    std::erase_if(calls, [](const std::string& c) { return c == "rdma_create_event_channel" || c == "fcntl"; });
    CHECK(fake.calls_since(mark) == calls);
    CHECK(*s.channel.connections() == 1);
    auto a = std::move(*request).connect();
    REQUIRE(a);
    Conn b = s.accept(fake);
    Conn c = s.accept(fake);
    CHECK(*s.channel.connections() == 3);
    CHECK(fake.alive("event_channel") == 2);  // the listener's and the shared one
    check_inval(a->fd().error(), "Conn::fd", "shared event channel");

    // Each gets its own events, in order, whoever reads the channel.
    fake.inject_event_on_qp(*c.qp_num(), RDMA_CM_EVENT_ESTABLISHED);
    fake.inject_event_on_qp(*b.qp_num(), RDMA_CM_EVENT_ESTABLISHED);
    fake.inject_event_on_qp(*c.qp_num(), RDMA_CM_EVENT_DISCONNECTED);
    CHECK(event_now(*a).error().code() == errc::no_event);  // read all three, none is a's
    CHECK(fake.queued(*s.channel.fd()) == 0);
    CHECK(*event_now(b) == ConnEvent::established);
    CHECK(*event_now(c) == ConnEvent::established);
    CHECK(*event_now(c) == ConnEvent::closed);
    CHECK(event_now(c).error().code() == errc::no_event);
    CHECK(event_now(b).error().code() == errc::no_event);

    // A released connection's untaken events are acknowledged at its release; one that
    // comes for it later (its id is gone: the kernel drops them) cannot reach another.
    fake.inject_event_on_qp(*b.qp_num(), RDMA_CM_EVENT_DISCONNECTED);
    CHECK(event_now(*a).error().code() == errc::no_event);  // routed to b's inbox
    REQUIRE(std::move(b).close());
    CHECK(*s.channel.connections() == 2);
    fake.inject_event_on_qp(*a->qp_num(), RDMA_CM_EVENT_ESTABLISHED);
    CHECK(*event_now(*a) == ConnEvent::established);

    // The handle may go first: the connections keep the channel.
    REQUIRE(std::move(s.channel).close());
    CHECK(fake.alive("event_channel") == 2);
    fake.inject_event_on_qp(*c.qp_num(), RDMA_CM_EVENT_TIMEWAIT_EXIT);
    CHECK(event_now(c).error().code() == errc::no_event);  // the second end: not reported
    REQUIRE(std::move(c).close());
    REQUIRE(std::move(*a).close());
    CHECK(fake.alive("event_channel") == 1);
  }
  fake.expect_clean();
}

TEST_CASE("shared event channel: outgoing requests resolve through it, interleaved", "[shared-events]") {
  fake::FakeProvider fake;
  {
    Peer peer = open_peer(fake);
    auto channel = SharedEventChannel::create();
    REQUIRE(channel);
    ConnConfig cfg;
    cfg.shared_event_channel = &*channel;
    fake.auto_resolve = false;
    auto first = ConnReq::start(peer, "169.254.77.9", "7471", cfg);
    auto second = ConnReq::start(peer, "169.254.77.9", "7472", cfg);
    REQUIRE(first);
    REQUIRE(second);
    CHECK(*channel->connections() == 2);
    CHECK(fake.alive("event_channel") == 1);
    check_inval(first->fd().error(), "PendingConnReq::fd", "SharedEventChannel::fd");
    fake.auto_resolve = true;
    fake.deliver_held();
    // The second waits first: the first's resolution events read meanwhile wait for it.
    auto second_req = std::move(*second).wait();
    REQUIRE(second_req);
    auto first_req = std::move(*first).wait();
    REQUIRE(first_req);
    auto conn = std::move(*first_req).connect();
    REQUIRE(conn);
    fake.inject_event_on_qp(*conn->qp_num(), RDMA_CM_EVENT_REJECTED, "no");
    CHECK(*conn->next_event_for(generous) == ConnEvent::rejected);
    REQUIRE(std::move(*second_req).close());
    CHECK(*channel->connections() == 1);
  }
  fake.expect_clean();
}

TEST_CASE("shared event channel: accepting, a provider call fails in turn", "[shared-events][fail-each]") {
  std::vector<std::string> calls = next_conn_req_calls;
  std::erase_if(calls, [](const std::string& c) { return c == "rdma_create_event_channel" || c == "fcntl"; });
  fail_each_call(calls, kErr, [](fake::FakeProvider& fake, Probe& probe) {
    OnSharedChannel s(fake);
    fake.inject_connect_request(*s.ep.fd(), {});
    probe.begin();
    auto request = s.ep.next_conn_req(s.cfg);
    probe.end();
    if (!probe.check_outcome(request)) return;
    CHECK(*s.channel.connections() == 0);  // nothing routed to a request that failed
    CHECK(fake.alive("cm_id") == 1);       // the listener's
  });
}

TEST_CASE("shared event channel: an event loop reads it once for every connection it watches",
          "[shared-events][event-loop]") {
  fake::FakeProvider fake;
  {
    OnSharedChannel s(fake);
    EventLoop loop = make_loop();
    std::vector<Conn> conns;
    for (int i = 0; i < 3; ++i) conns.push_back(s.accept(fake));
    std::vector<std::string> seen;
    std::vector<Registration> regs;
    auto mark = fake.mark();
    for (int i = 0; i < 3; ++i)
      regs.push_back(registered(loop.watch(conns[i], [&seen, i](expected<ConnEvent> e) {
        seen.push_back(std::to_string(i) + " " + (e ? std::string(to_string(*e)) : e.error().message()));
      })));
    auto ctl = fake.calls_since(mark);
    CHECK(std::count(ctl.begin(), ctl.end(), "epoll_ctl") == 1);  // the shared channel, once

    // A blocking wait outside the loop while it drives the channel: refused (a look from
    // the loop's thread is fine).
    check_inval(conns[1].next_event_for(1ms).error(), "Conn::next_event_for", "driven by an event loop");
    CHECK(event_now(conns[1]).error().code() == errc::no_event);
    // Watching from a second loop while this one drives the channel: refused.
    EventLoop other = make_loop();
    check_inval(other.watch(conns[0], [](expected<ConnEvent>) {}).error(), "EventLoop::watch", "another event loop");
    // Two waiters of one loop on one connection: as a second epoll entry of its fd.
    auto twice = loop.watch(conns[0], [](expected<ConnEvent>) {});
    REQUIRE_FALSE(twice);
    CHECK(twice.error().call() == "epoll_ctl");

    fake.inject_event_on_qp(*conns[2].qp_num(), RDMA_CM_EVENT_ESTABLISHED);
    fake.inject_event_on_qp(*conns[0].qp_num(), RDMA_CM_EVENT_ESTABLISHED);
    fake.inject_event_on_qp(*conns[2].qp_num(), RDMA_CM_EVENT_DISCONNECTED);
    REQUIRE(run_until(loop, [&] { return seen.size() == 3; }));
    settle(loop);
    // each connection's in order (across connections, the loop's order)
    std::erase(seen, "0 established");
    CHECK(seen == std::vector<std::string>{"2 established", "2 closed"});

    // An event routed before the watch began (a blocking call read it) still comes.
    seen.clear();
    regs[1].reset();
    fake.inject_event_on_qp(*conns[1].qp_num(), RDMA_CM_EVENT_ESTABLISHED);
    CHECK(event_now(conns[0]).error().code() == errc::no_event);  // routes 1's to its inbox
    regs[1] = registered(loop.watch(conns[1], [&seen](expected<ConnEvent> e) { seen.push_back(e ? "1 ok" : "1 error"); }));
    REQUIRE(run_until(loop, [&] { return seen.size() == 1; }));

    // The last waiter gone, the channel leaves the epoll set; another loop may drive it then.
    mark = fake.mark();
    regs.clear();
    ctl = fake.calls_since(mark);
    CHECK(std::count(ctl.begin(), ctl.end(), "epoll_ctl") == 1);
    CHECK(registered(other.watch(conns[0], [](expected<ConnEvent>) {})).active());
  }
  fake.expect_clean();
}

TEST_CASE("shared event channel: coroutines await events, resolution and connect on it",
          "[shared-events][event-loop][coroutines]") {
  fake::FakeProvider fake;
  {
    OnSharedChannel s(fake);
    EventLoop loop = make_loop();
    Conn a = s.accept(fake);
    Conn b = s.accept(fake);
    Outcome<expected<ConnEvent>> on_a, on_b;
    REQUIRE(spawn(loop, await_once([&] { return loop.next_event(a, generous); }, on_a)));
    REQUIRE(spawn(loop, await_once([&] { return loop.next_event(b, generous); }, on_b)));
    settle(loop);
    CHECK(on_a.suspended());
    fake.inject_event_on_qp(*b.qp_num(), RDMA_CM_EVENT_DISCONNECTED);
    REQUIRE(run_until(loop, [&] { return on_b.resumed == 1; }));
    CHECK(*on_b.result == ConnEvent::closed);
    CHECK(on_a.suspended());
    fake.inject_event_on_qp(*a.qp_num(), RDMA_CM_EVENT_ESTABLISHED);
    REQUIRE(run_until(loop, [&] { return on_a.resumed == 1; }));
    CHECK(*on_a.result == ConnEvent::established);

    // connect: resolution and ESTABLISHED through the shared channel
    Outcome<expected<Conn>> connected;
    constexpr std::uint32_t out_qp = 9000;
    fake.next_qp_number(out_qp);
    REQUIRE(spawn(loop, await_once([&] { return loop.connect(s.peer, "169.254.77.9", "7471", s.cfg, {}, generous); },
                                   connected)));
    REQUIRE(run_until(loop, [&] { return fake.alive("qp") == 3; }));
    settle(loop);
    CHECK(connected.suspended());
    CHECK(*s.channel.connections() == 3);
    fake.inject_event_on_qp(out_qp, RDMA_CM_EVENT_ESTABLISHED);
    REQUIRE(run_until(loop, [&] { return connected.resumed == 1; }));
    REQUIRE(*connected.result);
    CHECK(*(*connected.result)->qp_num() == out_qp);
  }
  fake.expect_clean();
}

TEST_CASE("shared event channel: the loop's waiters when the loop, the connection or the read goes",
          "[shared-events][event-loop]") {
  fake::FakeProvider fake;
  {
    OnSharedChannel s(fake);
    Conn a = s.accept(fake);
    Conn b = s.accept(fake);
    std::vector<std::string> seen;
    auto record = [&seen](std::string who) {
      return [&seen, who](expected<ConnEvent> e) {
        seen.push_back(who + " " + (e ? std::string(to_string(*e)) : e.error().message()));
      };
    };
    Registration on_a, on_b;
    {
      // The loop goes while it watches both: its registrations become inactive, the
      // channel leaves its epoll set, and the connections are another loop's to drive.
      EventLoop loop = make_loop();
      on_a = registered(loop.watch(a, record("a")));
      on_b = registered(loop.watch(b, record("b")));
    }
    CHECK_FALSE(on_a.active());
    CHECK_FALSE(on_b.active());
    EventLoop loop = make_loop();
    on_a = registered(loop.watch(a, record("a")));

    // A coroutine waiting on a connection that is closed meanwhile resumes with inval.
    Outcome<expected<ConnEvent>> on_closed;
    REQUIRE(spawn(loop, await_once([&] { return loop.next_event(b, generous); }, on_closed)));
    settle(loop);
    REQUIRE(on_closed.suspended());
    REQUIRE(std::move(b).close());
    REQUIRE(run_until(loop, [&] { return on_closed.resumed == 1; }));
    check_inval(on_closed.result->error(), "EventLoop::next_event", "destroyed or closed");

    // The loop's read fails: logged; each waiter reads the channel itself, nothing is lost.
    fake.inject_event_on_qp(*a.qp_num(), RDMA_CM_EVENT_ESTABLISHED);
    fake.fail("rdma_get_cm_event", kErr);
    REQUIRE(run_until(loop, [&] { return seen.size() == 1; }));
    CHECK(fake.pending_faults() == 0);
    CHECK(seen == std::vector<std::string>{"a established"});

    // It fails again when the waiter reads: the waiter's handler gets that failure (a loop
    // that only logged its own failed read would leave its waiters waiting for a channel
    // that may never be read again), then the event.
    fake.inject_event_on_qp(*a.qp_num(), RDMA_CM_EVENT_ESTABLISHED);
    fake.fail("rdma_get_cm_event", kErr, 1);
    fake.fail("rdma_get_cm_event", kErr, 1);  // counted after the first fired: the next read
    REQUIRE(run_until(loop, [&] { return seen.size() == 3; }));
    CHECK(fake.pending_faults() == 0);
    CHECK_THAT(seen[1], Catch::Contains("rdma_get_cm_event"));
    CHECK(seen[2] == "a established");

    // resolve(): an outgoing request's resolution through the shared channel.
    std::optional<expected<ConnReq>> resolved;
    auto pending = ConnReq::start(s.peer, "169.254.77.9", "7471", s.cfg);
    REQUIRE(pending);
    Registration resolving = registered(loop.resolve(std::move(*pending),
                                                     [&](expected<ConnReq> r) { resolved.emplace(std::move(r)); }));
    REQUIRE(run_until(loop, [&] { return resolved.has_value(); }));
    REQUIRE(*resolved);
    CHECK(*s.channel.connections() == 2);
  }
  fake.expect_clean();
}

}  // namespace shared_events_test
