// Waiting for events: every channel is read non-blocking, so that try_* and *_for calls
// and the listener's drain never block past their bound, and signals do not end a wait.
// The fake blocks a read of an empty blocking channel (a watchdog turns the hang into a
// recorded failure), so each test here would hang in production if it failed.
#include "test_util.hpp"

#include <chrono>
#include <thread>

namespace waits_test {

using namespace test;
using namespace std::chrono_literals;
using clock_type = std::chrono::steady_clock;

namespace {

constexpr auto watchdog = 1000ms;  // the fake's: a wait that long is a hang

fake::Request request(const char* text, std::uint16_t port = 40001) {
  return {0, text, "169.254.77.20", port};
}


}  // namespace

TEST_CASE("issue 8.2: every event channel rpmapp creates is non-blocking", "[waits]") {
  fake::FakeProvider fake;
  {
    Peer peer = open_peer(fake);
    Endpoint ep = listen_on(peer, "");
    CHECK(fake.nonblocking(*ep.fd()));
    auto incoming = take_request(fake, ep, request("in")).connect();
    REQUIRE(incoming);
    CHECK(fake.nonblocking(*incoming->fd()));
    fake.auto_resolve = false;
    auto pending = ConnReq::start(peer, "169.254.77.9", "7471");
    REQUIRE(pending);
    CHECK(fake.nonblocking(*pending->fd()));
    fake.deliver_held();
    fake.auto_resolve = true;
    auto out = std::move(*pending).wait_for(1s);
    REQUIRE(out);
    auto conn = std::move(*out).connect();
    REQUIRE(conn);
    CHECK(fake.nonblocking(*conn->fd()));
  }
  fake.expect_clean();
}

TEST_CASE("issue 8.2: readable, then the event is gone: try and bounded waits give no_event "
          "in time, a blocking wait takes the next event",
          "[waits]") {
  fake::FakeProvider fake;
  fake.watchdog = watchdog;
  {
    Peer peer = open_peer(fake);
    Endpoint ep = listen_on(peer, "");
    const int fd = *ep.fd();

    // try_ only reads: another thread that took the request first leaves it an empty read.
    fake.inject_connect_request(fd, request("stolen"));
    fake.fail("rdma_get_cm_event", EAGAIN);
    expected<ConnReq> tried = unexpected(Error(errc::unknown, 0, ""));
    CHECK(timed([&] { tried = ep.try_next_conn_req(); }) < watchdog / 2);
    REQUIRE_FALSE(tried);
    CHECK(tried.error().code() == errc::no_event);
    CHECK(tried.error().sys_errno() == EAGAIN);
    REQUIRE(ep.try_next_conn_req());  // (the fake still had it: take it)

    // Another thread reads the request between our poll and our read.
    fake.inject_connect_request(fd, request("stolen"));
    fake.take_after_poll(fd);
    expected<ConnReq> bounded = unexpected(Error(errc::unknown, 0, ""));
    const auto took = timed([&] { bounded = ep.next_conn_req_for(200ms); });
    REQUIRE_FALSE(bounded);
    CHECK(bounded.error().code() == errc::no_event);
    CHECK(took >= 200ms);
    CHECK(took < watchdog);

    // Within the bound, a later request is still taken; so it is by a blocking wait.
    for (bool blocking : {false, true}) {
      fake.inject_connect_request(fd, request("stolen"));
      fake.take_after_poll(fd);
      Later inject(50ms, [&] { fake.inject_connect_request(fd, request("later", 40002)); });
      auto req = blocking ? ep.next_conn_req() : ep.next_conn_req_for(2 * watchdog);
      REQUIRE(req);
      CHECK(as_text(*req->private_data()) == "later");
    }
    CHECK(fake.taken_after_poll() == 3);

    // The same for a connection's and an outgoing request's channel.
    Conn conn = connect_out(peer, "hello");
    fake.inject_event(*conn.fd(), RDMA_CM_EVENT_ESTABLISHED);
    fake.take_after_poll(*conn.fd());
    auto ev = conn.next_event_for(100ms);
    REQUIRE_FALSE(ev);
    CHECK(ev.error().code() == errc::no_event);

    fake.auto_resolve = false;
    auto pending = ConnReq::start(peer, "169.254.77.9", "7471");
    REQUIRE(pending);
    fake.deliver_held();  // ADDR_RESOLVED, taken by "another thread"
    fake.take_after_poll(*pending->fd());
    auto resolved = std::move(*pending).try_wait();
    REQUIRE_FALSE(resolved);
    CHECK(resolved.error().code() == errc::no_event);
    CHECK(*pending);
  }
  CHECK(fake.failures().empty());  // in particular: no read blocked
}

TEST_CASE("issue 8.2: two threads on two listen_shared handles, one request: one takes it, "
          "the other gets no_event within its bound",
          "[waits][threads]") {
  fake::FakeProvider fake;
  fake.watchdog = watchdog;
  {
    Peer peer = open_peer(fake);
    auto a = Endpoint::listen_shared(peer, "169.254.77.1", "7471");
    auto b = Endpoint::listen_shared(peer, "169.254.77.1", "7471");
    REQUIRE(a);
    REQUIRE(b);
    REQUIRE(*a->fd() == *b->fd());
    const int fd = *a->fd();
    for (int round = 0; round < 3; ++round) {
      INFO("round " << round);
      fake.rendezvous_polls(fd, 2);  // one request wakes both threads
      fake.inject_connect_request(fd, request("one"));
      struct Result {
        std::optional<expected<ConnReq>> req;
        clock_type::duration took{};
      };
      Result ra, rb;
      auto run = [](Endpoint& ep, Result& r) {
        const auto start = clock_type::now();
        r.req.emplace(ep.next_conn_req_for(300ms));
        r.took = clock_type::now() - start;
      };
      {
        std::thread ta(run, std::ref(*a), std::ref(ra));
        std::thread tb(run, std::ref(*b), std::ref(rb));
        ta.join();
        tb.join();
      }
      // Catch2 v2 assertions are not thread-safe: check here, in the main thread.
      REQUIRE(ra.req.has_value());
      REQUIRE(rb.req.has_value());
      const bool a_won = ra.req->has_value();
      const bool b_won = rb.req->has_value();
      CHECK(a_won != b_won);
      auto& loser = a_won ? rb : ra;
      REQUIRE_FALSE(loser.req->has_value());
      CHECK(loser.req->error().code() == errc::no_event);
      CHECK(loser.took < watchdog);
      auto& winner = a_won ? ra : rb;
      if (winner.req->has_value()) CHECK(as_text(*(*winner.req)->private_data()) == "one");
    }
  }
  CHECK(fake.failures().empty());
  fake.expect_clean();
}

TEST_CASE("issue 8.2: an event librdmacm consumes itself: try and bounded waits give no_event "
          "in time, a blocking wait takes the next event",
          "[waits]") {
  fake::FakeProvider fake;
  fake.watchdog = watchdog;
  {
    Peer peer = open_peer(fake);
    Endpoint ep = listen_on(peer, "");
    const int fd = *ep.fd();

    fake.inject_internal_event(fd);
    expected<ConnReq> tried = unexpected(Error(errc::unknown, 0, ""));
    CHECK(timed([&] { tried = ep.try_next_conn_req(); }) < watchdog / 2);
    REQUIRE_FALSE(tried);
    CHECK(tried.error().code() == errc::no_event);

    fake.inject_internal_event(fd);
    expected<ConnReq> bounded = unexpected(Error(errc::unknown, 0, ""));
    const auto took = timed([&] { bounded = ep.next_conn_req_for(200ms); });
    REQUIRE_FALSE(bounded);
    CHECK(bounded.error().code() == errc::no_event);
    CHECK(took >= 200ms);
    CHECK(took < watchdog);

    for (bool blocking : {false, true}) {
      fake.inject_internal_event(fd);
      Later inject(50ms, [&] { fake.inject_connect_request(fd, request("later")); });
      auto req = blocking ? ep.next_conn_req() : ep.next_conn_req_for(2 * watchdog);
      REQUIRE(req);
      CHECK(as_text(*req->private_data()) == "later");
    }

    Conn conn = connect_out(peer, "hello");
    fake.inject_internal_event(*conn.fd());
    auto ev = conn.try_next_event();
    REQUIRE_FALSE(ev);
    CHECK(ev.error().code() == errc::no_event);
    fake.inject_internal_event(*conn.fd());
    Later established(50ms, [&] { fake.inject_event(*conn.fd(), RDMA_CM_EVENT_ESTABLISHED); });
    auto next = conn.next_event();
    REQUIRE(next);
    CHECK(*next == ConnEvent::established);
  }
  CHECK(fake.failures().empty());
  fake.expect_clean();
}

TEST_CASE("issue 8.2: shutdown and ~Endpoint with queued requests never block, and reject, "
          "acknowledge and destroy them",
          "[waits]") {
  enum class Race { consumed_inside, taken_by_another };
  for (bool destructor : {false, true}) {
    for (auto race : {Race::consumed_inside, Race::taken_by_another}) {
      INFO("destructor " << destructor << " race " << static_cast<int>(race));
      fake::FakeProvider fake;
      fake.watchdog = watchdog;
      {
        Peer peer = open_peer(fake);
        std::optional<Endpoint> ep(listen_on(peer, "169.254.77.1"));
        const int fd = *ep->fd();
        fake.inject_connect_request(fd, request("one", 40001));
        if (race == Race::consumed_inside) {  // read after the two requests
          fake.inject_connect_request(fd, request("two", 40002));
          fake.inject_internal_event(fd);
        } else {
          // The request goes to "another thread": the drain's read finds nothing, and the
          // kernel cleans up the request when the listener goes.
          fake.fail("rdma_get_cm_event", EAGAIN);
        }
        const auto took = timed([&] {
          if (destructor) ep.reset();
          else CHECK(std::move(*ep).shutdown());
        });
        CHECK(took < watchdog / 2);
        CHECK(fake.rejects.size() == (race == Race::consumed_inside ? 2u : 0u));
        CHECK(fake.queued(fd) == 0);
        CHECK(fake.alive("unacked_event") == 0);
      }
      CHECK(fake.failures().empty());
      fake.expect_clean();
    }
  }
}

TEST_CASE("issue 8.2: EINTR from poll or from rdma_get_cm_event is retried, the request "
          "still taken",
          "[waits]") {
  enum class Variant { blocking, non_blocking, timeout };
  for (const char* call : {"poll", "rdma_get_cm_event"}) {
    for (auto v : {Variant::blocking, Variant::non_blocking, Variant::timeout}) {
      INFO(call << " variant " << static_cast<int>(v));
      fake::FakeProvider fake;
      fake.watchdog = watchdog;
      {
        Peer peer = open_peer(fake);
        Endpoint ep = listen_on(peer, "169.254.77.1");
        fake.inject_connect_request(*ep.fd(), request("signalled"));
        // try_next_conn_req and the listener's drain only read: no poll to interrupt.
        const bool reads_only = v == Variant::non_blocking;
        const bool polls = std::string_view(call) != "poll";
        if (!reads_only || polls) fake.fail(call, EINTR);
        auto req = v == Variant::blocking       ? ep.next_conn_req()
                   : v == Variant::non_blocking ? ep.try_next_conn_req()
                                                : ep.next_conn_req_for(500ms);
        CHECK(fake.pending_faults() == 0);  // the signal did arrive
        INFO((req ? std::string() : req.error().message()));
        REQUIRE(req);
        CHECK(as_text(*req->private_data()) == "signalled");

        // In the listener's drain too.
        fake.inject_connect_request(*ep.fd(), request("drained"));
        if (polls) fake.fail(call, EINTR);
        CHECK(std::move(ep).shutdown());
        CHECK(fake.pending_faults() == 0);
        CHECK(fake.rejects.size() == 1);
      }
      CHECK(fake.failures().empty());
      fake.expect_clean();
    }
  }
}

TEST_CASE("issue 8.m: negative timeouts return at once, as the try_ calls", "[waits]") {
  fake::FakeProvider fake;
  fake.watchdog = watchdog;
  {
    Peer peer = open_peer(fake);
    Endpoint ep = listen_on(peer, "");
    expected<ConnReq> req = unexpected(Error(errc::unknown, 0, ""));
    CHECK(timed([&] { req = ep.next_conn_req_for(-5ms); }) < watchdog / 2);
    REQUIRE_FALSE(req);
    CHECK(req.error().code() == errc::no_event);

    Conn conn = connect_out(peer, "hello");
    expected<ConnEvent> ev = unexpected(Error(errc::unknown, 0, ""));
    CHECK(timed([&] { ev = conn.next_event_for(-5ms); }) < watchdog / 2);
    REQUIRE_FALSE(ev);
    CHECK(ev.error().code() == errc::no_event);

    fake.auto_resolve = false;
    auto pending = ConnReq::start(peer, "169.254.77.9", "7471");
    REQUIRE(pending);
    expected<ConnReq> out = unexpected(Error(errc::unknown, 0, ""));
    CHECK(timed([&] { out = std::move(*pending).wait_for(-5ms); }) < watchdog / 2);
    REQUIRE_FALSE(out);
    CHECK(out.error().code() == errc::no_event);
    CHECK(*pending);
  }
  CHECK(fake.failures().empty());
  fake.expect_clean();
}

TEST_CASE("issue 8.2: fcntl failing on each channel is a provider error naming fcntl, and "
          "nothing leaks",
          "[waits]") {
  {  // the one F_SETFL O_NONBLOCK of each new channel
    const int nth = 1;
    fake::FakeProvider fake;
    {
      Peer peer = open_peer(fake);
      fake.fail("fcntl", kErr, nth);
      auto ep = Endpoint::listen(peer, "169.254.77.1", "7471");
      REQUIRE_FALSE(ep);
      check_injected(ep.error(), "fcntl", kErr);
      CHECK(fake.alive("event_channel") == 0);

      Endpoint good = listen_on(peer, "169.254.77.1");
      fake.inject_connect_request(*good.fd(), request("refused"));
      fake.fail("fcntl", kErr, nth);
      auto req = good.try_next_conn_req();
      REQUIRE_FALSE(req);
      check_injected(req.error(), "fcntl", kErr);
      CHECK(fake.rejects.size() == 1);  // the request is rejected
      CHECK(fake.alive("event_channel") == 1);

      fake.fail("fcntl", kErr, nth);
      auto out = ConnReq::start(peer, "169.254.77.9", "7471");
      REQUIRE_FALSE(out);
      check_injected(out.error(), "fcntl", kErr);
      CHECK(fake.alive("event_channel") == 1);
      CHECK(fake.pending_faults() == 0);
    }
    fake.expect_clean();
  }
}

}  // namespace waits_test
