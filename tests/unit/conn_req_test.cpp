// ConnReq: outgoing (to, start + try_wait / wait_for / wait), connect, reject, close.
#include "test_util.hpp"

namespace conn_req_test {

using namespace test;
using namespace std::chrono_literals;

namespace {
const std::vector<std::string>& to_calls = conn_req_to_calls;

enum class How { to, try_wait, wait_for, wait };

/// try_wait only reads the channel; the waiting forms poll before each read.
std::vector<std::string> calls_of(How how) {
  std::vector<std::string> calls = to_calls;
  if (how == How::try_wait) std::erase(calls, std::string("poll"));
  return calls;
}

expected<ConnReq> make(const Peer& peer, How how, std::string_view addr = "169.254.77.9",
                       std::string_view port = "7471", const ConnConfig& cfg = {}) {
  if (how == How::to) return ConnReq::to(peer, addr, port, cfg);
  auto pending = ConnReq::start(peer, addr, port, cfg);
  if (!pending) return unexpected(pending.error());
  switch (how) {
    case How::try_wait: return std::move(*pending).try_wait();
    case How::wait_for: return std::move(*pending).wait_for(1000ms);
    default: return std::move(*pending).wait();
  }
}
}  // namespace

TEST_CASE("ConnReq::to resolves, creates the queue pair on the Peer", "[conn_req]") {
  for (auto how : {How::to, How::try_wait, How::wait_for, How::wait}) {
    fake::FakeProvider fake;
    {
      Peer peer = open_peer(fake);
      const auto mark = fake.mark();
      auto req = make(peer, how);
      REQUIRE(req);
      CHECK(fake.calls_since(mark) == calls_of(how));
      CHECK_FALSE(*req->is_incoming());
      CHECK(*req->device() == "fake0");
      CHECK(*req->peer_address() == "169.254.77.9");
      CHECK(*req->peer_port() == 7471);
      CHECK(req->private_data()->empty());
      CHECK(fake.qp_pd.at(*req->qp_num()) == *peer.pd());
      CHECK(fake.last_qp_attr.cap.max_send_wr == 10);
      CHECK(fake.alive("unacked_event") == 0);
    }
    CHECK(fake.rejects.empty());  // an outgoing request is destroyed, not rejected
    fake.expect_clean();
  }
}

TEST_CASE("ConnReq::to: each provider call fails in turn", "[conn_req][fail-each]") {
  for (auto how : {How::to, How::try_wait, How::wait_for, How::wait}) {
    for (int err : {kErr, ENOMEM}) {
      fail_each_call(calls_of(how), err, [&](fake::FakeProvider& fake, Probe& probe) {
        Peer peer = open_peer(fake);
        probe.begin();
        auto req = make(peer, how);
        probe.end();
        if (!probe.check_outcome(req)) return;
        CHECK(fake.alive("cm_id") == 0);
        CHECK(fake.alive("qp") == 0);
        CHECK(fake.alive("event_channel") == 0);
      });
    }
  }
}

TEST_CASE("ConnReq::to: resolution errors carry the event's status", "[conn_req]") {
  fake::FakeProvider fake;
  {
    Peer peer = open_peer(fake);
    SECTION("unreachable: ADDR_ERROR") {
      auto req = ConnReq::to(peer, "10.1.2.3", "7471");
      REQUIRE_FALSE(req);
      CHECK(req.error().code() == errc::provider);
      CHECK(req.error().sys_errno() == EHOSTUNREACH);
      CHECK(req.error().call() == "rdma_resolve_addr");
      CHECK_THAT(req.error().message(), Catch::Contains("ADDR_ERROR"));
    }
    SECTION("ROUTE_ERROR") {
      fake.route_event = RDMA_CM_EVENT_ROUTE_ERROR;
      fake.route_status = -ETIMEDOUT;
      auto req = ConnReq::to(peer, "169.254.77.9", "7471");
      REQUIRE_FALSE(req);
      CHECK(req.error().sys_errno() == ETIMEDOUT);
      CHECK(req.error().call() == "rdma_resolve_route");
    }
    SECTION("an error event without a status is EPROTO") {
      fake.addr_event = RDMA_CM_EVENT_ADDR_ERROR;
      auto req = ConnReq::to(peer, "169.254.77.9", "7471");
      REQUIRE_FALSE(req);
      CHECK(req.error().sys_errno() == EPROTO);
    }
    SECTION("reached through another device than the Peer's: inval naming both") {
      auto req = ConnReq::to(peer, "169.254.78.9", "7471");
      REQUIRE_FALSE(req);
      check_inval(req.error(), "PendingConnReq::wait", "fake1");
      CHECK_THAT(req.error().message(), Catch::Contains("fake0"));
    }
    CHECK(fake.alive("cm_id") == 0);
  }
  fake.expect_clean();
}

TEST_CASE("PendingConnReq: in progress is no_event and the request stays usable",
          "[conn_req]") {
  fake::FakeProvider fake;
  {
    Peer peer = open_peer(fake);
    fake.auto_resolve = false;
    auto pending = ConnReq::start(peer, "169.254.77.9", "7471");
    REQUIRE(pending);
    const int fd = *pending->fd();
    auto a = std::move(*pending).try_wait();
    REQUIRE_FALSE(a);
    CHECK(a.error().code() == errc::no_event);
    CHECK(*pending);
    CHECK(*pending->fd() == fd);
    fake.deliver_held();  // ADDR_RESOLVED
    auto b = std::move(*pending).wait_for(5ms);
    REQUIRE_FALSE(b);
    CHECK(b.error().code() == errc::no_event);
    CHECK(*pending);
    fake.deliver_held();  // ROUTE_RESOLVED
    auto c = std::move(*pending).try_wait();
    REQUIRE(c);
    CHECK_FALSE(*pending);
    check_inval(std::move(*pending).try_wait().error(), "PendingConnReq::try_wait");
  }
  fake.expect_clean();
}

TEST_CASE("PendingConnReq::wait gives up after twice the timeout: ETIMEDOUT", "[conn_req]") {
  fake::FakeProvider fake;
  {
    Peer peer = open_peer(fake);
    fake.auto_resolve = false;
    ConnConfig cfg;
    cfg.timeout = 5ms;
    auto pending = ConnReq::start(peer, "169.254.77.9", "7471", cfg);
    REQUIRE(pending);
    auto r = std::move(*pending).wait();
    REQUIRE_FALSE(r);
    CHECK(r.error().code() == errc::provider);
    CHECK(r.error().sys_errno() == ETIMEDOUT);
    CHECK(r.error().call() == "rdma_resolve_addr");
    CHECK_FALSE(*pending);  // consumed
    CHECK(fake.alive("cm_id") == 0);
    fake.deliver_held();  // events of a destroyed id: discarded
  }
  fake.expect_clean();
}

TEST_CASE("ConnReq::to: bad arguments are inval, before any provider call",
          "[conn_req][inval]") {
  fake::FakeProvider fake;
  Peer peer = open_peer(fake);
  const auto mark = fake.mark();
  for (const char* addr : {"", "abc", "1.2.3.4.5", "300.1.1.1", "0.0.0.0x", " 1.2.3.4"}) {
    INFO("address \"" << addr << "\"");
    auto req = ConnReq::to(peer, addr, "7471");
    REQUIRE_FALSE(req);
    check_inval(req.error(), "ConnReq::to", "numeric");
    auto pending = ConnReq::start(peer, addr, "7471");
    REQUIRE_FALSE(pending);
    check_inval(pending.error(), "ConnReq::start", "numeric");
  }
  for (const char* port : {"", "-1", "65536", "abc", " 80", "80 ", "+80", "0"}) {
    INFO("port \"" << port << "\"");
    auto req = ConnReq::to(peer, "169.254.77.9", port);
    REQUIRE_FALSE(req);
    check_inval(req.error(), "ConnReq::to", "port");
    auto pending = ConnReq::start(peer, "169.254.77.9", port);
    REQUIRE_FALSE(pending);
    check_inval(pending.error(), "ConnReq::start", "port");
  }
  ConnConfig bad[8];
  bad[0].cq_size = 0;
  bad[1].sq_size = 0;
  bad[2].rq_size = 0;
  bad[3].retry_count = 8;
  bad[4].rnr_retry_count = 255;
  bad[5].timeout = 0ms;
  bad[6].timeout = -5ms;
  bad[7].timeout = std::chrono::milliseconds(0x80000000ll);
  for (const auto& cfg : bad) {
    auto req = ConnReq::to(peer, "169.254.77.9", "7471", cfg);
    REQUIRE_FALSE(req);
    check_inval(req.error(), "ConnReq::to");
  }
  CHECK(fake.calls_since(mark).empty());
}

TEST_CASE("ConnReq::connect, outgoing: sends the private data and the retry counts",
          "[conn_req]") {
  fake::FakeProvider fake;
  {
    Peer peer = open_peer(fake);
    ConnConfig cfg;
    cfg.retry_count = 3;
    cfg.rnr_retry_count = 2;
    ConnReq req = outgoing(peer, "169.254.77.9", cfg);
    const std::string too_long(max_connect_private_data + 1, 'x');
    auto bad = std::move(req).connect(as_bytes(too_long));
    REQUIRE_FALSE(bad);
    check_inval(bad.error(), "ConnReq::connect", "57");
    CHECK(req);  // inval leaves the request as it was
    CHECK(fake.connects.empty());
    const std::string max(56, 'y');
    const auto mark = fake.mark();
    auto conn = std::move(req).connect(as_bytes(max));
    REQUIRE(conn);
    CHECK(fake.calls_since(mark) == std::vector<std::string>{"rdma_connect"});
    CHECK_FALSE(req);
    REQUIRE(fake.connects.size() == 1);
    CHECK(fake.connects[0].text() == max);
    CHECK(fake.last_conn_param.retry_count == 3);
    CHECK(fake.last_conn_param.rnr_retry_count == 2);
    CHECK(fake.last_conn_param.private_data_len == 56);
  }
  fake.expect_clean();
}

TEST_CASE("ConnReq::connect, incoming: accepts with up to 196 bytes", "[conn_req]") {
  fake::FakeProvider fake;
  {
    Peer peer = open_peer(fake);
    Endpoint ep = listen_on(peer, "169.254.77.1");
    ConnReq req = take_request(fake, ep);
    const std::string too_long(197, 'x');
    auto bad = std::move(req).connect(as_bytes(too_long));
    REQUIRE_FALSE(bad);
    check_inval(bad.error(), "ConnReq::connect", "197");
    CHECK(req);
    const std::string max(196, 'z');
    auto conn = std::move(req).connect(as_bytes(max));
    REQUIRE(conn);
    REQUIRE(fake.accepts.size() == 1);
    CHECK(fake.accepts[0].text() == max);
    CHECK(fake.last_conn_param.retry_count == 6);  // our default, not librpma's 7
    CHECK(fake.last_conn_param.rnr_retry_count == 7);
  }
  CHECK(fake.rejects.empty());  // accepted: never rejected
  fake.expect_clean();
}

TEST_CASE("ConnReq::connect: the provider call fails", "[conn_req][fail-each]") {
  for (bool incoming : {true, false}) {
    const std::string call = incoming ? "rdma_accept" : "rdma_connect";
    fail_each_call({call}, kErr, [&](fake::FakeProvider& fake, Probe& probe) {
      Peer peer = open_peer(fake);
      Endpoint ep = listen_on(peer, "169.254.77.1");
      ConnReq req = incoming ? take_request(fake, ep) : outgoing(peer);
      probe.begin();
      auto conn = std::move(req).connect(as_bytes("data"));
      probe.end();
      if (!probe.check_outcome(conn)) return;
      CHECK_FALSE(req);  // consumed: released
      CHECK(fake.rejects.size() == (incoming ? 1u : 0u));
      CHECK(fake.alive("cm_id") == 1);  // only the listener
      CHECK(fake.alive("qp") == 0);
    });
  }
}

TEST_CASE("ConnReq::reject sends its private data and releases everything", "[conn_req]") {
  fake::FakeProvider fake;
  {
    Peer peer = open_peer(fake);
    Endpoint ep = listen_on(peer, "169.254.77.1");
    ConnReq req = take_request(fake, ep);
    const std::string too_long(149, 'x');
    auto bad = std::move(req).reject(as_bytes(too_long));
    REQUIRE_FALSE(bad);
    check_inval(bad.error(), "ConnReq::reject", "149");
    CHECK(req);
    CHECK(fake.rejects.empty());
    const std::string max(148, 'n');
    CHECK(std::move(req).reject(as_bytes(max)));
    REQUIRE(fake.rejects.size() == 1);
    CHECK(fake.rejects[0].text() == max);
    CHECK(fake.alive("cm_id") == 1);

    ConnReq out = outgoing(peer);
    auto not_incoming = std::move(out).reject();
    REQUIRE_FALSE(not_incoming);
    check_inval(not_incoming.error(), "ConnReq::reject", "incoming");
    CHECK(out);
  }
  fake.expect_clean();
}

TEST_CASE("on an iWARP device the private data limit is 251 bytes for connect, accept and reject, and "
          "nothing is padded",
          "[conn_req][private_data][iwarp]") {
  CHECK(private_data_limits(false) == PrivateDataLimits{56, 196, 148, true});
  CHECK(private_data_limits(true) == PrivateDataLimits{251, 251, 251, false});
  fake::FakeProvider fake;
  fake.set_caps(1, fake::DeviceCaps::siw());
  {
    Peer rxe = open_peer(fake, 0);
    Peer siw = open_peer(fake, 1);
    CHECK_FALSE(*rxe.iwarp());
    CHECK(*siw.iwarp());
    CHECK(*rxe.private_data_limits() == private_data_limits(false));
    CHECK(*siw.private_data_limits() == private_data_limits(true));
    const std::string max(251, 'w'), too_long(252, 'x');

    // Outgoing: 252 bytes are inval naming the device and its transport; 251 are sent.
    ConnReq out = outgoing(siw, "169.254.78.9");
    auto bad = std::move(out).connect(as_bytes(too_long));
    REQUIRE_FALSE(bad);
    check_inval(bad.error(), "ConnReq::connect", "252 bytes, more than the 251 that fake1 (iWARP) allows");
    REQUIRE(out);
    CHECK(fake.connects.empty());
    auto conn = std::move(out).connect(as_bytes(max));
    REQUIRE(conn);
    REQUIRE(fake.connects.size() == 1);
    CHECK(fake.connects[0].text() == max);
    // The accept's private data arrives at its length.
    fake.inject_event(*conn->fd(), RDMA_CM_EVENT_ESTABLISHED, "short");
    REQUIRE(*conn->try_next_event() == ConnEvent::established);
    CHECK(as_text(*conn->private_data()) == "short");
    CHECK(conn->private_data()->size() == 5);

    // Incoming: the request's data at its length; 252 bytes refused for accept and reject.
    Endpoint ep = listen_on(siw, "169.254.78.1");
    ConnReq in = take_request(fake, ep, {1, "hi"});
    CHECK(in.private_data()->size() == 2);
    const auto mark = fake.mark();
    auto bad_accept = std::move(in).connect(as_bytes(too_long));
    REQUIRE_FALSE(bad_accept);
    check_inval(bad_accept.error(), "ConnReq::connect", "accept private data is 252 bytes");
    auto bad_reject = std::move(in).reject(as_bytes(too_long));
    REQUIRE_FALSE(bad_reject);
    check_inval(bad_reject.error(), "ConnReq::reject", "reject private data is 252 bytes");
    CHECK(fake.calls_since(mark).empty());
    REQUIRE(in);
    REQUIRE(std::move(in).reject(as_bytes(max)));
    REQUIRE(fake.rejects.size() == 1);
    CHECK(fake.rejects[0].text() == max);
    ConnReq accepted = take_request(fake, ep, {1, "again"});
    REQUIRE(std::move(accepted).connect(as_bytes(max)));
    CHECK(fake.accepts.back().text() == max);

    // The same 149 bytes that siw takes are inval on the IB/RoCE device.
    ConnReq ib = take_request(fake, ep, {1, "ib"});
    Endpoint rxe_ep = listen_on(rxe, "169.254.77.1");
    ConnReq on_rxe = take_request(fake, rxe_ep, {0, "ib"});
    CHECK(on_rxe.private_data()->size() == 56);  // IB CM pads
    auto ib_reject = std::move(on_rxe).reject(as_bytes(std::string(149, 'r')));
    REQUIRE_FALSE(ib_reject);
    check_inval(ib_reject.error(), "ConnReq::reject", "149 bytes, more than the 148 that fake0 (InfiniBand/RoCE");
    REQUIRE(std::move(ib).reject(as_bytes(std::string(149, 'r'))));
  }
  fake.expect_clean();
}

TEST_CASE("ConnReq::to: a queue pair the device refuses (EINVAL) names the sizes asked, "
          "siw's inline limit among them",
          "[conn_req][config][iwarp]") {
  fake::FakeProvider fake;
  fake.set_caps(1, fake::DeviceCaps::siw());
  {
    Peer siw = open_peer(fake, 1);
    auto bad = ConnReq::to(siw, "169.254.78.9", "7471", ConnConfig{.max_inline_data = 81});
    REQUIRE_FALSE(bad);
    INFO(bad.error().message());
    CHECK(bad.error().code() == errc::provider);
    CHECK(bad.error().call() == "rdma_create_qp");
    CHECK(bad.error().sys_errno() == EINVAL);
    CHECK_THAT(bad.error().message(), Catch::Contains("sq_size 10, rq_size 10, max_sge 1, max_inline_data 81") &&
                                          Catch::Contains("siw takes at most 80"));
    CHECK(outgoing(siw, "169.254.78.9", ConnConfig{.max_inline_data = 80}));  // siw's most
    // another errno is the plain provider error
    fake.fail("rdma_create_qp", EPERM);
    auto other = ConnReq::to(siw, "169.254.78.9", "7471");
    REQUIRE_FALSE(other);
    CHECK(other.error().sys_errno() == EPERM);
    CHECK_THAT(other.error().message(), !Catch::Contains("refused the queue pair"));
  }
  {
    // an IB/RoCE device's refusal names the sizes, not siw's limit
    Peer ib = open_peer(fake, 0);
    fake.fail("rdma_create_qp", EINVAL);
    auto refused = ConnReq::to(ib, "169.254.77.9", "7471");
    REQUIRE_FALSE(refused);
    INFO(refused.error().message());
    CHECK_THAT(refused.error().message(), Catch::Contains("refused the queue pair: sq_size 10") &&
                                              !Catch::Contains("siw"));
  }
  fake.expect_clean();
}

TEST_CASE("issue 8.3: reject private data is limited to the IB CM's 148 bytes",
          "[conn_req][inval][issue8]") {
  CHECK(max_reject_private_data == 148);
  for (std::size_t size : {149u, 150u, 196u}) {
    INFO("size " << size);
    fake::FakeProvider fake;
    {
      Peer peer = open_peer(fake);
      Endpoint ep = listen_on(peer, "169.254.77.1");
      ConnReq req = take_request(fake, ep, {0, "hi"});
      const std::string data(size, 'r');
      const auto mark = fake.mark();
      auto bad = std::move(req).reject(as_bytes(data));
      REQUIRE_FALSE(bad);
      check_inval(bad.error(), "ConnReq::reject", std::to_string(size) + " bytes");
      CHECK_THAT(bad.error().message(), Catch::Contains("148"));
      CHECK(fake.calls_since(mark).empty());  // nothing sent
      REQUIRE(req);                           // the request is left as it was
      CHECK(as_text(*req.private_data()) == "hi");
      CHECK(fake.alive("qp") == 1);
      // and can still be answered
      auto conn = std::move(req).connect();
      REQUIRE(conn);
      CHECK(fake.accepts.size() == 1);
    }
    CHECK(fake.rejects.empty());
    fake.expect_clean();
  }
}

TEST_CASE("ConnReq::reject: each provider call fails in turn", "[conn_req][fail-each]") {
  for (std::uint32_t rcq : {0u, 4u}) {
    std::vector<std::string> calls = {"rdma_reject"};
    const auto teardown = teardown_calls(rcq != 0);
    calls.insert(calls.end(), teardown.begin(), teardown.end());
    fail_each_call(calls, kErr, [&](fake::FakeProvider& fake, Probe& probe) {
      Peer peer = open_peer(fake);
      Endpoint ep = listen_on(peer, "169.254.77.1");
      ConnConfig cfg;
      cfg.rcq_size = rcq;
      ConnReq req = take_request(fake, ep, {}, cfg);
      probe.begin();
      auto done = std::move(req).reject(as_bytes("no"));
      probe.end();
      CHECK_FALSE(req);
      CHECK(fake.alive("cm_id") == 1);
      CHECK(fake.alive("cq") == fake.refused("cq"));
      probe.check_outcome(done);
    });
  }
}

TEST_CASE("ConnReq::close: each provider call fails in turn", "[conn_req][fail-each]") {
  for (bool incoming : {true, false}) {
    std::vector<std::string> calls = {"ibv_destroy_qp", "ibv_destroy_cq",
                                      "ibv_destroy_comp_channel"};
    if (incoming) calls.push_back("rdma_reject");
    calls.insert(calls.end(), {"rdma_destroy_id", "rdma_destroy_event_channel"});
    fail_each_call(calls, kErr, [&](fake::FakeProvider& fake, Probe& probe) {
      Peer peer = open_peer(fake);
      Endpoint ep = listen_on(peer, "169.254.77.1");
      ConnReq req = incoming ? take_request(fake, ep) : outgoing(peer);
      probe.begin();
      auto done = std::move(req).close();
      probe.end();
      CHECK_FALSE(req);
      CHECK(fake.alive("cm_id") == 1);
      probe.check_outcome(done);
    });
  }
}

TEST_CASE("ConnReq::copy_private_data writes nothing on failure", "[conn_req]") {
  fake::FakeProvider fake;
  Peer peer = open_peer(fake);
  Endpoint ep = listen_on(peer, "169.254.77.1");
  ConnReq req = take_request(fake, ep, {0, "secret", "169.254.77.20", 40001});
  Poisoned small;
  auto r = req.copy_private_data(small.span().first(55));
  REQUIRE_FALSE(r);
  check_inval(r.error(), "ConnReq::copy_private_data", "too small");
  CHECK(small.untouched());
  Poisoned big;
  auto n = req.copy_private_data(big.span());
  REQUIRE(n);
  CHECK(*n == 56);
  CHECK(as_text(std::span<const std::byte>(big.bytes).first(*n)) == "secret");
  CHECK(big.bytes[56] == std::byte{0xAB});
}

TEST_CASE("a moved-from ConnReq and PendingConnReq: every call is inval", "[conn_req][moved]") {
  fake::FakeProvider fake;
  Peer peer = open_peer(fake);
  ConnReq req = outgoing(peer);
  ConnReq other = std::move(req);
  const auto mark = fake.mark();
  CHECK_FALSE(req);
  check_inval(req.is_incoming().error(), "ConnReq::is_incoming");
  check_inval(req.private_data().error(), "ConnReq::private_data");
  Poisoned buf;
  check_inval(req.copy_private_data(buf.span()).error(), "ConnReq::copy_private_data");
  CHECK(buf.untouched());
  check_inval(req.peer_address().error(), "ConnReq::peer_address");
  check_inval(req.peer_port().error(), "ConnReq::peer_port");
  check_inval(req.device().error(), "ConnReq::device");
  check_inval(req.qp_num().error(), "ConnReq::qp_num");
  check_inval(std::move(req).connect().error(), "ConnReq::connect");
  check_inval(std::move(req).reject().error(), "ConnReq::reject");
  check_inval(std::move(req).close().error(), "ConnReq::close");

  auto pending = ConnReq::start(peer, "169.254.77.9", "7471");
  REQUIRE(pending);
  PendingConnReq taken = std::move(*pending);
  const auto mark2 = fake.mark();
  check_inval(pending->fd().error(), "PendingConnReq::fd");
  check_inval(std::move(*pending).try_wait().error(), "PendingConnReq::try_wait");
  check_inval(std::move(*pending).wait_for(1ms).error(), "PendingConnReq::wait_for");
  check_inval(std::move(*pending).wait().error(), "PendingConnReq::wait");
  CHECK(fake.calls_since(mark2).empty());
  CHECK(fake.calls_since(mark).size() == fake.calls_since(mark).size());
}

}  // namespace conn_req_test
