// The log hook: each place where rpmapp releases something without being able to return
// the failure (destructors, teardown after a failure, events acknowledged and not
// reported) reports it through set_log_function, at the documented level and `where`.
#include "test_util.hpp"

#include <arpa/inet.h>

#include <atomic>
#include <mutex>
#include <ostream>
#include <thread>

namespace log_test {

using namespace test;
using namespace std::chrono_literals;

namespace {

struct Record {
  LogLevel level;
  std::string where;
  std::string message;
  friend bool operator==(const Record&, const Record&) = default;
  friend std::ostream& operator<<(std::ostream& out, const Record& r) {
    return out << '{' << to_string(r.level) << ", " << r.where << ", " << r.message << '}';
  }
};

std::mutex g_mutex;
std::vector<Record> g_records;

void record(LogLevel level, std::string_view where, std::string_view message) noexcept {
  try {
    std::lock_guard lock(g_mutex);
    g_records.push_back({level, std::string(where), std::string(message)});
  } catch (...) {
  }
}

/// Installs `record` with `threshold` for its lifetime; back to the defaults (no function,
/// threshold warning) when it goes, whatever the test did.
class LogCapture {
 public:
  explicit LogCapture(LogLevel threshold = LogLevel::debug) {
    take();
    set_log_threshold(threshold);
    set_log_function(&record);
  }
  ~LogCapture() {
    set_log_function(nullptr);
    set_log_threshold(LogLevel::warning);
    take();
  }
  LogCapture(const LogCapture&) = delete;
  LogCapture& operator=(const LogCapture&) = delete;

  /// The records so far (and forgets them).
  std::vector<Record> take() {
    std::lock_guard lock(g_mutex);
    return std::exchange(g_records, {});
  }
};

/// The message of the injected failure of `call` (kErr), as the log function gets it.
std::string failed(const char* call) { return detail::provider_error(call, kErr).message(); }

Record warning(const char* where, const char* call) { return {LogLevel::warning, where, failed(call)}; }
Record notice(const char* where, const char* call) { return {LogLevel::notice, where, failed(call)}; }

}  // namespace

TEST_CASE("log: nothing is installed by default, the threshold is warning", "[log]") {
  CHECK(detail::log_state().function.load() == nullptr);
  CHECK(log_threshold() == LogLevel::warning);
  CHECK_FALSE(detail::log_enabled(LogLevel::fatal));
  CHECK(to_string(LogLevel::notice) == "notice");
}

TEST_CASE("Endpoint::next_conn_req: ADDR_CHANGE (a bonding failover) is acknowledged and "
          "logged, and the wait goes on to the next request",
          "[log][endpoint]") {
  fake::FakeProvider fake;
  {
    Peer peer = open_peer(fake);
    Endpoint ep = listen_on(peer, "169.254.77.1");
    LogCapture capture;
    fake.inject_event(*ep.fd(), RDMA_CM_EVENT_ADDR_CHANGE);
    auto none = ep.try_next_conn_req();
    REQUIRE_FALSE(none);
    CHECK(none.error().code() == errc::no_event);
    fake.inject_event(*ep.fd(), RDMA_CM_EVENT_ADDR_CHANGE);
    fake.inject_connect_request(*ep.fd(), {0, "after the failover"});
    auto req = ep.try_next_conn_req();
    REQUIRE(req);
    CHECK(as_text(*req->private_data()).substr(0, 18) == "after the failover");
    const Record logged{LogLevel::notice, "Endpoint::try_next_conn_req",
                        "ADDR_CHANGE event: the address's device changed its hardware address (a "
                        "bonding failover): the listener goes on"};
    CHECK(capture.take() == std::vector<Record>{logged, logged});
  }
  fake.expect_clean();
}

TEST_CASE("log: the success paths log nothing, even at debug", "[log]") {
  LogCapture capture;
  fake::FakeProvider fake;
  {
    Peer peer = open_peer(fake);
    Endpoint ep = listen_on(peer, "169.254.77.1");
    std::array<std::byte, 64> memory{};
    auto mr = MrLocal::reg(peer, memory.data(), memory.size(), MrUsage::send);
    REQUIRE(mr);
    auto srq = Srq::create(peer);
    REQUIRE(srq);
    ConnReq incoming = take_request(fake, ep);
    Conn accepted = *std::move(incoming).connect();
    Conn conn = connect_out(peer);
    fake.inject_event(*conn.fd(), RDMA_CM_EVENT_DISCONNECTED);
    CHECK(*conn.try_next_event() == ConnEvent::closed);
    CHECK(std::move(accepted).close());
    auto pending = ConnReq::start(peer, "169.254.77.9", "7471");
    REQUIRE(pending);
    Endpoint shared = *Endpoint::listen_shared(peer, "169.254.77.1", "7472");
  }
  fake.expect_clean();
  CHECK(capture.take().empty());
}

TEST_CASE("log: ~Conn reports a failed release (warning), the later ones as notice", "[log][conn]") {
  LogCapture capture;
  fake::FakeProvider fake;
  {
    Peer peer = open_peer(fake);
    SECTION("one failure") {
      {
        Conn conn = connect_out(peer);
        fake.fail("ibv_destroy_cq", kErr);
      }
      CHECK(capture.take() == std::vector<Record>{warning("Conn::~Conn", "ibv_destroy_cq")});
    }
    SECTION("three failures: the first is the warning") {
      {
        Conn conn = connect_out(peer);
        fake.fail("ibv_destroy_cq", kErr);
        fake.fail("ibv_destroy_comp_channel", kErr);
        fake.fail("rdma_destroy_id", kErr);
      }
      CHECK(capture.take() == std::vector<Record>{notice("Conn::~Conn", "ibv_destroy_comp_channel"),
                                                  notice("Conn::~Conn", "rdma_destroy_id"),
                                                  warning("Conn::~Conn", "ibv_destroy_cq")});
    }
    SECTION("move assignment releases the old connection") {
      Conn conn = connect_out(peer);
      Conn other = connect_out(peer);
      fake.fail("rdma_destroy_id", kErr);
      conn = std::move(other);
      CHECK(capture.take() == std::vector<Record>{warning("Conn::operator=", "rdma_destroy_id")});
      CHECK(static_cast<bool>(conn));
    }
  }
  fake.expect_clean();
  CHECK(capture.take().empty());
}

TEST_CASE("log: Conn::close returns the first failure and logs the later ones (notice)", "[log][conn]") {
  LogCapture capture;
  fake::FakeProvider fake;
  {
    Peer peer = open_peer(fake);
    Conn conn = connect_out(peer);
    fake.fail("ibv_destroy_cq", kErr);
    fake.fail("rdma_destroy_id", kErr);
    auto closed = std::move(conn).close();
    REQUIRE_FALSE(closed);
    check_injected(closed.error(), "ibv_destroy_cq", kErr);
    CHECK(capture.take() == std::vector<Record>{notice("Conn::close", "rdma_destroy_id")});
  }
  fake.expect_clean();
}

TEST_CASE("log: the second end-of-connection event is debug", "[log][conn]") {
  fake::FakeProvider fake;
  {
    Peer peer = open_peer(fake);
    Conn conn = connect_out(peer);
    SECTION("at debug it is logged, once, under the call that took it") {
      LogCapture capture(LogLevel::debug);
      fake.inject_event(*conn.fd(), RDMA_CM_EVENT_DISCONNECTED);
      fake.inject_event(*conn.fd(), RDMA_CM_EVENT_TIMEWAIT_EXIT);
      CHECK(*conn.next_event() == ConnEvent::closed);
      CHECK(capture.take().empty());
      CHECK(conn.try_next_event().error() == errc::no_event);
      CHECK(capture.take() ==
            std::vector<Record>{{LogLevel::debug, "Conn::try_next_event",
                                 "TIMEWAIT_EXIT event: the second end of the connection, "
                                 "acknowledged and not reported"}});
    }
    SECTION("at the default threshold it is not passed on") {
      LogCapture capture(LogLevel::warning);
      fake.inject_event(*conn.fd(), RDMA_CM_EVENT_TIMEWAIT_EXIT);
      fake.inject_event(*conn.fd(), RDMA_CM_EVENT_DISCONNECTED);
      CHECK(*conn.next_event_for(100ms) == ConnEvent::closed);
      CHECK(conn.next_event_for(10ms).error() == errc::no_event);
      CHECK(capture.take().empty());
    }
  }
  fake.expect_clean();
}

TEST_CASE("log: an event a failed call leaves to its deleter names the call", "[log][conn]") {
  LogCapture capture;
  fake::FakeProvider fake;
  {
    Peer peer = open_peer(fake);
    Endpoint ep = listen_on(peer, "169.254.77.1");
    fake.inject_connect_request(*ep.fd(), {});
    fake.fail("ibv_create_cq", kErr);
    fake.fail("rdma_ack_cm_event", kErr);
    fake.fail("ibv_destroy_comp_channel", kErr);
    auto req = ep.next_conn_req();
    REQUIRE_FALSE(req);
    check_injected(req.error(), "ibv_create_cq", kErr);
    // The event goes first (rdma_destroy_id waits for its acknowledgement), then the
    // request's resources.
    CHECK(capture.take() ==
          std::vector<Record>{notice("Endpoint::next_conn_req", "rdma_ack_cm_event"),
                              notice("Endpoint::next_conn_req", "ibv_destroy_comp_channel")});
    CHECK(fake.rejects.size() == 1);  // the request was still rejected
  }
  fake.expect_clean();
}

TEST_CASE("log: ConnReq's destructor, reject, connect and move assignment", "[log][conn_req]") {
  LogCapture capture;
  fake::FakeProvider fake;
  {
    Peer peer = open_peer(fake);
    Endpoint ep = listen_on(peer, "169.254.77.1");
    SECTION("~ConnReq: the reject of a dropped incoming request") {
      { ConnReq req = take_request(fake, ep); fake.fail("rdma_reject", kErr); }
      CHECK(capture.take() == std::vector<Record>{warning("ConnReq::~ConnReq", "rdma_reject")});
    }
    SECTION("~ConnReq: an outgoing request") {
      { ConnReq req = outgoing(peer); fake.fail("ibv_destroy_cq", kErr); }
      CHECK(capture.take() == std::vector<Record>{warning("ConnReq::~ConnReq", "ibv_destroy_cq")});
    }
    SECTION("reject: the reject's failure is returned, the release's logged") {
      ConnReq req = take_request(fake, ep);
      fake.fail("rdma_reject", kErr);
      fake.fail("rdma_destroy_id", kErr);
      auto rejected = std::move(req).reject();
      REQUIRE_FALSE(rejected);
      check_injected(rejected.error(), "rdma_reject", kErr);
      CHECK(capture.take() == std::vector<Record>{notice("ConnReq::reject", "rdma_destroy_id")});
    }
    SECTION("connect: a failed accept releases the request; its failures are notice") {
      ConnReq req = take_request(fake, ep);
      fake.fail("rdma_accept", kErr);
      fake.fail("ibv_destroy_cq", kErr);
      auto conn = std::move(req).connect();
      REQUIRE_FALSE(conn);
      check_injected(conn.error(), "rdma_accept", kErr);
      CHECK(capture.take() == std::vector<Record>{notice("ConnReq::connect", "ibv_destroy_cq")});
    }
    SECTION("close: the later failures") {
      ConnReq req = outgoing(peer);
      fake.fail("ibv_destroy_cq", kErr);
      fake.fail("ibv_destroy_comp_channel", kErr);
      auto closed = std::move(req).close();
      REQUIRE_FALSE(closed);
      check_injected(closed.error(), "ibv_destroy_cq", kErr);
      CHECK(capture.take() == std::vector<Record>{notice("ConnReq::close", "ibv_destroy_comp_channel")});
    }
    SECTION("move assignment") {
      ConnReq req = outgoing(peer);
      ConnReq other = outgoing(peer);
      fake.fail("rdma_destroy_id", kErr);
      req = std::move(other);
      CHECK(capture.take() == std::vector<Record>{warning("ConnReq::operator=", "rdma_destroy_id")});
    }
  }
  fake.expect_clean();
  CHECK(capture.take().empty());
}

TEST_CASE("log: PendingConnReq's destructor and failed resolution", "[log][conn_req]") {
  LogCapture capture;
  fake::FakeProvider fake;
  {
    Peer peer = open_peer(fake);
    SECTION("~PendingConnReq") {
      fake.auto_resolve = false;
      {
        auto pending = ConnReq::start(peer, "169.254.77.9", "7471");
        REQUIRE(pending);
        fake.fail("rdma_destroy_id", kErr);
      }
      CHECK(capture.take() ==
            std::vector<Record>{warning("PendingConnReq::~PendingConnReq", "rdma_destroy_id")});
      fake.deliver_held();
    }
    SECTION("a failed resolution: the acknowledgement and the release are notice") {
      fake.addr_event = RDMA_CM_EVENT_ADDR_ERROR;
      fake.addr_status = -EHOSTUNREACH;
      auto pending = ConnReq::start(peer, "169.254.77.9", "7471");
      REQUIRE(pending);
      fake.fail("rdma_ack_cm_event", kErr);
      fake.fail("rdma_destroy_id", kErr);
      auto req = std::move(*pending).wait_for(100ms);
      REQUIRE_FALSE(req);
      CHECK(req.error().call() == "rdma_resolve_addr");
      CHECK(capture.take() ==
            std::vector<Record>{notice("PendingConnReq::wait_for", "rdma_ack_cm_event"),
                                notice("PendingConnReq::wait_for", "rdma_destroy_id")});
    }
    SECTION("ConnReq::start failing after the id was made") {
      fake.fail("rdma_resolve_addr", kErr);
      fake.fail("rdma_destroy_id", kErr);
      auto pending = ConnReq::start(peer, "169.254.77.9", "7471");
      REQUIRE_FALSE(pending);
      check_injected(pending.error(), "rdma_resolve_addr", kErr);
      CHECK(capture.take() == std::vector<Record>{notice("ConnReq::start", "rdma_destroy_id")});
    }
  }
  fake.expect_clean();
}

TEST_CASE("log: Endpoint's destructor, shutdown, move assignment and a failed listen",
          "[log][endpoint]") {
  LogCapture capture;
  fake::FakeProvider fake;
  {
    Peer peer = open_peer(fake);
    SECTION("~Endpoint") {
      { Endpoint ep = listen_on(peer, "169.254.77.1"); fake.fail("rdma_destroy_id", kErr); }
      CHECK(capture.take() == std::vector<Record>{warning("Endpoint::~Endpoint", "rdma_destroy_id")});
    }
    SECTION("~Endpoint of a shared listener: only the last handle stops it") {
      {
        Endpoint a = *Endpoint::listen_shared(peer, "169.254.77.1", "7471");
        {
          Endpoint b = *Endpoint::listen_shared(peer, "169.254.77.1", "7471");
          fake.fail("rdma_destroy_id", kErr);
        }
        CHECK(capture.take().empty());
        CHECK(fake.pending_faults() == 1);
      }
      CHECK(capture.take() == std::vector<Record>{warning("Endpoint::~Endpoint", "rdma_destroy_id")});
    }
    SECTION("pending requests rejected (info), other events dropped (notice)") {
      {
        Endpoint ep = listen_on(peer, "169.254.77.1");
        fake.inject_connect_request(*ep.fd(), {});
        fake.inject_event(*ep.fd(), RDMA_CM_EVENT_ADDR_CHANGE);
        fake.fail("rdma_reject", kErr);
      }
      CHECK(capture.take() ==
            std::vector<Record>{
                {LogLevel::info, "Endpoint::~Endpoint",
                 "CONNECT_REQUEST event: a pending request, rejected: the listener stops"},
                {LogLevel::notice, "Endpoint::~Endpoint",
                 "ADDR_CHANGE event: acknowledged and dropped: the listener stops"},
                warning("Endpoint::~Endpoint", "rdma_reject")});
    }
    SECTION("shutdown returns the first failure and logs the later ones") {
      Endpoint ep = listen_on(peer, "169.254.77.1");
      fake.inject_connect_request(*ep.fd(), {});
      fake.fail("rdma_reject", kErr);
      fake.fail("rdma_destroy_id", kErr, 2);  // the listener's own
      auto done = std::move(ep).shutdown();
      REQUIRE_FALSE(done);
      check_injected(done.error(), "rdma_reject", kErr);
      CHECK(capture.take() ==
            std::vector<Record>{
                {LogLevel::info, "Endpoint::shutdown",
                 "CONNECT_REQUEST event: a pending request, rejected: the listener stops"},
                notice("Endpoint::shutdown", "rdma_destroy_id")});
    }
    SECTION("move assignment") {
      Endpoint ep = listen_on(peer, "169.254.77.1");
      Endpoint other = listen_on(peer, "169.254.77.1", "7472");
      fake.fail("rdma_destroy_id", kErr);
      ep = std::move(other);
      CHECK(capture.take() == std::vector<Record>{warning("Endpoint::operator=", "rdma_destroy_id")});
      CHECK(*ep.port() == 7472);
    }
    SECTION("a failed listen releases what it made: notice") {
      fake.fail("rdma_listen", kErr);
      fake.fail("rdma_destroy_id", kErr);
      auto ep = Endpoint::listen(peer, "169.254.77.1", "7471");
      REQUIRE_FALSE(ep);
      check_injected(ep.error(), "rdma_listen", kErr);
      CHECK(capture.take() == std::vector<Record>{notice("Endpoint::listen", "rdma_destroy_id")});
    }
  }
  fake.expect_clean();
  CHECK(capture.take().empty());
}

TEST_CASE("log: Peer's destructor, close, last reference and failed open", "[log][peer]") {
  LogCapture capture;
  fake::FakeProvider fake;
  SECTION("~Peer: both failures") {
    {
      Peer peer = open_peer(fake);
      fake.fail("ibv_dereg_mr", kErr);
      fake.fail("ibv_dealloc_pd", kErr);
    }
    CHECK(capture.take() == std::vector<Record>{notice("Peer::~Peer", "ibv_dealloc_pd"),
                                                warning("Peer::~Peer", "ibv_dereg_mr")});
  }
  SECTION("close: the first is returned") {
    Peer peer = open_peer(fake);
    fake.fail("ibv_dereg_mr", kErr);
    fake.fail("ibv_dealloc_pd", kErr);
    auto closed = std::move(peer).close();
    REQUIRE_FALSE(closed);
    check_injected(closed.error(), "ibv_dereg_mr", kErr);
    CHECK(capture.take() == std::vector<Record>{notice("Peer::close", "ibv_dealloc_pd")});
  }
  SECTION("a registration outlives the Peer: the domain goes with its last reference") {
    {
      std::array<std::byte, 64> memory{};
      std::optional<MrLocal> mr;
      {
        Peer peer = open_peer(fake);
        mr = *MrLocal::reg(peer, memory.data(), memory.size(), MrUsage::recv);
      }
      CHECK(capture.take().empty());
      CHECK(fake.alive("pd") == 1);
      fake.fail("ibv_dealloc_pd", kErr);
    }
    CHECK(capture.take() == std::vector<Record>{warning("Peer (last reference)", "ibv_dealloc_pd")});
  }
  SECTION("move assignment") {
    Peer peer = open_peer(fake);
    Peer other = open_peer(fake, 1);
    fake.fail("ibv_dealloc_pd", kErr);
    peer = std::move(other);
    CHECK(capture.take() == std::vector<Record>{warning("Peer::operator=", "ibv_dealloc_pd")});
  }
  SECTION("a failed open releases the domain: notice") {
    fake.fail("ibv_reg_mr", kErr);
    fake.fail("ibv_dealloc_pd", kErr);
    auto peer = Peer::open(fake.context(0));
    REQUIRE_FALSE(peer);
    check_injected(peer.error(), "ibv_reg_mr", kErr);
    CHECK(capture.take() == std::vector<Record>{notice("Peer::open", "ibv_dealloc_pd")});
  }
  SECTION("from_address: the id it looked through") {
    fake.fail("rdma_destroy_id", kErr);
    {
      auto peer = Peer::from_address("169.254.77.1", AddressKind::local);
      REQUIRE(peer);
    }
    CHECK(capture.take() == std::vector<Record>{warning("Peer::from_address", "rdma_destroy_id")});
  }
  fake.expect_clean();
  CHECK(capture.take().empty());
}

TEST_CASE("log: MrLocal's destructor and move assignment", "[log][mr]") {
  LogCapture capture;
  fake::FakeProvider fake;
  {
    Peer peer = open_peer(fake);
    std::array<std::byte, 64> memory{};
    SECTION("~MrLocal") {
      {
        auto mr = MrLocal::reg(peer, memory.data(), memory.size(), MrUsage::send);
        REQUIRE(mr);
        fake.fail("ibv_dereg_mr", kErr);
      }
      CHECK(capture.take() == std::vector<Record>{warning("MrLocal::~MrLocal", "ibv_dereg_mr")});
    }
    SECTION("move assignment") {
      MrLocal mr = *MrLocal::reg(peer, memory.data(), 32, MrUsage::send);
      MrLocal other = *MrLocal::reg(peer, memory.data() + 32, 32, MrUsage::recv);
      fake.fail("ibv_dereg_mr", kErr);
      mr = std::move(other);
      CHECK(capture.take() == std::vector<Record>{warning("MrLocal::operator=", "ibv_dereg_mr")});
      CHECK(*mr.usage() == MrUsage::recv);
    }
  }
  fake.expect_clean();
  CHECK(capture.take().empty());
}

TEST_CASE("log: Srq's destructor, close, last reference and failed create", "[log][srq]") {
  LogCapture capture;
  fake::FakeProvider fake;
  {
    Peer peer = open_peer(fake);
    SECTION("~Srq: all three fail") {
      {
        Srq srq = *Srq::create(peer);
        fake.fail("ibv_destroy_cq", kErr);
        fake.fail("ibv_destroy_comp_channel", kErr);
        fake.fail("ibv_destroy_srq", kErr);
      }
      CHECK(capture.take() == std::vector<Record>{notice("Srq::~Srq", "ibv_destroy_comp_channel"),
                                                  notice("Srq::~Srq", "ibv_destroy_srq"),
                                                  warning("Srq::~Srq", "ibv_destroy_cq")});
    }
    SECTION("close") {
      Srq srq = *Srq::create(peer);
      fake.fail("ibv_destroy_srq", kErr);
      fake.fail("ibv_destroy_cq", kErr);
      auto closed = std::move(srq).close();
      REQUIRE_FALSE(closed);
      check_injected(closed.error(), "ibv_destroy_cq", kErr);
      CHECK(capture.take() == std::vector<Record>{notice("Srq::close", "ibv_destroy_srq")});
    }
    SECTION("a connection outlives the Srq") {
      {
        std::optional<Conn> conn;
        {
          Srq srq = *Srq::create(peer);
          ConnConfig cfg;
          cfg.srq = &srq;
          auto req = ConnReq::to(peer, "169.254.77.9", "7471", cfg);
          REQUIRE(req);
          conn = *std::move(*req).connect();
        }
        CHECK(capture.take().empty());
        fake.fail("ibv_destroy_srq", kErr);
      }
      CHECK(capture.take() == std::vector<Record>{warning("Srq (last reference)", "ibv_destroy_srq")});
    }
    SECTION("move assignment") {
      Srq srq = *Srq::create(peer, {10, 0});
      Srq other = *Srq::create(peer, {10, 0});
      fake.fail("ibv_destroy_srq", kErr);
      srq = std::move(other);
      CHECK(capture.take() == std::vector<Record>{warning("Srq::operator=", "ibv_destroy_srq")});
    }
    SECTION("a failed create releases the queue: notice") {
      fake.fail("ibv_create_cq", kErr);
      fake.fail("ibv_destroy_srq", kErr);
      auto srq = Srq::create(peer);
      REQUIRE_FALSE(srq);
      check_injected(srq.error(), "ibv_create_cq", kErr);
      CHECK(capture.take() == std::vector<Record>{notice("Srq::create", "ibv_destroy_srq")});
    }
  }
  fake.expect_clean();
  CHECK(capture.take().empty());
}

TEST_CASE("log: a handle released by its own deleter names the handle", "[log][handles]") {
  LogCapture capture;
  fake::FakeProvider fake;
  const detail::Provider& p = detail::provider();
  ibv_context* context = fake.context(0);
  SECTION("every deleter") {
    {
      detail::ProtectionDomain pd(p.alloc_pd(context));
      std::array<std::byte, 64> memory{};
      detail::MemoryRegion mr(p.reg_mr(pd.get(), memory.data(), memory.size(), IBV_ACCESS_LOCAL_WRITE));
      ibv_srq_init_attr attr{};
      attr.attr.max_wr = 4;
      attr.attr.max_sge = 1;
      detail::SharedReceiveQueue srq(p.create_srq(pd.get(), &attr));
      detail::CompChannel channel(p.create_comp_channel(context));
      detail::CompletionQueue cq(p.create_cq(context, 4, nullptr, channel.get(), 0));
      detail::EventChannel events(p.create_event_channel());
      rdma_cm_id* raw = nullptr;
      REQUIRE(p.create_id(events.get(), &raw, nullptr, RDMA_PS_TCP) == 0);
      detail::CmId id(raw);
      REQUIRE((pd && mr && srq && channel && cq && events));
      for (const char* call : {"ibv_dealloc_pd", "ibv_dereg_mr", "ibv_destroy_srq",
                               "ibv_destroy_comp_channel", "ibv_destroy_cq", "rdma_destroy_id"})
        fake.fail(call, kErr);
    }  // released in reverse order of declaration
    CHECK(capture.take() ==
          std::vector<Record>{warning("detail::CmId", "rdma_destroy_id"),
                              warning("detail::CompletionQueue", "ibv_destroy_cq"),
                              warning("detail::CompChannel", "ibv_destroy_comp_channel"),
                              warning("detail::SharedReceiveQueue", "ibv_destroy_srq"),
                              warning("detail::MemoryRegion", "ibv_dereg_mr"),
                              warning("detail::ProtectionDomain", "ibv_dealloc_pd")});
  }
  SECTION("a CM event before its cm_id, and an owner's cm_id released by its backstop") {
    {
      detail::EventChannel events(p.create_event_channel());
      rdma_cm_id* raw = nullptr;
      REQUIRE(p.create_id(events.get(), &raw, nullptr, RDMA_PS_TCP) == 0);
      detail::OwnedCmId owned(raw);
      REQUIRE(p.create_id(events.get(), &raw, nullptr, RDMA_PS_TCP) == 0);
      detail::CmId id(raw);
      sockaddr_in dst{};
      dst.sin_family = AF_INET;
      dst.sin_port = htons(7471);
      REQUIRE(inet_pton(AF_INET, "169.254.77.9", &dst.sin_addr) == 1);
      REQUIRE(p.resolve_addr(id.get(), nullptr, reinterpret_cast<sockaddr*>(&dst), 1000) == 0);
      rdma_cm_event* raw_event = nullptr;
      REQUIRE(p.get_cm_event(events.get(), &raw_event) == 0);
      detail::CmEvent event(raw_event);  // acknowledged before the id is destroyed
      fake.fail("rdma_ack_cm_event", kErr);
      fake.fail("rdma_destroy_id", kErr);
      fake.fail("rdma_destroy_id", kErr);
    }
    CHECK(capture.take() == std::vector<Record>{warning("detail::CmEvent", "rdma_ack_cm_event"),
                                                warning("detail::CmId", "rdma_destroy_id"),
                                                warning("detail::CmId", "rdma_destroy_id")});
  }
  fake.expect_clean();
  CHECK(capture.take().empty());
}

TEST_CASE("log: nothing reaches a function below the threshold, or no function", "[log]") {
  fake::FakeProvider fake;
  Peer peer = open_peer(fake);
  SECTION("threshold error: a warning is not passed on") {
    LogCapture capture(LogLevel::error);
    { Conn conn = connect_out(peer); fake.fail("rdma_destroy_id", kErr); }
    CHECK(fake.pending_faults() == 0);
    CHECK(capture.take().empty());
  }
  SECTION("threshold warning: the warning is, the notice is not") {
    LogCapture capture(LogLevel::warning);
    {
      Conn conn = connect_out(peer);
      fake.fail("ibv_destroy_cq", kErr);
      fake.fail("rdma_destroy_id", kErr);
    }
    CHECK(capture.take() == std::vector<Record>{warning("Conn::~Conn", "ibv_destroy_cq")});
  }
  SECTION("no function installed") {
    LogCapture capture(LogLevel::debug);
    set_log_function(nullptr);
    CHECK_FALSE(detail::log_enabled(LogLevel::fatal));
    {
      Conn conn = connect_out(peer);
      fake.fail("ibv_destroy_cq", kErr);
      fake.fail("rdma_destroy_id", kErr);
    }
    CHECK(fake.pending_faults() == 0);
    CHECK(capture.take().empty());
  }
}

namespace {
std::atomic<long> g_first_calls{0}, g_second_calls{0};
void count_first(LogLevel, std::string_view where, std::string_view message) noexcept {
  if (where == "thread" && message.starts_with("ibv_destroy_cq: provider error")) ++g_first_calls;
}
void count_second(LogLevel, std::string_view where, std::string_view message) noexcept {
  if (where == "thread" && message.starts_with("ibv_destroy_cq: provider error")) ++g_second_calls;
}
}  // namespace

TEST_CASE("log: threads log while another switches the function and the threshold", "[log][threads]") {
  struct Reset {
    ~Reset() {
      set_log_function(nullptr);
      set_log_threshold(LogLevel::warning);
    }
  } reset;
  g_first_calls = 0;
  g_second_calls = 0;
  constexpr long per_thread = 20000;
  std::atomic<bool> go{false};
  auto worker = [&] {
    const Error error = detail::provider_error("ibv_destroy_cq", kErr);
    while (!go.load()) std::this_thread::yield();
    for (long i = 0; i < per_thread; ++i) detail::log(LogLevel::warning, "thread", error);
  };
  std::thread a(worker), b(worker);
  go = true;
  for (int i = 0; i < 2000; ++i) {
    set_log_function(i % 3 == 0 ? &count_first : i % 3 == 1 ? &count_second : nullptr);
    set_log_threshold(i % 2 == 0 ? LogLevel::debug : LogLevel::error);
    std::this_thread::yield();
  }
  a.join();
  b.join();
  // Every call reached at most one function, with the whole message.
  CHECK(g_first_calls + g_second_calls <= 2 * per_thread);
  // Once installed and enabled, every call gets through.
  set_log_threshold(LogLevel::warning);
  set_log_function(&count_first);
  const long before = g_first_calls;
  std::thread c(worker), d(worker);
  c.join();
  d.join();
  CHECK(g_first_calls - before == 2 * per_thread);
}

}  // namespace log_test
