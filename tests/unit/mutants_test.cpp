// Tests that pin behaviours the rest of the suite left open: each kills a mutant of
// tools/mutants.txt that survived it (the mutant's id is in the test's tags).
#include "data_util.hpp"
#include "test_util.hpp"

#include <chrono>

namespace mutants_test {

using namespace rpmapp;
using namespace std::chrono_literals;

TEST_CASE("control-path limits met exactly, on a listening peer",
          "[mutants][ctl-cm-bounded-wait-clamped-to-zero][ctl-config-max-sge-dropped][ctl-comp-vector-limit]"
          "[ctl-copy-out-limit]") {
  fake::FakeProvider fake;
  {
    // Each SECTION runs from the top: a fresh fake, peer and endpoint per mutant.
    auto peer = test::open_peer(fake);
    auto ep = test::listen_on(peer, "169.254.77.1");

    SECTION("ctl-cm-bounded-wait-clamped-to-zero: a 1 ms bound waits 1 ms, it is not rounded down to a "
            "non-blocking try") {
      expected<ConnReq> req = unexpected(Error(errc::unknown, 0, ""));
      const auto took = test::timed([&] { req = ep.next_conn_req_for(1ms); });
      REQUIRE_FALSE(req);
      CHECK(req.error().code() == errc::no_event);
      CHECK(took >= 1ms);
    }
    SECTION("ctl-config-max-sge-dropped: a ConnConfig with max_sge 0 is refused before any provider call") {
      ConnConfig cfg;
      cfg.max_sge = 0;
      const auto mark = fake.calls().size();
      auto out = ConnReq::to(peer, "169.254.77.9", "7471", cfg);
      REQUIRE_FALSE(out);
      test::check_inval(out.error(), "ConnReq::to", "max_sge");
      auto in = ep.try_next_conn_req(cfg);
      REQUIRE_FALSE(in);
      test::check_inval(in.error(), "Endpoint::try_next_conn_req", "max_sge");
      CHECK(fake.calls().size() == mark);
    }
    SECTION("ctl-comp-vector-limit: completion_vector equal to the device's vector count is inval") {
      fake.context(0)->num_comp_vectors = 2;
      ConnConfig cfg;
      cfg.completion_vector = 2;
      fake.inject_connect_request(*ep.fd(), {});
      auto refused = ep.next_conn_req(cfg);
      REQUIRE_FALSE(refused);
      test::check_inval(refused.error(), "ConnConfig", "completion_vector 2");

      CHECK(fake.alive("cq") == 0);  // refused before any queue was made
      // (the fake's ibv_create_cq models vector 0 only: the last vector, 1, cannot be shown)
      cfg.completion_vector = 0;
      auto taken = test::take_request(fake, ep, {}, cfg);
      CHECK(std::move(taken).close());
    }
    SECTION("ctl-copy-out-limit: copy_private_data fills a buffer of exactly the private data's size") {
      ConnReq req = test::take_request(fake, ep, {0, "exact", "169.254.77.20", 40001});
      const auto size = req.private_data()->size();  // padded to 56 bytes by the CM
      REQUIRE(size == 56);
      std::vector<std::byte> out(size, std::byte{0xAB});
      auto n = req.copy_private_data(out);
      INFO((n ? std::string() : n.error().message()));
      REQUIRE(n);
      CHECK(*n == size);
      CHECK(std::to_integer<char>(out[0]) == 'e');
      CHECK(std::to_integer<char>(out[4]) == 't');
    }
  }
  fake.expect_clean();
}

TEST_CASE("a resolution error event's positive status is the errno (as a negative one is)",
          "[mutants][ctl-pending-status-errno]") {
  fake::FakeProvider fake;
  {
    auto peer = test::open_peer(fake);
    // rdma_cm reports some failures with a positive status (an IB CM reject reason, or a
    // provider that does not negate): it is the errno, not EPROTO (that is for status 0).
    fake.route_event = RDMA_CM_EVENT_ROUTE_ERROR;
    fake.route_status = ETIMEDOUT;
    auto req = ConnReq::to(peer, "169.254.77.9", "7471");
    REQUIRE_FALSE(req);
    CHECK(req.error().code() == errc::provider);
    CHECK(req.error().sys_errno() == ETIMEDOUT);
    CHECK(req.error().call() == "rdma_resolve_route");
    CHECK_THAT(req.error().message(), Catch::Contains("ROUTE_ERROR"));

    fake.route_status = 0;  // no status at all: EPROTO
    auto none = ConnReq::to(peer, "169.254.77.9", "7471");
    REQUIRE_FALSE(none);
    CHECK(none.error().sys_errno() == EPROTO);
  }
  fake.expect_clean();
}

TEST_CASE("data-path bounds and a shared receive queue's lifetime",
          "[mutants][dat-bounds-offset-at-end][dat-bounds-overflow][dat-srq-close-shared]") {
  fake::FakeProvider fake;
  {
    // Each SECTION runs from the top: a fresh fake and peer per mutant.
    auto peer = test::open_peer(fake);

    SECTION("dat-bounds-offset-at-end: a zero-length receive at the very end of a region is within it") {
      test::Buffer buf(64);
      MrLocal dst = test::reg(peer, buf, MrUsage::recv);
      auto srq = Srq::create(peer);
      REQUIRE(srq);
      auto at_end = srq->recv(dst, 64, 0, 7);
      INFO((at_end ? std::string() : at_end.error().message()));
      CHECK(at_end);
      CHECK(fake.outstanding_srq_recvs(*srq->native()) == 1);
      auto past_end = srq->recv(dst, 65, 0, 8);
      REQUIRE_FALSE(past_end);
      test::check_inval(past_end.error(), "Srq::recv", "not within");
      CHECK(fake.outstanding_srq_recvs(*srq->native()) == 1);
    }
    SECTION("dat-bounds-overflow: a flush range whose end overflows 64 bits is refused, not wrapped around") {
      Conn conn = test::connected(fake, peer);
      const MrRemote region = test::remote(0x10000, 4096, 0x1234, MrUsage::flush_visibility);
      const auto before = fake.posted().size();
      // 16 + (2^64 - 8) wraps to 8, which is below the size: the range must still be refused.
      auto r = conn.flush(region, 16, ~std::size_t{0} - 7, FlushType::visibility);
      REQUIRE_FALSE(r);
      test::check_inval(r.error(), "Conn::flush", "not within");
      CHECK(fake.posted().size() == before);
    }
    SECTION("dat-srq-close-shared: Srq::close while a connection still uses the queue leaves it to the "
            "connection") {
      auto srq = Srq::create(peer);
      REQUIRE(srq);
      ConnConfig cfg;
      cfg.srq = &*srq;
      ConnReq req = test::outgoing(peer, "169.254.77.9", cfg);
      CHECK(std::move(*srq).close());
      CHECK(fake.alive("srq") == 1);  // the request's connection still receives through it
      CHECK(fake.alive("cq") >= 1);
      CHECK(std::move(req).close());
      CHECK(fake.alive("srq") == 0);
    }
    // (dat-qp-recv-wr-with-srq is equivalent: with an SRQ the kernel sets max_recv_wr to 0;
    // what can be seen is the queue each pair receives through.)
    SECTION("a queue pair receives through its own rq_size queue, or through the shared one") {
      auto srq = Srq::create(peer);
      REQUIRE(srq);
      ConnConfig cfg;
      cfg.rq_size = 33;
      ConnReq own = test::outgoing(peer, "169.254.77.9", cfg);
      CHECK(fake.last_qp_attr.cap.max_recv_wr == 33);
      CHECK(fake.last_qp_attr.srq == nullptr);
      cfg.srq = &*srq;
      ConnReq shared = test::outgoing(peer, "169.254.77.9", cfg);
      CHECK(fake.last_qp_attr.srq == *srq->native());
    }
  }
  fake.expect_clean();
}

}  // namespace mutants_test
