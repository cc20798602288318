// Conn: next_event (three variants) and its event mapping, disconnect, close.
#include "data_util.hpp"
#include "test_util.hpp"

#include <algorithm>

namespace conn_test {

using namespace test;
using namespace std::chrono_literals;

namespace {
enum class Variant { blocking, non_blocking, timeout };

expected<ConnEvent> next(Conn& conn, Variant v) {
  switch (v) {
    case Variant::blocking: return conn.next_event();
    case Variant::non_blocking: return conn.try_next_event();
    case Variant::timeout: return conn.next_event_for(20ms);
  }
  return conn.next_event();
}

}  // namespace

TEST_CASE("Conn::next_event maps every CM event", "[conn]") {
  struct Case {
    rdma_cm_event_type type;
    std::optional<ConnEvent> event;
  };
  const Case cases[] = {
      {RDMA_CM_EVENT_ESTABLISHED, ConnEvent::established},
      {RDMA_CM_EVENT_DISCONNECTED, ConnEvent::closed},
      {RDMA_CM_EVENT_TIMEWAIT_EXIT, ConnEvent::closed},
      {RDMA_CM_EVENT_CONNECT_ERROR, ConnEvent::lost},
      {RDMA_CM_EVENT_DEVICE_REMOVAL, ConnEvent::lost},
      {RDMA_CM_EVENT_REJECTED, ConnEvent::rejected},
      {RDMA_CM_EVENT_UNREACHABLE, ConnEvent::unreachable},
      {RDMA_CM_EVENT_ADDR_RESOLVED, std::nullopt},
      {RDMA_CM_EVENT_ADDR_ERROR, std::nullopt},
      {RDMA_CM_EVENT_ROUTE_RESOLVED, std::nullopt},
      {RDMA_CM_EVENT_ROUTE_ERROR, std::nullopt},
      {RDMA_CM_EVENT_CONNECT_REQUEST, std::nullopt},
      {RDMA_CM_EVENT_CONNECT_RESPONSE, std::nullopt},
      {RDMA_CM_EVENT_MULTICAST_JOIN, std::nullopt},
      {RDMA_CM_EVENT_MULTICAST_ERROR, std::nullopt},
      {RDMA_CM_EVENT_ADDR_CHANGE, ConnEvent::lost},
  };
  for (const auto& c : cases) {
    for (auto v : {Variant::blocking, Variant::non_blocking, Variant::timeout}) {
      INFO("event " << detail::event_name(c.type) << " variant " << static_cast<int>(v));
      fake::FakeProvider fake;
      {
        Peer peer = open_peer(fake);
        Conn conn = connect_out(peer, "hello");
        fake.inject_event(*conn.fd(), c.type);
        auto ev = next(conn, v);
        CHECK(fake.alive("unacked_event") == 0);  // acknowledged in every case
        if (c.event) {
          REQUIRE(ev);
          CHECK(*ev == *c.event);
        } else {
          REQUIRE_FALSE(ev);
          CHECK(ev.error().code() == errc::unknown);
          CHECK_THAT(ev.error().message(), Catch::Contains(detail::event_name(c.type)));
          // Still usable afterwards.
          fake.inject_event(*conn.fd(), RDMA_CM_EVENT_DISCONNECTED);
          CHECK(*conn.try_next_event() == ConnEvent::closed);
        }
      }
      fake.expect_clean();
    }
  }
}

TEST_CASE("Conn: the accept's and the reject's private data", "[conn]") {
  fake::FakeProvider fake;
  Peer peer = open_peer(fake);
  SECTION("established: the accept's data, padded to 196") {
    Conn conn = connect_out(peer, "hello");
    CHECK(conn.private_data()->empty());
    fake.inject_event(*conn.fd(), RDMA_CM_EVENT_ESTABLISHED, "welcome");
    CHECK(*conn.try_next_event() == ConnEvent::established);
    CHECK(conn.private_data()->size() == 196);
    CHECK(as_text(*conn.private_data()) == "welcome");
    Poisoned small;
    auto r = conn.copy_private_data(small.span().first(100));
    REQUIRE_FALSE(r);
    check_inval(r.error(), "Conn::copy_private_data", "too small");
    CHECK(small.untouched());
    Poisoned big;
    CHECK(*conn.copy_private_data(big.span()) == 196);
    CHECK(as_text(std::span<const std::byte>(big.bytes)) == "welcome");
  }
  SECTION("rejected: the reject's data") {
    Conn conn = connect_out(peer, "hello");
    fake.inject_event(*conn.fd(), RDMA_CM_EVENT_REJECTED, "go away", 28);
    CHECK(*conn.try_next_event() == ConnEvent::rejected);
    CHECK(as_text(*conn.private_data()) == "go away");
    CHECK(conn.private_data()->size() == max_reject_private_data);  // the IB CM's REJ size
  }
  SECTION("accepting side: the request's data stays") {
    Endpoint ep = listen_on(peer, "169.254.77.1");
    auto conn = take_request(fake, ep, {0, "from client", "169.254.77.20", 40001}).connect();
    REQUIRE(conn);
    fake.inject_event(*conn->fd(), RDMA_CM_EVENT_ESTABLISHED);
    CHECK(*conn->try_next_event() == ConnEvent::established);
    CHECK(as_text(*conn->private_data()) == "from client");
    CHECK(*conn->device() == "fake0");
    CHECK(*conn->peer_address() == "169.254.77.20");
    CHECK(*conn->peer_port() == 40001);
  }
  SECTION("accepting side: a request without data shows rdma_cm's 56 zero bytes, and no copy of them is kept") {
    Endpoint ep = listen_on(peer, "169.254.77.1");
    auto none = take_request(fake, ep, {0, "", "169.254.77.20", 40001});
    auto other = take_request(fake, ep, {0, "", "169.254.77.21", 40002});
    auto some = take_request(fake, ep, {0, std::string("a\0b", 3), "169.254.77.22", 40003});
    const auto zeros = *none.private_data();
    REQUIRE(zeros.size() == max_connect_private_data);
    CHECK(std::all_of(zeros.begin(), zeros.end(), [](std::byte b) { return b == std::byte{0}; }));
    CHECK(other.private_data()->data() == zeros.data());  // one block of zeros for every such request
    Poisoned out;
    CHECK(*none.copy_private_data(out.span()) == max_connect_private_data);
    CHECK(std::all_of(out.bytes.begin(), out.bytes.begin() + max_connect_private_data,
                      [](std::byte b) { return b == std::byte{0}; }));
    const auto data = *some.private_data();  // zeros inside data are data
    REQUIRE(data.size() == max_connect_private_data);
    CHECK(data[0] == std::byte{'a'});
    CHECK(data[1] == std::byte{0});
    CHECK(data[2] == std::byte{'b'});
    CHECK(data.data() != zeros.data());
    auto conn = std::move(none).connect();
    REQUIRE(conn);
    CHECK(conn->private_data()->size() == max_connect_private_data);
    CHECK(conn->private_data()->data() == zeros.data());
  }
}

TEST_CASE("issue 8.9: closed is reported once per connection", "[conn][issue8]") {
  const Variant variants[] = {Variant::blocking, Variant::non_blocking, Variant::timeout};
  SECTION("DISCONNECTED then TIMEWAIT_EXIT: one closed, then no_event") {
    for (auto v : variants) {
      INFO("variant " << static_cast<int>(v));
      fake::FakeProvider fake;
      {
        Peer peer = open_peer(fake);
        Conn conn = connect_out(peer, "hello");
        fake.inject_event(*conn.fd(), RDMA_CM_EVENT_DISCONNECTED);
        fake.inject_event(*conn.fd(), RDMA_CM_EVENT_TIMEWAIT_EXIT);
        auto first = next(conn, v);
        REQUIRE(first);
        CHECK(*first == ConnEvent::closed);
        // A bounded or non-blocking call that only finds the second one reports nothing.
        auto second = next(conn, v == Variant::blocking ? Variant::non_blocking : v);
        REQUIRE_FALSE(second);
        CHECK(second.error().code() == errc::no_event);
        CHECK(fake.queued(*conn.fd()) == 0);       // it was taken
        CHECK(fake.alive("unacked_event") == 0);  // and acknowledged
      }
      fake.expect_clean();
    }
  }
  SECTION("TIMEWAIT_EXIT alone: closed once") {
    for (auto v : variants) {
      INFO("variant " << static_cast<int>(v));
      fake::FakeProvider fake;
      {
        Peer peer = open_peer(fake);
        Conn conn = connect_out(peer, "hello");
        fake.inject_event(*conn.fd(), RDMA_CM_EVENT_TIMEWAIT_EXIT);
        auto first = next(conn, v);
        REQUIRE(first);
        CHECK(*first == ConnEvent::closed);
        auto second = conn.try_next_event();
        REQUIRE_FALSE(second);
        CHECK(second.error().code() == errc::no_event);
      }
      fake.expect_clean();
    }
  }
  SECTION("the swallowed event does not hide the next one, even from a blocking call") {
    for (auto v : variants) {
      INFO("variant " << static_cast<int>(v));
      fake::FakeProvider fake;
      {
        Peer peer = open_peer(fake);
        Conn conn = connect_out(peer, "hello");
        fake.inject_event(*conn.fd(), RDMA_CM_EVENT_DISCONNECTED);
        fake.inject_event(*conn.fd(), RDMA_CM_EVENT_TIMEWAIT_EXIT);
        fake.inject_event(*conn.fd(), RDMA_CM_EVENT_DEVICE_REMOVAL);
        CHECK(*next(conn, v) == ConnEvent::closed);
        auto after = next(conn, v);
        REQUIRE(after);
        CHECK(*after == ConnEvent::lost);
        CHECK(fake.alive("unacked_event") == 0);
      }
      fake.expect_clean();
    }
  }
}

TEST_CASE("Conn::next_event: nothing pending is no_event", "[conn]") {
  fake::FakeProvider fake;
  Peer peer = open_peer(fake);
  Conn conn = connect_out(peer, "hello");
  CHECK(conn.try_next_event().error().code() == errc::no_event);
  CHECK(conn.next_event_for(1ms).error().code() == errc::no_event);
  // The fd is non-blocking; an empty read is no_event for try_, the blocking call reads
  // again.
  CHECK(fake.nonblocking(*conn.fd()));
  fake.inject_event(*conn.fd(), RDMA_CM_EVENT_ESTABLISHED);
  fake.fail("rdma_get_cm_event", EAGAIN);
  auto tried = conn.try_next_event();
  REQUIRE_FALSE(tried);
  CHECK(tried.error().code() == errc::no_event);
  CHECK(tried.error().sys_errno() == EAGAIN);
  fake.fail("rdma_get_cm_event", EAGAIN);
  auto blocking = conn.next_event();
  REQUIRE(blocking);
  CHECK(*blocking == ConnEvent::established);
  CHECK(fake.failures().empty());
}

TEST_CASE("Conn::next_event: each provider call fails in turn", "[conn][fail-each]") {
  for (auto v : {Variant::blocking, Variant::non_blocking, Variant::timeout}) {
    // Every waiting variant polls, then reads; try_next_event only reads.
    std::vector<std::string> calls = {"poll", "rdma_get_cm_event", "rdma_ack_cm_event"};
    if (v == Variant::non_blocking) calls.erase(calls.begin());
    for (int err : {kErr, ENOMEM, EAGAIN}) {
      fail_each_call(calls, err, [&](fake::FakeProvider& fake, Probe& probe) {
        Peer peer = open_peer(fake);
        Conn conn = connect_out(peer, "hello");
        fake.inject_event(*conn.fd(), RDMA_CM_EVENT_ESTABLISHED, "accepted");
        probe.begin();
        auto ev = next(conn, v);
        probe.end();
        // An empty read keeps a waiting call waiting: it reads again and takes the event.
        const bool read_again = probe.failing() && probe.injected()->err == EAGAIN &&
                                probe.injected()->call == "rdma_get_cm_event" &&
                                v != Variant::non_blocking;
        if (!probe.failing() || read_again) {
          REQUIRE(ev);
          CHECK(*ev == ConnEvent::established);
          return;
        }
        REQUIRE_FALSE(ev);
        probe.check(ev.error());
        // Nothing published: no private data stored, the Conn works on.
        CHECK(conn.private_data()->empty());
        CHECK(fake.alive("unacked_event") == 0);
        fake.inject_event(*conn.fd(), RDMA_CM_EVENT_DISCONNECTED);
        auto again = next(conn, v);
        REQUIRE(again);
      });
    }
  }
}

TEST_CASE("Conn::disconnect", "[conn][fail-each]") {
  fail_each_call({"rdma_disconnect"}, kErr, [](fake::FakeProvider& fake, Probe& probe) {
    Peer peer = open_peer(fake);
    Conn conn = connect_out(peer, "hello");
    probe.begin();
    auto done = conn.disconnect();
    probe.end();
    CHECK(conn);  // not consumed
    if (!probe.failing()) {
      CHECK(done);
      CHECK(fake.disconnects.size() == 1);
      return;
    }
    REQUIRE_FALSE(done);
    probe.check(done.error());
    CHECK(conn.disconnect());  // still usable
  });
}

// librdmacm's rdma_disconnect moves an iWARP queue pair only to SQD, where siw never
// completes what is queued (measured on siw0: data_path_test [disconnect]); rpmapp moves it to
// the error state, which flushes it as IB's rdma_disconnect does.
TEST_CASE("Conn::disconnect on iWARP flushes queued work with a move to the error state before "
          "rdma_disconnect; each call fails in turn",
          "[conn][iwarp][fail-each]") {
  fail_each_call({"ibv_modify_qp", "rdma_disconnect"}, kErr, [](fake::FakeProvider& fake, Probe& probe) {
    fake.set_caps(0, fake::DeviceCaps::siw());
    Peer peer = open_peer(fake);
    Conn conn = connect_out(peer, "hello");
    ibv_qp* qp = *conn.qp();
    Buffer memory{64};
    MrLocal mr = reg(peer, memory, MrUsage::recv);
    REQUIRE(conn.recv(mr, 0, 64, 0x51));
    REQUIRE(fake.outstanding_recvs(qp) == 1);
    probe.begin();
    auto done = conn.disconnect();
    probe.end();
    CHECK(conn);  // not consumed
    if (probe.check_outcome(done)) {
      // the move to the error state comes first (as librdmacm's on IB)
      CHECK(fake.outstanding_recvs(qp) == (probe.injected()->call == "ibv_modify_qp" ? 1u : 0u));
      CHECK(fake.disconnects.empty());
      REQUIRE(conn.disconnect());  // still usable
    }
    CHECK(fake.disconnects.size() == 1);
    CHECK(fake.outstanding_recvs(qp) == 0);
    std::array<ibv_wc, 2> wc{};
    auto got = conn.cq()->get(wc);
    REQUIRE(got);
    REQUIRE(got->size() == 1);
    CHECK((*got)[0].wr_id == 0x51);
    CHECK((*got)[0].status == IBV_WC_WR_FLUSH_ERR);
  });
}

TEST_CASE("Conn::disconnect on IB leaves the flush to rdma_disconnect (no ibv_modify_qp)", "[conn][iwarp]") {
  fake::FakeProvider fake;
  {
    Peer peer = open_peer(fake);
    Conn conn = connect_out(peer, "hello");
    const auto mark = fake.mark();
    REQUIRE(conn.disconnect());
    CHECK(fake.calls_since(mark) == std::vector<std::string>{"rdma_disconnect"});
  }
  fake.expect_clean();
}

TEST_CASE("Conn::close: each provider call fails in turn", "[conn][fail-each]") {
  for (bool incoming : {true, false}) {
    for (std::uint32_t rcq : {0u, 3u}) {
      const std::vector<std::string> calls = teardown_calls(rcq != 0);
      fail_each_call(calls, kErr, [&](fake::FakeProvider& fake, Probe& probe) {
        Peer peer = open_peer(fake);
        Endpoint ep = listen_on(peer, "169.254.77.1");
        ConnConfig cfg;
        cfg.rcq_size = rcq;
        ConnReq req = incoming ? take_request(fake, ep, {}, cfg) : outgoing(peer, "169.254.77.9", cfg);
        auto conn = std::move(req).connect();
        REQUIRE(conn);
        CHECK(static_cast<bool>(*conn->rcq()) == (rcq != 0));
        CHECK(static_cast<bool>(*conn->cq()));
        CHECK((*conn->qp())->qp_num == *conn->qp_num());
        probe.begin();
        auto done = std::move(*conn).close();
        probe.end();
        CHECK_FALSE(*conn);
        CHECK(fake.alive("cm_id") == 1);  // the listener
        CHECK(fake.rejects.empty());      // an accepted connection is not rejected
        probe.check_outcome(done);
      });
    }
  }
}

TEST_CASE("a moved-from Conn: every call is inval", "[conn][moved]") {
  fake::FakeProvider fake;
  Peer peer = open_peer(fake);
  Conn conn = connect_out(peer, "hello");
  Conn other = std::move(conn);
  const auto mark = fake.mark();
  CHECK_FALSE(conn);
  check_inval(conn.next_event().error(), "Conn::next_event");
  check_inval(conn.try_next_event().error(), "Conn::try_next_event");
  check_inval(conn.next_event_for(1ms).error(), "Conn::next_event_for");
  check_inval(conn.fd().error(), "Conn::fd");
  check_inval(conn.private_data().error(), "Conn::private_data");
  Poisoned buf;
  check_inval(conn.copy_private_data(buf.span()).error(), "Conn::copy_private_data");
  CHECK(buf.untouched());
  check_inval(conn.qp_num().error(), "Conn::qp_num");
  check_inval(conn.qp().error(), "Conn::qp");
  check_inval(conn.cq().error(), "Conn::cq");
  check_inval(conn.rcq().error(), "Conn::rcq");
  check_inval(conn.device().error(), "Conn::device");
  check_inval(conn.peer_address().error(), "Conn::peer_address");
  check_inval(conn.peer_port().error(), "Conn::peer_port");
  check_inval(conn.disconnect().error(), "Conn::disconnect");
  check_inval(std::move(conn).close().error(), "Conn::close");
  CHECK(fake.calls_since(mark).empty());
}

}  // namespace conn_test
