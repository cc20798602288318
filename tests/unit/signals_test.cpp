// Signals: every blocking call retries EINTR (from poll, epoll_wait or the read after it)
// with the time left, and delivers what it was waiting for; a bounded wait still ends at its
// bound. Each case injects one EINTR (a signal caught without SA_RESTART) and checks that it
// was consumed, so a call that stopped going through the provider would fail here.
#include "data_util.hpp"

#include <sys/epoll.h>
#include <unistd.h>

namespace signals_test {

using namespace test;
using namespace std::chrono_literals;

TEST_CASE("signals: Conn::next_event, next_event_for retry EINTR and report the event",
          "[signals]") {
  for (const char* call : {"poll", "rdma_get_cm_event"}) {
    for (bool bounded : {false, true}) {
      INFO(call << (bounded ? " next_event_for" : " next_event"));
      fake::FakeProvider fake;
      {
        Peer peer = open_peer(fake);
        auto conn = outgoing(peer).connect(as_bytes("hi"));
        REQUIRE(conn);
        fake.inject_event(*conn->fd(), RDMA_CM_EVENT_ESTABLISHED, "welcome");
        fake.fail(call, EINTR);
        auto ev = bounded ? conn->next_event_for(1000ms) : conn->next_event();
        CHECK(fake.pending_faults() == 0);  // the signal did arrive
        INFO((ev ? std::string() : ev.error().message()));
        REQUIRE(ev);
        CHECK(*ev == ConnEvent::established);
        CHECK(as_text(*conn->private_data()) == "welcome");
      }
      CHECK(fake.failures().empty());
      fake.expect_clean();
    }
  }
}

TEST_CASE("signals: a bounded wait interrupted by EINTR still lasts its bound, then no_event",
          "[signals]") {
  fake::FakeProvider fake;
  {
    Peer peer = open_peer(fake);
    auto conn = outgoing(peer).connect(as_bytes("hi"));
    REQUIRE(conn);
    fake.fail("poll", EINTR);
    expected<ConnEvent> ev = unexpected(Error(errc::unknown, 0, ""));
    CHECK(timed([&] { ev = conn->next_event_for(100ms); }) >= 100ms);
    CHECK(fake.pending_faults() == 0);
    REQUIRE_FALSE(ev);
    CHECK(ev.error().code() == errc::no_event);  // not EINTR
    CHECK(ev.error().sys_errno() != EINTR);

    Endpoint ep = listen_on(peer, "169.254.77.1");
    fake.fail("poll", EINTR);
    expected<ConnReq> req = unexpected(Error(errc::unknown, 0, ""));
    CHECK(timed([&] { req = ep.next_conn_req_for(100ms); }) >= 100ms);
    CHECK(fake.pending_faults() == 0);
    REQUIRE_FALSE(req);
    CHECK(req.error().code() == errc::no_event);
  }
  fake.expect_clean();
}

TEST_CASE("signals: Endpoint::next_conn_req arriving after the signal is taken", "[signals]") {
  fake::FakeProvider fake;
  {
    Peer peer = open_peer(fake);
    Endpoint ep = listen_on(peer, "169.254.77.1");
    fake.fail("poll", EINTR);
    Later arrives(50ms, [&] {
      fake::Request r;
      r.private_data = "after the signal";
      fake.inject_connect_request(*ep.fd(), r);
    });
    auto req = ep.next_conn_req();
    CHECK(fake.pending_faults() == 0);
    INFO((req ? std::string() : req.error().message()));
    REQUIRE(req);
    CHECK(as_text(*req->private_data()) == "after the signal");
  }
  fake.expect_clean();
}

TEST_CASE("signals: ConnReq::to and PendingConnReq::wait, wait_for retry EINTR", "[signals]") {
  enum class How { to, wait, wait_for };
  for (const char* call : {"poll", "rdma_get_cm_event"}) {
    for (auto how : {How::to, How::wait, How::wait_for}) {
      INFO(call << " variant " << static_cast<int>(how));
      fake::FakeProvider fake;
      {
        Peer peer = open_peer(fake);
        expected<ConnReq> req = unexpected(Error(errc::unknown, 0, ""));
        if (how == How::to) {
          fake.fail(call, EINTR);
          req = ConnReq::to(peer, "169.254.77.9", "7471");
        } else {
          auto pending = ConnReq::start(peer, "169.254.77.9", "7471");
          REQUIRE(pending);
          fake.fail(call, EINTR);
          req = how == How::wait ? std::move(*pending).wait() : std::move(*pending).wait_for(1000ms);
        }
        CHECK(fake.pending_faults() == 0);
        INFO((req ? std::string() : req.error().message()));
        REQUIRE(req);
        CHECK_FALSE(*req->is_incoming());
      }
      fake.expect_clean();
    }
  }
}

TEST_CASE("signals: Peer::from_address retries an interrupted address resolution on a fresh "
          "cm_id (regression: it returned provider/EINTR)",
          "[signals][peer]") {
  fake::FakeProvider fake;
  {
    fake.fail("rdma_resolve_addr", EINTR);
    const auto mark = fake.mark();
    auto remote = Peer::from_address("169.254.77.200", AddressKind::remote);
    CHECK(fake.pending_faults() == 0);
    INFO((remote ? std::string() : remote.error().message()));
    REQUIRE(remote);
    CHECK(*remote->device_name() == "fake0");
    const auto log = fake.calls_since(mark);
    CHECK(std::count(log.begin(), log.end(), "rdma_resolve_addr") == 2);
    CHECK(std::count(log.begin(), log.end(), "rdma_create_id") == 2);
    CHECK(std::count(log.begin(), log.end(), "rdma_destroy_id") == 2);
    CHECK(fake.alive("cm_id") == 0);

    // Another errno is still returned, once.
    fake.fail("rdma_resolve_addr", kErr);
    auto failed = Peer::from_address("169.254.77.200", AddressKind::remote);
    REQUIRE_FALSE(failed);
    check_injected(failed.error(), "rdma_resolve_addr", kErr);
    CHECK(fake.alive("cm_id") == 0);
  }
  fake.expect_clean();
}

TEST_CASE("signals: Cq::wait_for, next, next_for retry EINTR and deliver the completion",
          "[signals][cq]") {
  for (const char* call : {"poll", "ibv_get_cq_event"}) {
    for (int variant = 0; variant < 3; ++variant) {
      INFO(call << " variant " << variant);
      fake::FakeProvider fake;
      {
        Peer peer = open_peer(fake);
        Conn conn = connected(fake, peer);
        Cq cq = *conn.cq();
        ibv_cq* raw = *cq.native();
        fake.fail(call, EINTR);
        ibv_wc out[1];
        out[0].wr_id = 0xAAAA;
        bool ok = false;
        {
          // After the wait has started: next/next_for poll the queue first.
          Later arrives(50ms, [&] { fake.add_completion(raw, completion(5)); });
          if (variant == 0) {
            auto waited = cq.wait_for(1000ms);
            INFO((waited ? std::string() : waited.error().message()));
            ok = waited.has_value();
          } else {
            auto got = variant == 1 ? cq.next(out) : cq.next_for(out, 1000ms);
            INFO((got ? std::string() : got.error().message()));
            ok = got && got->size() == 1;
          }
        }
        CHECK(ok);
        CHECK(fake.pending_faults() == 0);
        if (variant == 0) REQUIRE(cq.get(out));
        CHECK(out[0].wr_id == 5);
      }
      fake.expect_clean();
    }
  }
}

TEST_CASE("signals: Conn::wait_completion, wait_completion_for retry EINTR", "[signals][cq]") {
  for (const char* call : {"poll", "ibv_get_cq_event"}) {
    for (bool bounded : {false, true}) {
      INFO(call << (bounded ? " wait_completion_for" : " wait_completion"));
      fake::FakeProvider fake;
      {
        ConnConfig cfg;
        cfg.rcq_size = 5;
        cfg.shared_completion_channel = true;
        Peer peer = open_peer(fake);
        Conn conn = connected(fake, peer, cfg);
        Cq rcq = *conn.rcq();
        fake.add_completion(*rcq.native(), completion(6));
        fake.fail(call, EINTR);
        auto fired = bounded ? conn.wait_completion_for(1000ms) : conn.wait_completion();
        CHECK(fake.pending_faults() == 0);
        INFO((fired ? std::string() : fired.error().message()));
        REQUIRE(fired);
        CHECK(*fired == rcq);
      }
      fake.expect_clean();
    }
  }
}

TEST_CASE("signals: EventLoop::run_once, run_for retry EINTR from epoll_wait; a handler gets "
          "its event",
          "[signals][event_loop]") {
  for (bool run_for : {false, true}) {
    INFO((run_for ? "run_for" : "run_once"));
    fake::FakeProvider fake;
    {
      Peer peer = open_peer(fake);
      auto conn = outgoing(peer).connect(as_bytes("hi"));
      REQUIRE(conn);
      auto loop = EventLoop::create();
      REQUIRE(loop);
      std::vector<ConnEvent> got;
      auto reg = loop->watch(*conn, [&](expected<ConnEvent> ev) {
        REQUIRE(ev);
        got.push_back(*ev);
      });
      REQUIRE(reg);
      fake.inject_event(*conn->fd(), RDMA_CM_EVENT_ESTABLISHED);
      fake.fail("epoll_wait", EINTR);
      if (run_for) {
        REQUIRE(loop->run_for(100ms));
      } else {
        auto ran = loop->run_once(1000ms);
        INFO((ran ? std::string() : ran.error().message()));
        REQUIRE(ran);
        CHECK(*ran == 1);
      }
      CHECK(fake.pending_faults() == 0);
      CHECK(got == std::vector<ConnEvent>{ConnEvent::established});
    }
    fake.expect_clean();
  }
}

}  // namespace signals_test
