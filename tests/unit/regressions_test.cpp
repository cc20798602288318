// Each test names a librpma bug (research/librpma.md) that rpmapp must not repeat.
#include "test_util.hpp"

namespace regressions_test {

using namespace test;
using namespace std::chrono_literals;

TEST_CASE("librpma next_conn_req: an ack failure deleted the request and nulled *req_ptr",
          "[regression]") {
  fake::FakeProvider fake;
  {
    Peer peer = open_peer(fake);
    Endpoint ep = listen_on(peer, "169.254.77.1");
    ConnReq kept = take_request(fake, ep, {0, "kept", "169.254.77.20", 40001});
    const auto qp = *kept.qp_num();
    fake.inject_connect_request(*ep.fd(), {0, "second", "169.254.77.21", 40002});
    fake.fail("rdma_ack_cm_event", kErr);
    auto failed = ep.try_next_conn_req();
    REQUIRE_FALSE(failed);
    check_injected(failed.error(), "rdma_ack_cm_event", kErr);
    // The caller's other objects are untouched; the failed request was rejected AND
    // destroyed (not leaked).
    REQUIRE(kept);
    CHECK(*kept.qp_num() == qp);
    CHECK(as_text(*kept.private_data()) == "kept");
    CHECK(fake.rejects.size() == 1);
    CHECK(fake.alive("cm_id") == 2);  // the listener and `kept`
  }
  fake.expect_clean();
}

TEST_CASE("librpma conn_req_delete: a rejected incoming request's cm_id leaked",
          "[regression]") {
  fake::FakeProvider fake;
  {
    Peer peer = open_peer(fake);
    Endpoint ep = listen_on(peer, "169.254.77.1");
    SECTION("reject") {
      ConnReq req = take_request(fake, ep);
      CHECK(std::move(req).reject());
    }
    SECTION("close") {
      ConnReq req = take_request(fake, ep);
      CHECK(std::move(req).close());
    }
    SECTION("dropped") { take_request(fake, ep); }
    REQUIRE(fake.rejects.size() == 1);
    CHECK_FALSE(fake.id_alive(fake.rejects[0].id));
    CHECK(fake.alive("cm_id") == 1);
  }
  fake.expect_clean();
}

TEST_CASE("librpma conn_next_event: an unexpected event logged the caller's uninitialized "
          "*event",
          "[regression]") {
  fake::FakeProvider fake;
  Peer peer = open_peer(fake);
  auto conn = outgoing(peer).connect();
  REQUIRE(conn);
  fake.inject_event(*conn->fd(), RDMA_CM_EVENT_MULTICAST_JOIN);
  auto ev = conn->try_next_event();
  REQUIRE_FALSE(ev);
  CHECK(ev.error().code() == errc::unknown);
  // The reason names the event the CM delivered, nothing the caller provided.
  CHECK_THAT(ev.error().message(), Catch::Contains("MULTICAST_JOIN"));
  CHECK(fake.alive("unacked_event") == 0);
}

TEST_CASE("librpma conn_req_new_from_cm_event: an ENOMEM destroyed the incoming id "
          "without rejecting it",
          "[regression]") {
  fake::FakeProvider fake;
  {
    Peer peer = open_peer(fake);
    Endpoint ep = listen_on(peer, "169.254.77.1");
    fake.inject_connect_request(*ep.fd(), {});
    fake.fail("ibv_create_comp_channel", ENOMEM);
    auto req = ep.next_conn_req();
    REQUIRE_FALSE(req);
    CHECK(req.error().code() == errc::nomem);
    CHECK(fake.rejects.size() == 1);  // the client hears a reject, not a timeout
  }
  fake.expect_clean();
}

TEST_CASE("librpma conn_req_connect: a failed rdma_accept neither rejected nor destroyed "
          "the id",
          "[regression]") {
  fake::FakeProvider fake;
  {
    Peer peer = open_peer(fake);
    Endpoint ep = listen_on(peer, "169.254.77.1");
    ConnReq req = take_request(fake, ep);
    fake.fail("rdma_accept", EIO);
    auto conn = std::move(req).connect();
    REQUIRE_FALSE(conn);
    REQUIRE(fake.rejects.size() == 1);
    CHECK_FALSE(fake.id_alive(fake.rejects[0].id));
  }
  fake.expect_clean();
}

TEST_CASE("librpma PR #1703: the request's event is acknowledged before rdma_migrate_id "
          "(which would block otherwise)",
          "[regression]") {
  fake::FakeProvider fake;
  Peer peer = open_peer(fake);
  Endpoint ep = listen_on(peer, "169.254.77.1");
  ConnReq req = take_request(fake, ep);
  const auto& calls = fake.calls();
  auto ack = std::find(calls.rbegin(), calls.rend(), "rdma_ack_cm_event");
  auto migrate = std::find(calls.rbegin(), calls.rend(), "rdma_migrate_id");
  REQUIRE(ack != calls.rend());
  REQUIRE(migrate != calls.rend());
  CHECK(migrate < ack);  // reverse iterators: the migration comes later
  CHECK(fake.failures().empty());
}

TEST_CASE("librpma ep_shutdown: could destroy the channel a taken request's id was on",
          "[regression]") {
  fake::FakeProvider fake;
  {
    Peer peer = open_peer(fake);
    Endpoint ep = listen_on(peer, "169.254.77.1");
    ConnReq req = take_request(fake, ep);
    CHECK(std::move(ep).shutdown());
    CHECK(fake.failures().empty());  // no "cm_id still on the channel"
    auto conn = std::move(req).connect();
    REQUIRE(conn);
    fake.inject_event(*conn->fd(), RDMA_CM_EVENT_ESTABLISHED);
    CHECK(*conn->try_next_event() == ConnEvent::established);
  }
  fake.expect_clean();
}

TEST_CASE("librpma hard-codes retry_count 7, which retries forever on rxe", "[regression]") {
  CHECK(ConnConfig{}.retry_count == 6);
  CHECK(ConnConfig{}.rnr_retry_count == 7);
}

TEST_CASE("librpma issue #184: rdma_cm pads private data; we return what it delivered",
          "[regression]") {
  fake::FakeProvider fake;
  Peer peer = open_peer(fake);
  Endpoint ep = listen_on(peer, "169.254.77.1");
  ConnReq req = take_request(fake, ep, {0, "abc", "169.254.77.20", 40001});
  auto data = *req.private_data();
  CHECK(data.size() == 56);
  CHECK(as_text(data) == "abc");
}

TEST_CASE("librpma conn_req_new: a NULL-channel (synchronous) id made resolution blocking",
          "[regression]") {
  fake::FakeProvider fake;
  Peer peer = open_peer(fake);
  fake.auto_resolve = false;
  auto pending = ConnReq::start(peer, "169.254.77.9", "7471");
  REQUIRE(pending);  // returned while resolution is in progress
  CHECK(std::move(*pending).try_wait().error().code() == errc::no_event);
}

TEST_CASE("librpma ep_listen unit test: a failure after rdma_create_id must still destroy "
          "the id and channel (first error wins)",
          "[regression]") {
  fake::FakeProvider fake;
  {
    Peer peer = open_peer(fake);
    fake.fail("rdma_listen", EADDRINUSE);
    fake.fail("rdma_destroy_id", kErr);
    auto ep = Endpoint::listen(peer, "169.254.77.1", "7471");
    REQUIRE_FALSE(ep);
    check_injected(ep.error(), "rdma_listen", EADDRINUSE);
    CHECK(fake.alive("cm_id") == 0);
  }
  fake.expect_clean();
}

// librpma's "_subsequent_ERRNO2" tests: a cleanup failure after a failure must not replace
// the first error, nor stop the rest of the cleanup.
TEST_CASE("first error wins: cleanup failures after a failure", "[regression]") {
  constexpr int kErr2 = EOWNERDEAD;
  fake::FakeProvider fake;
  {
    Peer peer = open_peer(fake);
    Endpoint ep = listen_on(peer, "169.254.77.1");
    SECTION("next_conn_req: rdma_create_qp, then rdma_reject and rdma_destroy_id fail") {
      fake.inject_connect_request(*ep.fd(), {});
      fake.fail("rdma_create_qp", kErr);
      fake.fail("ibv_destroy_cq", kErr2);
      fake.fail("rdma_reject", kErr2);
      fake.fail("rdma_destroy_id", kErr2);
      auto req = ep.next_conn_req();
      REQUIRE_FALSE(req);
      check_injected(req.error(), "rdma_create_qp", kErr);
    }
    SECTION("ConnReq::to: rdma_resolve_route, then rdma_destroy_id fail") {
      fake.fail("rdma_resolve_route", kErr);
      fake.fail("rdma_destroy_id", kErr2);
      auto req = ConnReq::to(peer, "169.254.77.9", "7471");
      REQUIRE_FALSE(req);
      check_injected(req.error(), "rdma_resolve_route", kErr);
    }
    SECTION("ConnReq::reject: rdma_reject, then ibv_destroy_cq and rdma_destroy_id fail") {
      ConnReq req = take_request(fake, ep);
      fake.fail("rdma_reject", kErr);
      fake.fail("ibv_destroy_cq", kErr2);
      fake.fail("rdma_destroy_id", kErr2);
      auto done = std::move(req).reject();
      REQUIRE_FALSE(done);
      check_injected(done.error(), "rdma_reject", kErr);
    }
    SECTION("Conn::close: ibv_destroy_cq, then ibv_destroy_comp_channel and rdma_destroy_id") {
      auto conn = take_request(fake, ep).connect();
      REQUIRE(conn);
      fake.fail("ibv_destroy_cq", kErr);
      fake.fail("ibv_destroy_comp_channel", kErr2);
      fake.fail("rdma_destroy_id", kErr2);
      auto done = std::move(*conn).close();
      REQUIRE_FALSE(done);
      check_injected(done.error(), "ibv_destroy_cq", kErr);
    }
    SECTION("Endpoint::shutdown: rdma_reject, then rdma_ack_cm_event and rdma_destroy_id") {
      fake.inject_connect_request(*ep.fd(), {});
      fake.fail("rdma_reject", kErr);
      fake.fail("rdma_ack_cm_event", kErr2);
      fake.fail("rdma_destroy_id", kErr2, 2);  // the listener's
      auto done = std::move(ep).shutdown();
      REQUIRE_FALSE(done);
      check_injected(done.error(), "rdma_reject", kErr);
    }
    CHECK(fake.pending_faults() == 0);
  }
  fake.expect_clean();
}

// Found by fuzzing (tests/fuzz, docs/reliability.md).

TEST_CASE("fuzz address: a NUL inside an address was accepted as the text before it",
          "[regression]") {
  using namespace std::string_view_literals;
  fake::FakeProvider fake;
  {
    Peer peer = open_peer(fake);
    const auto before = fake.mark();
    // inet_pton stops at the NUL: "::\0junk" was the wildcard, "169.254.77.9\0x" that address.
    for (std::string_view addr : {"169.254.77.9\0x"sv, "::\0\0:\x04P"sv, "169.254.77.1\0"sv,
                                  "fe80::1%lo\0x"sv}) {
      INFO("address of " << addr.size() << " bytes");
      auto req = ConnReq::to(peer, addr, "7471");
      REQUIRE_FALSE(req);
      check_inval(req.error(), "ConnReq::to", "address");
      auto ep = Endpoint::listen(peer, addr, "7471");
      REQUIRE_FALSE(ep);
      check_inval(ep.error(), "Endpoint::listen");
      auto found = Peer::from_address(addr, AddressKind::local);
      REQUIRE_FALSE(found);
      check_inval(found.error(), "Peer::from_address");
    }
    CHECK(fake.calls_since(before).empty());  // refused before any provider call
  }
  fake.expect_clean();
}

}  // namespace regressions_test
