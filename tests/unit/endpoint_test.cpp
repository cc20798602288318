// Endpoint: listen, next_conn_req (three variants), shutdown, wildcard and devices.
#include "test_util.hpp"

#include <endian.h>

#include <algorithm>
#include <cstring>

namespace endpoint_test {

using namespace test;

namespace {
// fcntl once: each event channel is made O_NONBLOCK (F_SETFL).
const std::vector<std::string> listen_calls = {"rdma_create_event_channel", "fcntl",
                                               "rdma_create_id", "rdma_bind_addr", "rdma_listen"};
const std::vector<std::string>& request_calls = next_conn_req_calls;

enum class Variant { blocking, non_blocking, timeout };

/// `calls` as variant `v` makes them: the waiting ones poll before each read,
/// try_next_conn_req only reads.
std::vector<std::string> calls_of(Variant v, std::vector<std::string> calls) {
  if (v == Variant::non_blocking) std::erase(calls, std::string("poll"));
  return calls;
}

expected<ConnReq> next(Endpoint& ep, Variant v, const ConnConfig& cfg = {}) {
  switch (v) {
    case Variant::blocking: return ep.next_conn_req(cfg);
    case Variant::non_blocking: return ep.try_next_conn_req(cfg);
    case Variant::timeout: return ep.next_conn_req_for(std::chrono::milliseconds(50), cfg);
  }
  return ep.next_conn_req(cfg);
}
}  // namespace

TEST_CASE("Endpoint::listen on a specific address", "[endpoint]") {
  fake::FakeProvider fake;
  {
    Peer peer = open_peer(fake);
    Endpoint ep = listen_on(peer, "169.254.77.1", "7471");
    CHECK(*ep.device() == "fake0");
    CHECK(*ep.port() == 7471);
    CHECK(*ep.local_address() == "169.254.77.1");
    CHECK(*ep.share_count() == 1);
    CHECK(*ep.fd() >= 1000);
    CHECK(fake.alive("event_channel") == 1);
    CHECK(fake.alive("cm_id") == 1);
  }
  fake.expect_clean();
}

TEST_CASE("Endpoint::listen on a wildcard address spans devices", "[endpoint]") {
  fake::FakeProvider fake;
  {
    Peer peer = open_peer(fake);
    for (auto [addr, shown] : {std::pair{"", "::"}, std::pair{"0.0.0.0", "0.0.0.0"},
                               std::pair{"::", "::"}}) {
      INFO("address \"" << addr << "\"");
      Endpoint ep = listen_on(peer, addr, "7471");
      CHECK(*ep.device() == "");
      CHECK(*ep.local_address() == shown);
    }
  }
  fake.expect_clean();
}

TEST_CASE("Endpoint::listen: port 0 is chosen by the CM and read back; service_id", "[endpoint]") {
  fake::FakeProvider fake;
  Peer peer = open_peer(fake);
  Endpoint ep = listen_on(peer, "169.254.77.1", "0");
  const std::uint16_t port = *ep.port();
  CHECK(port != 0);
  CHECK(port >= 50000);  // the fake assigns from 50000
  // The service ID in network byte order: bytes 00 00 00 00 01 06 <port hi> <port lo>.
  const std::uint64_t sid = *ep.service_id();
  unsigned char bytes[8];
  std::memcpy(bytes, &sid, 8);
  const unsigned char want[8] = {0, 0, 0, 0, 0x01, 0x06, static_cast<unsigned char>(port >> 8),
                                 static_cast<unsigned char>(port & 0xff)};
  CHECK(std::memcmp(bytes, want, 8) == 0);
  CHECK(be64toh(sid) == ((std::uint64_t{0x0106} << 16) | port));

  Endpoint fixed = listen_on(peer, "169.254.77.1", "4791");
  CHECK(be64toh(*fixed.service_id()) == 0x010612b7u);
}

TEST_CASE("Endpoint::listen passes the backlog", "[endpoint]") {
  fake::FakeProvider fake;
  Peer peer = open_peer(fake);
  ListenOptions options;
  options.backlog = 5;
  auto ep = Endpoint::listen(peer, "", "7471", options);
  REQUIRE(ep);
  REQUIRE(fake.backlogs.size() == 1);
  CHECK(fake.backlogs[0] == 5);
  auto dflt = Endpoint::listen(peer, "", "7472");
  REQUIRE(dflt);
  CHECK(fake.backlogs[1] == 0);
}

TEST_CASE("Endpoint::listen: each provider call fails in turn", "[endpoint][fail-each]") {
  for (const char* addr : {"169.254.77.1", ""}) {
    for (int err : {kErr, ENOMEM, EADDRINUSE}) {
      fail_each_call(listen_calls, err, [&](fake::FakeProvider& fake, Probe& probe) {
        Peer peer = open_peer(fake);
        probe.begin();
        auto ep = Endpoint::listen(peer, addr, "7471");
        probe.end();
        if (!probe.check_outcome(ep)) return;
        CHECK(fake.alive("cm_id") == 0);
        CHECK(fake.alive("event_channel") == 0);
        // Nothing half-made is left listening: the same port can be listened on again.
        CHECK(Endpoint::listen(peer, addr, "7471"));
      });
    }
  }
}

TEST_CASE("Endpoint::listen: a port in use is a provider error from rdma_bind_addr",
          "[endpoint]") {
  fake::FakeProvider fake;
  Peer peer = open_peer(fake);
  Endpoint first = listen_on(peer, "169.254.77.1", "7471");
  auto second = Endpoint::listen(peer, "", "7471");
  REQUIRE_FALSE(second);
  CHECK(second.error().code() == errc::provider);
  CHECK(second.error().sys_errno() == EADDRINUSE);
  CHECK(second.error().call() == "rdma_bind_addr");
  CHECK(fake.alive("cm_id") == 1);
}

TEST_CASE("Endpoint::listen: bad arguments are inval, before any provider call",
          "[endpoint][inval]") {
  fake::FakeProvider fake;
  Peer peer = open_peer(fake);
  Peer peer0b = open_peer(fake, 0);
  const auto mark = fake.mark();
  for (const char* port : {"", "-1", "65536", "abc", " 80", "80 ", "+80", "0x50", "123456", "8 0"}) {
    INFO("port \"" << port << "\"");
    auto ep = Endpoint::listen(peer, "", port);
    REQUIRE_FALSE(ep);
    check_inval(ep.error(), "Endpoint::listen", "port");
  }
  for (const char* addr : {"abc", "1.2.3.4.5", "300.1.1.1", "169.254.77.1 ", "localhost"}) {
    INFO("address \"" << addr << "\"");
    auto ep = Endpoint::listen(peer, addr, "7471");
    REQUIRE_FALSE(ep);
    check_inval(ep.error(), "Endpoint::listen", "numeric");
  }
  ListenOptions negative;
  negative.backlog = -1;
  auto ep = Endpoint::listen(peer, "", "7471", negative);
  REQUIRE_FALSE(ep);
  check_inval(ep.error(), "Endpoint::listen", "backlog");

  auto none = Endpoint::listen(std::span<const Peer>(), "", "7471");
  REQUIRE_FALSE(none);
  check_inval(none.error(), "Endpoint::listen", "no peer");

  std::vector<Peer> same;
  same.push_back(std::move(peer));
  same.push_back(std::move(peer0b));
  auto twice = Endpoint::listen(same, "", "7471");
  REQUIRE_FALSE(twice);
  check_inval(twice.error(), "Endpoint::listen", "fake0");
  CHECK(fake.calls_since(mark).empty());
}

TEST_CASE("Endpoint::listen: an address of another device is inval naming both",
          "[endpoint][inval]") {
  fake::FakeProvider fake;
  {
    Peer peer = open_peer(fake, 0);
    auto ep = Endpoint::listen(peer, "169.254.78.1", "7471");
    REQUIRE_FALSE(ep);
    check_inval(ep.error(), "Endpoint::listen", "fake1");
    CHECK_THAT(ep.error().message(), Catch::Contains("fake0"));
    CHECK(fake.alive("cm_id") == 0);
    CHECK(fake.alive("event_channel") == 0);
  }
  fake.expect_clean();
}

TEST_CASE("Endpoint::next_conn_req: the three variants take a request", "[endpoint]") {
  for (auto v : {Variant::blocking, Variant::non_blocking, Variant::timeout}) {
    fake::FakeProvider fake;
    {
      Peer peer = open_peer(fake);
      Endpoint ep = listen_on(peer, "169.254.77.1");
      fake.inject_connect_request(*ep.fd(), {0, "hello", "169.254.77.20", 40001});
      const auto mark = fake.mark();
      auto req = next(ep, v);
      REQUIRE(req);
      CHECK(fake.calls_since(mark) == calls_of(v, request_calls));
      CHECK(*req->is_incoming());
      CHECK(*req->device() == "fake0");
      CHECK(*req->peer_address() == "169.254.77.20");
      CHECK(*req->peer_port() == 40001);
      auto data = *req->private_data();
      CHECK(data.size() == 56);  // rdma_cm pads
      CHECK(as_text(data) == "hello");
      CHECK(*req->qp_num() >= 100);
      CHECK(fake.queued(*ep.fd()) == 0);
      CHECK(fake.alive("unacked_event") == 0);
      // The request's id moved to a channel of its own.
      CHECK(fake.alive("event_channel") == 2);
    }
    CHECK(fake.rejects.size() == 1);  // dropped: rejected
    fake.expect_clean();
  }
}

TEST_CASE("Endpoint::next_conn_req: nothing pending is no_event", "[endpoint]") {
  fake::FakeProvider fake;
  Peer peer = open_peer(fake);
  Endpoint ep = listen_on(peer, "");
  auto a = ep.try_next_conn_req();
  REQUIRE_FALSE(a);
  CHECK(a.error().code() == errc::no_event);
  auto b = ep.next_conn_req_for(std::chrono::milliseconds(1));
  REQUIRE_FALSE(b);
  CHECK(b.error().code() == errc::no_event);
  // The fd is non-blocking whatever the call; an empty read (EAGAIN, or ENODATA as
  // librpma maps it) is no_event for try_, and keeps a blocking call waiting.
  CHECK(fake.nonblocking(*ep.fd()));
  fake.inject_connect_request(*ep.fd(), {});
  for (int empty : {EAGAIN, ENODATA}) {
    fake.fail("rdma_get_cm_event", empty);
    auto c = ep.try_next_conn_req();
    REQUIRE_FALSE(c);
    CHECK(c.error().code() == errc::no_event);
    CHECK(c.error().sys_errno() == empty);
  }
  fake.fail("rdma_get_cm_event", EAGAIN);
  CHECK(ep.next_conn_req());  // read again: the request was there
  CHECK(fake.failures().empty());
}

TEST_CASE("Endpoint::next_conn_req: each provider call fails in turn", "[endpoint][fail-each]") {
  for (auto v : {Variant::blocking, Variant::non_blocking, Variant::timeout}) {
    for (std::uint32_t rcq : {0u, 5u}) {
      ConnConfig cfg;
      cfg.rcq_size = rcq;
      auto calls = request_calls;
      if (rcq != 0) {
        auto at = std::find(calls.begin(), calls.end(), "rdma_create_qp");
        // the receive CQ has its own completion channel unless shared_completion_channel
        calls.insert(at, {"ibv_create_comp_channel", "ibv_create_cq", "ibv_req_notify_cq"});
      }
      for (int err : {kErr, ENOMEM}) {
        fail_each_call(calls_of(v, calls), err, [&](fake::FakeProvider& fake, Probe& probe) {
          Peer peer = open_peer(fake);
          Endpoint ep = listen_on(peer, "169.254.77.1");
          fake.inject_connect_request(*ep.fd(), {0, "first", "169.254.77.20", 40001});
          probe.begin();
          auto req = next(ep, v, cfg);
          probe.end();
          if (!probe.failing()) {
            REQUIRE(req);
            return;
          }
          REQUIRE_FALSE(req);
          probe.check(req.error());
          const bool taken = probe.injected()->call != "poll" &&
                             probe.injected()->call != "rdma_get_cm_event";
          // A request that was taken is rejected (and its id destroyed: expect_clean).
          CHECK(fake.rejects.size() == (taken ? 1u : 0u));
          CHECK(fake.alive("unacked_event") == 0);
          CHECK(fake.alive("qp") == 0);
          // The endpoint still works: the request (if not taken) or a new one arrives.
          if (taken) fake.inject_connect_request(*ep.fd(), {0, "second", "169.254.77.21", 40002});
          auto again = next(ep, v, cfg);
          REQUIRE(again);
          CHECK(as_text(*again->private_data()) == (taken ? "second" : "first"));
        });
      }
    }
  }
}

TEST_CASE("Endpoint::next_conn_req: an unexpected event is inval, acknowledged", "[endpoint]") {
  fake::FakeProvider fake;
  {
    Peer peer = open_peer(fake);
    Endpoint ep = listen_on(peer, "169.254.77.1");
    fake.inject_event(*ep.fd(), RDMA_CM_EVENT_MULTICAST_ERROR);  // DEVICE_REMOVAL: device_removal_test
    auto req = ep.try_next_conn_req();
    REQUIRE_FALSE(req);
    check_inval(req.error(), "Endpoint::try_next_conn_req", "MULTICAST_ERROR");
    CHECK(fake.alive("unacked_event") == 0);
    fake.inject_event(*ep.fd(), RDMA_CM_EVENT_ADDR_CHANGE);
    fake.fail("rdma_ack_cm_event", kErr);
    auto acked = ep.try_next_conn_req();
    REQUIRE_FALSE(acked);
    check_injected(acked.error(), "rdma_ack_cm_event", kErr);
    fake.inject_connect_request(*ep.fd(), {});
    CHECK(ep.try_next_conn_req());  // still works
  }
  fake.expect_clean();
}

TEST_CASE("Endpoint::next_conn_req: a bad config is inval and takes nothing", "[endpoint][inval]") {
  fake::FakeProvider fake;
  Peer peer = open_peer(fake);
  Endpoint ep = listen_on(peer, "");
  fake.inject_connect_request(*ep.fd(), {});
  const auto mark = fake.mark();
  ConnConfig zero_cq;
  zero_cq.cq_size = 0;
  ConnConfig zero_sq;
  zero_sq.sq_size = 0;
  ConnConfig zero_rq;
  zero_rq.rq_size = 0;
  ConnConfig retry;
  retry.retry_count = 8;
  ConnConfig rnr;
  rnr.rnr_retry_count = 8;
  ConnConfig huge;
  huge.cq_size = 0x80000000u;
  ConnConfig huge_rcq;
  huge_rcq.rcq_size = 0x80000000u;
  ConnConfig no_time;
  no_time.timeout = std::chrono::milliseconds(0);
  for (const auto& cfg : {zero_cq, zero_sq, zero_rq, retry, rnr, huge, huge_rcq, no_time}) {
    auto req = ep.next_conn_req(cfg);
    REQUIRE_FALSE(req);
    check_inval(req.error(), "Endpoint::next_conn_req");
  }
  CHECK(fake.calls_since(mark).empty());
  CHECK(fake.queued(*ep.fd()) == 1);
}

TEST_CASE("a wildcard Endpoint serves each request with its device's Peer", "[endpoint]") {
  fake::FakeProvider fake;
  {
    std::vector<Peer> peers = peers_on_both_devices(fake);
    Endpoint ep = listen_wildcard(peers);
    for (int device : {1, 0}) {
      fake.inject_connect_request(*ep.fd(), {device, "x", "169.254.78.20", 40001});
      auto req = ep.next_conn_req();
      REQUIRE(req);
      CHECK(*req->device() == "fake" + std::to_string(device));
      CHECK(fake.qp_pd.at(*req->qp_num()) == *peers[static_cast<std::size_t>(device)].pd());
    }
  }
  fake.expect_clean();
}

TEST_CASE("a request on a device without a Peer is rejected and inval naming the device",
          "[endpoint]") {
  fake::FakeProvider fake;
  {
    Peer peer = open_peer(fake, 0);
    Endpoint ep = listen_on(peer, "");
    fake.inject_connect_request(*ep.fd(), {1, "x", "169.254.78.20", 40001});
    auto req = ep.try_next_conn_req();
    REQUIRE_FALSE(req);
    check_inval(req.error(), "Endpoint::try_next_conn_req", "fake1");
    CHECK(fake.rejects.size() == 1);
    CHECK(fake.alive("cm_id") == 1);  // only the listener
    fake.inject_connect_request(*ep.fd(), {0, "y", "169.254.77.20", 40002});
    CHECK(ep.try_next_conn_req());
  }
  fake.expect_clean();
}

TEST_CASE("Endpoint::shutdown rejects, acknowledges and destroys pending requests",
          "[endpoint]") {
  fake::FakeProvider fake;
  {
    Peer peer = open_peer(fake);
    Endpoint ep = listen_on(peer, "169.254.77.1");
    fake.inject_connect_request(*ep.fd(), {});
    fake.inject_connect_request(*ep.fd(), {});
    CHECK(std::move(ep).shutdown());
    CHECK_FALSE(ep);
    CHECK(fake.rejects.size() == 2);
    CHECK(fake.alive("cm_id") == 0);
    CHECK(fake.alive("event_channel") == 0);
  }
  fake.expect_clean();
}

TEST_CASE("Endpoint::shutdown: each provider call fails in turn", "[endpoint][fail-each]") {
  // The drain only reads (non-blocking) until a read finds nothing.
  const std::vector<std::string> calls = {
      "rdma_get_cm_event", "rdma_reject",       "rdma_ack_cm_event", "rdma_destroy_id",
      "rdma_get_cm_event", "rdma_reject",       "rdma_ack_cm_event", "rdma_destroy_id",
      "rdma_get_cm_event", "rdma_destroy_id",   "rdma_destroy_event_channel"};
  fail_each_call(calls, kErr, [&](fake::FakeProvider& fake, Probe& probe) {
    Peer peer = open_peer(fake);
    Endpoint ep = listen_on(peer, "169.254.77.1");
    fake.inject_connect_request(*ep.fd(), {});
    fake.inject_connect_request(*ep.fd(), {});
    probe.begin();
    auto done = std::move(ep).shutdown();
    probe.end();
    CHECK_FALSE(ep);  // consumed, whatever the result
    CHECK(fake.alive("cm_id") == 0);
    CHECK(fake.alive("event_channel") == 0);
    probe.check_outcome(done);
  });
}

TEST_CASE("requests and connections outlive their Endpoint and Peer handles", "[endpoint]") {
  fake::FakeProvider fake;
  {
    Peer peer = open_peer(fake);
    Endpoint ep = listen_on(peer, "169.254.77.1");
    ConnReq req = take_request(fake, ep, {0, "hi", "169.254.77.20", 40001});
    ConnReq req2 = take_request(fake, ep);
    CHECK(std::move(ep).shutdown());
    CHECK(std::move(peer).close());
    CHECK(fake.alive("pd") == 1);
    auto conn = std::move(req).connect(as_bytes("welcome"));
    REQUIRE(conn);
    fake.inject_event(*conn->fd(), RDMA_CM_EVENT_ESTABLISHED);
    CHECK(*conn->try_next_event() == ConnEvent::established);
    CHECK(as_text(*conn->private_data()) == "hi");
    CHECK(std::move(*conn).close());
    CHECK(std::move(req2).reject());
    CHECK(fake.alive("pd") == 0);
  }
  fake.expect_clean();
}

TEST_CASE("a moved-from Endpoint: every call is inval", "[endpoint][moved]") {
  fake::FakeProvider fake;
  Peer peer = open_peer(fake);
  Endpoint ep = listen_on(peer, "");
  Endpoint other = std::move(ep);
  const auto mark = fake.mark();
  CHECK_FALSE(ep);
  check_inval(ep.fd().error(), "Endpoint::fd");
  check_inval(ep.port().error(), "Endpoint::port");
  check_inval(ep.local_address().error(), "Endpoint::local_address");
  check_inval(ep.service_id().error(), "Endpoint::service_id");
  check_inval(ep.device().error(), "Endpoint::device");
  check_inval(ep.share_count().error(), "Endpoint::share_count");
  check_inval(ep.next_conn_req().error(), "Endpoint::next_conn_req");
  check_inval(ep.try_next_conn_req().error(), "Endpoint::try_next_conn_req");
  check_inval(ep.next_conn_req_for(std::chrono::milliseconds(1)).error(),
              "Endpoint::next_conn_req_for");
  check_inval(std::move(ep).shutdown().error(), "Endpoint::shutdown");
  CHECK(fake.calls_since(mark).empty());
  // Move-assigning over a live endpoint releases it.
  Endpoint third = listen_on(peer, "", "7472");
  third = std::move(other);
  CHECK(fake.alive("cm_id") == 1);
}

}  // namespace endpoint_test
