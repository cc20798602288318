// ConnConfig::reuse_event_channel: a released connection's rdma_cm event channel kept by its
// Peer and given to the next connection that asks for one.
#include "test_util.hpp"

#include <algorithm>
#include <thread>

namespace channel_reuse_test {

using namespace test;
using namespace std::chrono_literals;

namespace {
ConnConfig reusing() {
  ConnConfig cfg;
  cfg.reuse_event_channel = true;
  return cfg;
}

bool has(const std::vector<std::string>& calls, std::string_view call) {
  return std::find(calls.begin(), calls.end(), call) != calls.end();
}

Conn connected(expected<Conn> conn) {
  INFO((conn ? std::string() : conn.error().message()));
  REQUIRE(conn);
  return std::move(*conn);
}
}  // namespace

TEST_CASE("reuse_event_channel: an outgoing connection's channel serves the next one",
          "[conn_req][reuse]") {
  fake::FakeProvider fake;
  {
    Peer peer = open_peer(fake);
    Conn first = connected(outgoing(peer, "169.254.77.9", reusing()).connect());
    const int fd = *first.fd();
    auto mark = fake.mark();
    REQUIRE(std::move(first).close());
    CHECK_FALSE(has(fake.calls_since(mark), "rdma_destroy_event_channel"));
    CHECK(fake.alive("event_channel") == 1);  // kept by the Peer
    CHECK(fake.alive("cm_id") == 0);

    mark = fake.mark();
    Conn second = connected(outgoing(peer, "169.254.77.9", reusing()).connect());
    const auto calls = fake.calls_since(mark);
    CHECK_FALSE(has(calls, "rdma_create_event_channel"));
    CHECK_FALSE(has(calls, "fcntl"));
    CHECK(*second.fd() == fd);
    CHECK(fake.nonblocking(fd));
    CHECK(fake.alive("event_channel") == 1);
    // The channel carries the new connection's events.
    fake.inject_event(fd, RDMA_CM_EVENT_ESTABLISHED);
    CHECK(*second.next_event_for(1000ms) == ConnEvent::established);
  }
  fake.expect_clean();  // the spare went with the Peer's last reference
}

TEST_CASE("reuse_event_channel: an incoming request is migrated to a spare channel",
          "[conn_req][reuse]") {
  fake::FakeProvider fake;
  {
    Peer peer = open_peer(fake);
    Endpoint ep = listen_on(peer, "169.254.77.1");
    Conn first = connected(take_request(fake, ep, {}, reusing()).connect());
    const int fd = *first.fd();
    REQUIRE(std::move(first).close());
    auto mark = fake.mark();
    first = connected(take_request(fake, ep, {}, reusing()).connect());
    CHECK_FALSE(has(fake.calls_since(mark), "rdma_create_event_channel"));
    CHECK(*first.fd() == fd);
    mark = fake.mark();
    Conn other = connected(take_request(fake, ep, {}, reusing()).connect());
    auto calls = fake.calls_since(mark);
    CHECK(has(calls, "rdma_create_event_channel"));  // no spare left: the first one is in use
    CHECK(has(calls, "rdma_migrate_id"));
    CHECK(*other.fd() != fd);
    fake.inject_event(fd, RDMA_CM_EVENT_DISCONNECTED);
    CHECK(*first.next_event_for(1000ms) == ConnEvent::closed);
  }
  fake.expect_clean();
}

TEST_CASE("reuse_event_channel: the released connection's unread events are gone",
          "[conn_req][reuse]") {
  fake::FakeProvider fake;
  {
    Peer peer = open_peer(fake);
    Conn first = connected(outgoing(peer, "169.254.77.9", reusing()).connect());
    const int fd = *first.fd();
    fake.inject_event(fd, RDMA_CM_EVENT_ESTABLISHED);  // never read
    fake.inject_event(fd, RDMA_CM_EVENT_DISCONNECTED);
    REQUIRE(std::move(first).close());
    CHECK(fake.queued(fd) == 0);  // rdma_destroy_id dropped them, as the kernel does
    auto pending = ConnReq::start(peer, "169.254.77.9", "7471", reusing());
    REQUIRE(pending);
    CHECK(*pending->fd() == fd);
    auto req = std::move(*pending).wait_for(1000ms);
    REQUIRE(req);
    Conn second = connected(std::move(*req).connect());
    auto none = second.try_next_event();
    REQUIRE_FALSE(none);
    CHECK(none.error().code() == errc::no_event);
  }
  fake.expect_clean();
}

TEST_CASE("reuse_event_channel: without it, or when rdma_destroy_id fails, the channel is closed",
          "[conn_req][reuse]") {
  fake::FakeProvider fake;
  {
    Peer peer = open_peer(fake);
    SECTION("the default closes the channel with the connection") {
      Conn conn = connected(outgoing(peer).connect());
      const auto mark = fake.mark();
      REQUIRE(std::move(conn).close());
      CHECK(has(fake.calls_since(mark), "rdma_destroy_event_channel"));
      CHECK(fake.alive("event_channel") == 0);
    }
    SECTION("a connection without it takes no spare") {
      Conn reused = connected(outgoing(peer, "169.254.77.9", reusing()).connect());
      const int spare = *reused.fd();
      REQUIRE(std::move(reused).close());
      const auto mark = fake.mark();
      Conn plain = connected(outgoing(peer).connect());
      CHECK(has(fake.calls_since(mark), "rdma_create_event_channel"));
      CHECK(*plain.fd() != spare);
      CHECK(fake.alive("event_channel") == 2);
    }
    SECTION("a channel whose cm_id was not destroyed is not kept") {
      Conn conn = connected(outgoing(peer, "169.254.77.9", reusing()).connect());
      fake.fail("rdma_destroy_id", kErr);
      auto closed = std::move(conn).close();
      REQUIRE_FALSE(closed);
      check_injected(closed.error(), "rdma_destroy_id", kErr);
      CHECK(fake.alive("event_channel") == 0);
    }
    SECTION("a request that fails gives its spare back") {
      Conn conn = connected(outgoing(peer, "169.254.77.9", reusing()).connect());
      const int spare = *conn.fd();
      REQUIRE(std::move(conn).close());
      fake.fail("rdma_resolve_addr", kErr);
      auto failed = ConnReq::to(peer, "169.254.77.9", "7471", reusing());
      REQUIRE_FALSE(failed);
      check_injected(failed.error(), "rdma_resolve_addr", kErr);
      CHECK(fake.alive("event_channel") == 1);
      CHECK(fake.alive("cm_id") == 0);
      Conn again = connected(outgoing(peer, "169.254.77.9", reusing()).connect());
      CHECK(*again.fd() == spare);
    }
  }
  fake.expect_clean();
}

TEST_CASE("reuse_event_channel: each provider call of a request on a spare fails in turn",
          "[conn_req][reuse][fail-each]") {
  const std::vector<std::string> calls = {
      "rdma_create_id",   "rdma_resolve_addr",       "poll",             "rdma_get_cm_event", "rdma_resolve_route",     "rdma_ack_cm_event",
      "poll",             "rdma_get_cm_event", "ibv_create_comp_channel", "ibv_create_cq",
      "ibv_req_notify_cq", "rdma_create_qp",  "rdma_ack_cm_event"};
  fail_each_call(calls, kErr, [&](fake::FakeProvider& fake, Probe& probe) {
    Peer peer = open_peer(fake);
    REQUIRE(outgoing(peer, "169.254.77.9", reusing()).close());
    probe.begin();
    auto req = ConnReq::to(peer, "169.254.77.9", "7471", reusing());
    probe.end();
    CHECK(fake.alive("event_channel") == 1);  // in use, or given back after the failure
    if (!probe.check_outcome(req)) return;
    CHECK(fake.alive("cm_id") == 0);
    CHECK(fake.alive("qp") == 0);
  });
}

TEST_CASE("reuse_event_channel: each provider call of a first request fails in turn; only a "
          "finished channel is kept",
          "[conn_req][reuse][fail-each]") {
  const std::vector<std::string> calls = {
      "rdma_create_event_channel", "fcntl",
      "rdma_create_id",    "rdma_resolve_addr",         "poll",
      "rdma_get_cm_event", "rdma_resolve_route",        "rdma_ack_cm_event", "poll",
      "rdma_get_cm_event", "ibv_create_comp_channel",   "ibv_create_cq",     "ibv_req_notify_cq",
      "rdma_create_qp",    "rdma_ack_cm_event"};
  fail_each_call(calls, kErr, [&](fake::FakeProvider& fake, Probe& probe) {
    Peer peer = open_peer(fake);
    probe.begin();
    auto req = ConnReq::to(peer, "169.254.77.9", "7471", reusing());
    probe.end();
    if (!probe.check_outcome(req)) return;
    // A channel that failed to become non-blocking is closed: kept, a later request's
    // read would block (the fake reports that as a hang).
    const std::string& call = probe.injected()->call;
    const bool made = call != "rdma_create_event_channel" && call != "fcntl";
    CHECK(fake.alive("event_channel") == (made ? 1 : 0));
    CHECK(fake.alive("cm_id") == 0);
    auto again = ConnReq::to(peer, "169.254.77.9", "7471", reusing());
    REQUIRE(again);
    CHECK(fake.alive("event_channel") == 1);
  });
}

TEST_CASE("reuse_event_channel: a Peer keeps at most max_spare_event_channels",
          "[conn_req][reuse]") {
  fake::FakeProvider fake;
  {
    Peer peer = open_peer(fake);
    std::vector<ConnReq> reqs;
    for (std::size_t i = 0; i < Peer::max_spare_event_channels + 3; ++i)
      reqs.push_back(outgoing(peer, "169.254.77.9", reusing()));
    reqs.clear();
    CHECK(fake.alive("event_channel") == static_cast<long>(Peer::max_spare_event_channels));
    CHECK(fake.alive("cm_id") == 0);
  }
  fake.expect_clean();
}

TEST_CASE("reuse_event_channel: connections made and released on several threads",
          "[conn_req][reuse][threads]") {
  fake::FakeProvider fake;
  {
    Peer peer = open_peer(fake);
    std::vector<std::thread> threads;
    for (int t = 0; t < 4; ++t)
      threads.emplace_back([&peer] {
        for (int i = 0; i < 25; ++i) {
          auto req = ConnReq::to(peer, "169.254.77.9", "7471", reusing());
          if (!req || !std::move(*req).close()) std::abort();
        }
      });
    for (auto& t : threads) t.join();
    CHECK(fake.alive("event_channel") >= 1);
    CHECK(fake.alive("event_channel") <= 4);
  }
  fake.expect_clean();
}

}  // namespace channel_reuse_test
