// ConnConfig::own_protection_domain: a connection on a protection domain of its own
// (isolation by domain), accepted and outgoing, on the fake provider (whose responder checks
// a region's key against the queue pair's domain, as rxe's lookup_mr does). What the device
// refuses across domains is proven on rxe in tests/integration/isolation_test.cpp.
#include "data_util.hpp"

namespace isolation_test {

namespace {

using namespace test;

constexpr MrUsage remote_rw = MrUsage::read_src | MrUsage::write_dst;

ConnConfig own_domain() {
  ConnConfig cfg;
  cfg.own_protection_domain = true;
  return cfg;
}

ibv_pd* pd_of(const Peer& peer) { return *peer.pd(); }

Conn accept(ConnReq&& req) {
  auto conn = std::move(req).connect();
  INFO((conn ? std::string() : conn.error().message()));
  REQUIRE(conn);
  return std::move(*conn);
}

bool reaches(const fake::FakeProvider& fake, const Conn& through, const MrLocal& mr, const Buffer& buf) {
  return fake.remote_access(*through.qp_num(), (*mr.native())->rkey, reinterpret_cast<std::uintptr_t>(buf.data()),
                            8, IBV_ACCESS_REMOTE_READ);
}

// The calls of a request with its own domain: the domain and its flush page first, for
// an accepted request once it is read (before its queues), for ConnReq::to before anything.
std::vector<std::string> with_domain(std::vector<std::string> calls, std::size_t at) {
  calls.insert(calls.begin() + static_cast<std::ptrdiff_t>(at), {"ibv_alloc_pd", "ibv_reg_mr"});
  return calls;
}
const std::vector<std::string> own_request_calls = with_domain(next_conn_req_calls, 2);
const std::vector<std::string> own_to_calls = with_domain(conn_req_to_calls, 0);

}  // namespace

TEST_CASE("own_protection_domain: an accepted connection's queue pair is on a domain of its own; "
          "no other domain's key reaches anything through it, and its keys nothing through "
          "another connection",
          "[isolation]") {
  fake::FakeProvider fake;
  {
    Peer peer = open_peer(fake);
    Endpoint ep = listen_on(peer, "169.254.77.1");
    ConnReq isolated_req = take_request(fake, ep, {0, "a", "169.254.77.20", 40001}, own_domain());
    ConnReq shared_req = take_request(fake, ep, {0, "b", "169.254.77.21", 40002});
    Peer own = *isolated_req.peer();
    CHECK(pd_of(own) != pd_of(peer));
    CHECK(pd_of(*shared_req.peer()) == pd_of(peer));
    CHECK(fake.alive("pd") == 2);
    CHECK(*own.device_name() == *peer.device_name());
    CHECK(*own.memory_windows() == *peer.memory_windows());  // the device's, not probed again
    Conn isolated = accept(std::move(isolated_req));
    Conn shared = accept(std::move(shared_req));
    CHECK((*isolated.qp())->pd == pd_of(own));
    CHECK((*shared.qp())->pd == pd_of(peer));
    CHECK(pd_of(*isolated.peer()) == pd_of(own));

    Buffer own_buf(256), peer_buf(256);
    MrLocal own_mr = reg(own, own_buf, remote_rw | MrUsage::write_src);
    MrLocal peer_mr = reg(peer, peer_buf, remote_rw | MrUsage::write_src);
    CHECK(reaches(fake, isolated, own_mr, own_buf));
    CHECK_FALSE(reaches(fake, shared, own_mr, own_buf));
    CHECK(reaches(fake, shared, peer_mr, peer_buf));
    CHECK_FALSE(reaches(fake, isolated, peer_mr, peer_buf));

    // locally, a region of another domain is refused before anything is posted
    const MrRemote remote = *MrRemote::from_descriptor(*peer_mr.descriptor());
    auto written = isolated.write(remote, 0, peer_mr, 0, 8);
    REQUIRE_FALSE(written);
    check_inval(written.error(), "Conn::write", "another Peer");
    CHECK(isolated.write(remote, 0, own_mr, 0, 8));
    auto foreign_grant = Grant::make(isolated, peer_mr, 0, 8, MrUsage::read_src);
    REQUIRE_FALSE(foreign_grant);
    CHECK(foreign_grant.error() == errc::inval);

    // the domain lives while its users do: the connection, the region, the handle
    REQUIRE(std::move(isolated).close());
    CHECK(fake.alive("pd") == 2);
    REQUIRE(std::move(own_mr).dereg());
    CHECK(fake.alive("pd") == 2);
    own = Peer();
    CHECK(fake.alive("pd") == 1);
  }
  fake.expect_clean();
}

TEST_CASE("own_protection_domain: an outgoing connection's too; a grant of its own domain's "
          "region works on it",
          "[isolation][grant]") {
  fake::FakeProvider fake;
  {
    Peer peer = open_peer(fake);
    ConnReq req = outgoing(peer, "169.254.77.9", own_domain());
    CHECK(pd_of(*req.peer()) != pd_of(peer));
    CHECK(fake.alive("pd") == 2);
    Conn conn = connected(fake, peer, own_domain());
    const Peer own = *conn.peer();
    CHECK((*conn.qp())->pd == pd_of(own));
    CHECK(pd_of(own) != pd_of(peer));
    CHECK(fake.alive("pd") == 3);
    Buffer buf(256);
    auto mr = MrLocal::reg(own, buf.data(), buf.size, remote_rw, MrScope::grants);
    REQUIRE(mr);
    auto grant = Grant::make(conn, *mr, 0, buf.size, MrUsage::read_src);
    REQUIRE(grant);
  }
  fake.expect_clean();
}

TEST_CASE("own_protection_domain with a shared receive queue is inval (the queue is on its "
          "Peer's domain); nothing is taken or made",
          "[isolation][inval]") {
  fake::FakeProvider fake;
  {
    Peer peer = open_peer(fake);
    auto srq = Srq::create(peer);
    REQUIRE(srq);
    ConnConfig cfg = own_domain();
    cfg.srq = &*srq;
    check_inval(ConnReq::to(peer, "169.254.77.9", "7471", cfg).error(), "ConnReq::to", "own_protection_domain");
    Endpoint ep = listen_on(peer, "169.254.77.1");
    fake.inject_connect_request(*ep.fd(), {0, "a", "169.254.77.20", 40001});
    const auto before_request = fake.mark();
    check_inval(ep.next_conn_req(cfg).error(), "Endpoint::next_conn_req", "own_protection_domain");
    CHECK(fake.calls_since(before_request).empty());
    CHECK(fake.alive("pd") == 1);
    CHECK(ep.next_conn_req());  // the request is still there
  }
  fake.expect_clean();
}

TEST_CASE("own_protection_domain: each provider call of an accepted request fails in turn; the "
          "request is rejected, the domain released, the endpoint still serves",
          "[isolation][fail-each]") {
  for (int err : {kErr, ENOMEM}) {
    fail_each_call(own_request_calls, err, [](fake::FakeProvider& fake, Probe& probe) {
      Peer peer = open_peer(fake);
      Endpoint ep = listen_on(peer, "169.254.77.1");
      fake.inject_connect_request(*ep.fd(), {0, "first", "169.254.77.20", 40001});
      probe.begin();
      auto req = ep.next_conn_req(own_domain());
      probe.end();
      if (!probe.check_outcome(req)) return;
      const bool taken = probe.injected()->call != "poll" && probe.injected()->call != "rdma_get_cm_event";
      CHECK(fake.rejects.size() == (taken ? 1u : 0u));
      CHECK(fake.alive("pd") == 1);
      CHECK(fake.alive("qp") == 0);
      if (taken) fake.inject_connect_request(*ep.fd(), {0, "second", "169.254.77.21", 40002});
      auto again = ep.next_conn_req(own_domain());
      REQUIRE(again);
      CHECK(pd_of(*again->peer()) != pd_of(peer));
    });
  }
}

TEST_CASE("own_protection_domain: each provider call of ConnReq::to fails in turn; nothing is left",
          "[isolation][fail-each]") {
  for (int err : {kErr, ENOMEM}) {
    fail_each_call(own_to_calls, err, [](fake::FakeProvider& fake, Probe& probe) {
      Peer peer = open_peer(fake);
      probe.begin();
      auto req = ConnReq::to(peer, "169.254.77.9", "7471", own_domain());
      probe.end();
      if (!probe.check_outcome(req)) return;
      CHECK(fake.alive("pd") == 1);
      CHECK(fake.alive("mr") == 1);  // the Peer's flush page
    });
  }
}

TEST_CASE("Conn::peer and ConnReq::peer of an empty handle are inval", "[isolation][inval]") {
  check_inval(Conn().peer().error(), "Conn::peer");
  check_inval(ConnReq().peer().error(), "ConnReq::peer");
}

}  // namespace isolation_test
