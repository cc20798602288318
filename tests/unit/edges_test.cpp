// Edges that planted one-line bugs slipped past: ports at the limits, queue sizes, retry
// counts, long call names, and memory allocation failing inside every call that allocates.
#include "forwarding_provider.hpp"
#include "test_util.hpp"


#include <cstdlib>
#include <new>
#include <optional>
#include <type_traits>
#include <vector>

// ---- failing the nth allocation ----------------------------------------------------------
// The global operator new of this test binary counts down while armed and throws
// std::bad_alloc when the count reaches zero. The fake provider's own allocations are not
// counted (PausedProvider below), so the count walks only the library's allocation sites.

namespace {
thread_local long alloc_countdown = 0;  // 0: disarmed
thread_local int alloc_paused = 0;

void* counted_alloc(std::size_t size) {
  if (alloc_countdown > 0 && alloc_paused == 0 && --alloc_countdown == 0) throw std::bad_alloc();
  if (size == 0) size = 1;
  void* p = std::malloc(size);
  if (p == nullptr) throw std::bad_alloc();
  return p;
}
}  // namespace

void* operator new(std::size_t size) { return counted_alloc(size); }
void* operator new[](std::size_t size) { return counted_alloc(size); }
void* operator new(std::size_t size, const std::nothrow_t&) noexcept {
  try {
    return counted_alloc(size);
  } catch (...) {
    return nullptr;
  }
}
void* operator new[](std::size_t size, const std::nothrow_t& tag) noexcept {
  return operator new(size, tag);
}
void operator delete(void* p) noexcept { std::free(p); }
void operator delete[](void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t) noexcept { std::free(p); }
void operator delete(void* p, const std::nothrow_t&) noexcept { std::free(p); }
void operator delete[](void* p, const std::nothrow_t&) noexcept { std::free(p); }

// the replacements above are global; the rest is this file's own (the unity build batches files)
namespace edges_test {

using namespace test;

namespace {

/// While alive, the `nth` allocation made outside the provider fails.
struct FailAllocation {
  explicit FailAllocation(long nth) { alloc_countdown = nth; }
  ~FailAllocation() { alloc_countdown = 0; }
  FailAllocation(const FailAllocation&) = delete;
  FailAllocation& operator=(const FailAllocation&) = delete;
  bool fired() const { return alloc_countdown == 0; }
};

struct PauseAllocationFailures {
  PauseAllocationFailures() { ++alloc_paused; }
  ~PauseAllocationFailures() { --alloc_paused; }
};

// The fake's bookkeeping is not the code under test: its allocations do not count.
using PausedProvider = ForwardingProvider<PauseAllocationFailures>;

/// Runs `attempt(fake)` (which arms FailAllocation(n) around the call under test and
/// returns whether the call succeeded) for n = 1, 2, ... until it succeeds. Each failing
/// run must have been nomem naming `call` (checked by `attempt`) and leave the fake clean.
/// Returns how many allocations the call makes before it succeeds.
template <class Attempt> long fail_each_allocation(Attempt attempt) {
  for (long n = 1; n < 200; ++n) {
    INFO("failing allocation #" << n);
    fake::FakeProvider fake;
    bool succeeded = false;
    {
      PausedProvider paused;
      succeeded = attempt(fake, n);
    }
    fake.expect_clean();
    if (succeeded) return n - 1;
  }
  FAIL("the call still failed after 200 allocation failures");
  return -1;
}

void check_nomem(const Error& e, std::string_view call) {
  INFO("error: " << e.message());
  CHECK(e.code() == errc::nomem);
  CHECK(e.sys_errno() == ENOMEM);
  CHECK(e.call() == call);
}

/// Runs `call()` with the nth allocation failing; checks a failure is nomem naming `name`.
template <class Call> bool armed(long n, std::string_view name, Call call) {
  std::optional<decltype(call())> result;
  {
    FailAllocation failing(n);
    result.emplace(call());
  }
  if (*result) return true;
  check_nomem(result->error(), name);
  return false;
}

}  // namespace

TEST_CASE("issue 8.m: an allocation failing inside Endpoint::listen is nomem naming it",
          "[edges][nomem]") {
  for (bool shared : {false, true}) {
    INFO("listen_shared: " << shared);
    const long allocations = fail_each_allocation([&](fake::FakeProvider& fake, long n) {
      Peer peer = open_peer(fake);
      return armed(n, shared ? "Endpoint::listen_shared" : "Endpoint::listen", [&] {
        return shared ? Endpoint::listen_shared(peer, "169.254.77.1", "7471")
                      : Endpoint::listen(peer, "169.254.77.1", "7471");
      });
    });
    CHECK(allocations >= 1);
  }
}

TEST_CASE("issue 8.m: an allocation failing inside next_conn_req is nomem; the request kept or rejected",
          "[edges][nomem]") {
  const long allocations = fail_each_allocation([&](fake::FakeProvider& fake, long n) {
    Peer peer = open_peer(fake);
    Endpoint ep = listen_on(peer, "169.254.77.1");
    fake.inject_connect_request(*ep.fd(), {0, "hello"});
    const std::size_t rejects = fake.rejects.size();
    const bool ok = armed(n, "Endpoint::next_conn_req", [&] { return ep.next_conn_req(); });
    // Failing before the request is taken leaves it queued; after, it is rejected.
    if (!ok) CHECK(fake.queued(*ep.fd()) + (fake.rejects.size() - rejects) == 1);
    return ok;
  });
  CHECK(allocations >= 1);
}

TEST_CASE("issue 8.m: an allocation failing inside ConnReq::to is nomem naming it",
          "[edges][nomem]") {
  const long allocations = fail_each_allocation([&](fake::FakeProvider& fake, long n) {
    Peer peer = open_peer(fake);
    return armed(n, "ConnReq::to", [&] { return ConnReq::to(peer, "169.254.77.9", "7471"); });
  });
  CHECK(allocations >= 1);
}

TEST_CASE("issue 8.m: an allocation failing inside connect is nomem naming it",
          "[edges][nomem]") {
  for (bool incoming : {true, false}) {
    INFO("incoming: " << incoming);
    fail_each_allocation([&](fake::FakeProvider& fake, long n) {
      Peer peer = open_peer(fake);
      std::optional<Endpoint> ep;
      std::optional<ConnReq> req;
      if (incoming) {
        ep.emplace(listen_on(peer, "169.254.77.1"));
        req.emplace(take_request(fake, *ep));
      } else {
        req.emplace(outgoing(peer));
      }
      return armed(n, "ConnReq::connect", [&] { return std::move(*req).connect(as_bytes("hi")); });
    });
  }
}

TEST_CASE("issue 8.m: an allocation failing inside Conn::next_event is nomem naming it",
          "[edges][nomem]") {
  const long allocations = fail_each_allocation([&](fake::FakeProvider& fake, long n) {
    Peer peer = open_peer(fake);
    auto conn = std::move(outgoing(peer)).connect();
    REQUIRE(conn);
    fake.inject_event(*conn->fd(), RDMA_CM_EVENT_ESTABLISHED, "accepted");
    return armed(n, "Conn::next_event", [&] { return conn->next_event(); });
  });
  CHECK(allocations >= 1);
}

TEST_CASE("review 2.D: an allocation failing while EventLoop::serve takes a request reaches the "
          "handler as nomem; the request kept or rejected",
          "[edges][nomem][event_loop][review]") {
  const long allocations = fail_each_allocation([&](fake::FakeProvider& fake, long n) {
    Peer peer = open_peer(fake);
    Endpoint ep = listen_on(peer, "169.254.77.1");
    auto loop = EventLoop::create();
    REQUIRE(loop);
    std::optional<expected<ConnReq>> got;
    auto reg = loop->serve(ep, [&](expected<ConnReq> req) {
      if (!got) got.emplace(std::move(req));
    });
    REQUIRE(reg);
    fake.inject_connect_request(*ep.fd(), {0, "hello"});
    const std::size_t rejects = fake.rejects.size();
    expected<std::size_t> ran = std::size_t{0};
    {
      FailAllocation failing(n);
      ran = loop->run_once(std::chrono::milliseconds(0));
    }
    INFO((ran ? std::string() : ran.error().message()));
    REQUIRE(ran);  // not "a handler threw"
    REQUIRE(got.has_value());
    if (*got) return true;
    check_nomem(got->error(), "EventLoop::serve");
    CHECK(fake.queued(*ep.fd()) + (fake.rejects.size() - rejects) == 1);
    return false;
  });
  CHECK(allocations >= 1);
}

// ---- ports at the edges ----------------------------------------------------------------

TEST_CASE("issue 8.m: port 65535 listens and connects; longer or wrapping ports are inval",
          "[edges][inval]") {
  fake::FakeProvider fake;
  {
    Peer peer = open_peer(fake);
    {
      Endpoint ep = listen_on(peer, "169.254.77.1", "65535");
      CHECK(*ep.port() == 65535);
    }
    {
      auto req = ConnReq::to(peer, "169.254.77.9", "65535");
      REQUIRE(req);
      CHECK(*req->peer_port() == 65535);
    }
    {
      Endpoint padded = listen_on(peer, "169.254.77.1", "00080");  // five digits: still a port
      CHECK(*padded.port() == 80);
    }
    const auto mark = fake.mark();
    // 4294967296 wraps a 32-bit accumulator to 0; 4294967376 wraps it to 80.
    for (const char* port : {"4294967296", "4294967376", "000080", "65536", "99999", "100000"}) {
      INFO("port \"" << port << "\"");
      auto ep = Endpoint::listen(peer, "169.254.77.1", port);
      REQUIRE_FALSE(ep);
      check_inval(ep.error(), "Endpoint::listen", "port");
      auto shared = Endpoint::listen_shared(peer, "169.254.77.1", port);
      REQUIRE_FALSE(shared);
      check_inval(shared.error(), "Endpoint::listen_shared", "port");
      auto req = ConnReq::to(peer, "169.254.77.9", port);
      REQUIRE_FALSE(req);
      check_inval(req.error(), "ConnReq::to", "port");
    }
    CHECK(fake.calls_since(mark).empty());
  }
  fake.expect_clean();
}

// ---- queue sizes and retry counts ------------------------------------------------------

TEST_CASE("issue 8.m: distinct queue sizes reach the right queues", "[edges]") {
  ConnConfig cfg;
  cfg.cq_size = 3;
  cfg.rcq_size = 4;
  cfg.sq_size = 5;
  cfg.rq_size = 6;
  for (bool incoming : {true, false}) {
    INFO("incoming: " << incoming);
    fake::FakeProvider fake;
    {
      Peer peer = open_peer(fake);
      std::optional<Endpoint> ep;
      std::optional<ConnReq> req;
      if (incoming) {
        ep.emplace(listen_on(peer, "169.254.77.1"));
        req.emplace(take_request(fake, *ep, {}, cfg));
      } else {
        req.emplace(outgoing(peer, "169.254.77.9", cfg));
      }
      CHECK(fake.last_qp_attr.cap.max_send_wr == 5);
      CHECK(fake.last_qp_attr.cap.max_recv_wr == 6);
      auto conn = std::move(*req).connect();
      REQUIRE(conn);
      ibv_cq* cq = *conn->cq()->native();
      ibv_cq* rcq = *conn->rcq()->native();
      CHECK(cq->cqe == 3);
      CHECK(rcq->cqe == 4);
      CHECK(fake.last_qp_attr.send_cq == cq);
      CHECK(fake.last_qp_attr.recv_cq == rcq);
    }
    fake.expect_clean();
  }
}

TEST_CASE("issue 8.m: retry counts of 7 (the largest) are accepted and sent", "[edges]") {
  ConnConfig cfg;
  cfg.retry_count = 7;
  cfg.rnr_retry_count = 7;
  for (bool incoming : {true, false}) {
    INFO("incoming: " << incoming);
    fake::FakeProvider fake;
    {
      Peer peer = open_peer(fake);
      std::optional<Endpoint> ep;
      expected<ConnReq> req = unexpected(Error());
      if (incoming) {
        ep.emplace(listen_on(peer, "169.254.77.1"));
        fake.inject_connect_request(*ep->fd(), {});
        req = ep->next_conn_req(cfg);
      } else {
        req = ConnReq::to(peer, "169.254.77.9", "7471", cfg);
      }
      INFO((req ? std::string() : req.error().message()));
      REQUIRE(req);
      auto conn = std::move(*req).connect();
      REQUIRE(conn);
      CHECK(fake.last_conn_param.retry_count == 7);
      CHECK(fake.last_conn_param.rnr_retry_count == 7);
    }
    fake.expect_clean();
  }
}

// ---- Error ----------------------------------------------------------------------------

TEST_CASE("issue 8.m: a long call name is cut at max_call and leaves the reason whole",
          "[edges][error]") {
  const std::string call(Error::max_call + 40, 'c');
  const std::string reason(Error::max_reason, 'r');
  Error e(errc::provider, EIO, call, reason);
  CHECK(e.call() == call.substr(0, Error::max_call));
  CHECK(e.reason() == reason);
  Error short_reason(errc::inval, 0, call, "why");
  CHECK(short_reason.call().size() == Error::max_call);
  CHECK(short_reason.reason() == "why");
  CHECK_THAT(short_reason.message(), Catch::EndsWith(": why"));
}

// ---- the provider seam ----------------------------------------------------------------

namespace {
thread_local int calls_through_later_provider = 0;
struct CountCall {
  CountCall() { ++calls_through_later_provider; }
};
}  // namespace

TEST_CASE("issue 8.11: objects are released through the provider that made them",
          "[edges][seam]") {
  for (bool explicit_close : {false, true}) {
    INFO("explicit close: " << explicit_close);
    fake::FakeProvider fake;
    {
      std::optional<Peer> peer(open_peer(fake));
      std::optional<Endpoint> ep(listen_on(*peer, "169.254.77.1"));
      std::optional<Endpoint> shared;
      {
        auto made = Endpoint::listen_shared(*peer, "169.254.77.1", "7472");
        REQUIRE(made);
        shared.emplace(std::move(*made));
      }
      std::optional<ConnReq> incoming(take_request(fake, *ep));
      fake.inject_connect_request(*ep->fd(), {});  // left queued: shutdown must reject it
      std::optional<Conn> conn;
      {
        auto made = std::move(outgoing(*peer)).connect();
        REQUIRE(made);
        conn.emplace(std::move(*made));
      }
      std::optional<ConnReq> pending_out(outgoing(*peer));
      const auto rejects = fake.rejects.size();
      const auto mark = fake.mark();

      calls_through_later_provider = 0;
      {
        ForwardingProvider<CountCall> later;  // e.g. another test's override
        if (explicit_close) {
          CHECK(std::move(*conn).close());
          CHECK(std::move(*incoming).close());
          CHECK(std::move(*pending_out).close());
          CHECK(std::move(*ep).shutdown());
          CHECK(std::move(*shared).shutdown());
          CHECK(std::move(*peer).close());
        }
        conn.reset();
        incoming.reset();
        pending_out.reset();
        ep.reset();
        shared.reset();
        peer.reset();
      }
      INFO("calls: " << ::Catch::Detail::stringify(fake.calls_since(mark)));
      CHECK(calls_through_later_provider == 0);
      CHECK(fake.rejects.size() == rejects + 2);  // the taken request and the queued one
    }
    fake.expect_clean();
  }
}

TEST_CASE("review 2 (porting): every handle type has an empty default state, as a moved-from "
          "one, for librpma-style tables of slots",
          "[edges][moved][review]") {
  fake::FakeProvider fake;
  {
    static_assert(std::is_nothrow_default_constructible_v<Conn> && std::is_nothrow_default_constructible_v<Endpoint> &&
                  std::is_nothrow_default_constructible_v<MrLocal> && std::is_nothrow_default_constructible_v<Srq> &&
                  std::is_nothrow_default_constructible_v<Peer> && std::is_nothrow_default_constructible_v<ConnReq> &&
                  std::is_nothrow_default_constructible_v<PendingConnReq>);
    std::vector<Conn> slots(4);  // librpma's `struct rpma_conn *conns[4] = {NULL}`
    for (const Conn& slot : slots) CHECK_FALSE(slot);
    CHECK(std::move(slots[0]).close().error() == errc::inval);
    CHECK(Conn().next_event().error() == errc::inval);
    CHECK(Endpoint().next_conn_req().error() == errc::inval);
    CHECK(MrLocal().descriptor().error() == errc::inval);
    CHECK(Srq().rcq().error() == errc::inval);
    CHECK(Peer().native_flush().error() == errc::inval);
    CHECK(ConnReq().private_data().error() == errc::inval);
    CHECK(PendingConnReq().try_wait().error() == errc::inval);
    Peer peer = open_peer(fake);
    auto conn = outgoing(peer).connect();
    REQUIRE(conn);
    slots[2] = std::move(*conn);
    CHECK(slots[2]);
  }
  fake.expect_clean();
}

}  // namespace edges_test
