// Cq: get, wait / try_wait / wait_for, next (no completion lost between poll and wait),
// the shared completion channel of a connection, check(wc), provider failures (each call in
// turn, ibv_poll_cq returning a negative value or too many), events for another CQ, and how
// long bounded waits last.
#include "data_util.hpp"

#include <cstring>
#include <thread>

namespace cq_test {

using namespace test;
using namespace std::chrono_literals;

namespace {

/// ibv_poll_cq sets no errno: a negative return is a provider error that says what it was.
void check_poll_cq_returned(const Error& e, int returned) {
  INFO("error: " << e.message());
  CHECK(e.code() == errc::provider);
  CHECK(e.sys_errno() == 0);
  CHECK(e.call() == "ibv_poll_cq");
  CHECK_THAT(e.message(), Catch::Contains("returned " + std::to_string(returned)));
}

ConnConfig shared_channel_config() {
  ConnConfig cfg;
  cfg.rcq_size = 5;
  cfg.shared_completion_channel = true;
  return cfg;
}

struct Connected {
  Peer peer;
  Conn conn;
  Cq cq;
  ibv_cq* raw;
  Connected(fake::FakeProvider& fake, const ConnConfig& cfg = {})
      : peer(open_peer(fake)), conn(connected(fake, peer, cfg)), cq(*conn.cq()), raw(*cq.native()) {}
};

}  // namespace

TEST_CASE("Cq::get: the filled part; no_completion when empty", "[cq]") {
  fake::FakeProvider fake;
  {
    Connected c(fake);
    ibv_wc out[2];
    for (auto& w : out) w = completion(0xAAAA);
    const auto mark = fake.mark();
    auto empty = c.cq.get(out);
    REQUIRE_FALSE(empty);
    CHECK(empty.error().code() == errc::no_completion);
    CHECK(empty.error().call() == "ibv_poll_cq");
    CHECK(out[0].wr_id == 0xAAAA);  // untouched
    CHECK(fake.calls_since(mark) == std::vector<std::string>{"ibv_poll_cq"});

    for (std::uint64_t id : {1, 2, 3}) fake.add_completion(c.raw, completion(id));
    auto got = c.cq.get(out);
    REQUIRE(got);
    CHECK(got->data() == out);
    REQUIRE(got->size() == 2);
    CHECK(out[0].wr_id == 1);
    CHECK(out[1].wr_id == 2);
    out[1].wr_id = 0xAAAA;
    got = c.cq.get(out);
    REQUIRE(got);
    REQUIRE(got->size() == 1);
    CHECK(out[0].wr_id == 3);
    CHECK(out[1].wr_id == 0xAAAA);  // past the filled part: untouched

    check_inval(c.cq.get({}).error(), "Cq::get");
    fake.fail("ibv_poll_cq", kErr);
    auto failed = c.cq.get(out);
    REQUIRE_FALSE(failed);
    CHECK(failed.error().code() == errc::provider);
    CHECK(failed.error().call() == "ibv_poll_cq");
    CHECK_THAT(failed.error().message(), Catch::Contains("returned -" + std::to_string(kErr)));
  }
  fake.expect_clean();
}

TEST_CASE("Cq::wait: the event is acknowledged and the CQ re-armed", "[cq][wait]") {
  fake::FakeProvider fake;
  {
    Connected c(fake);
    CHECK(fake.armed(c.raw));  // armed when created
    fake.add_completion(c.raw, completion(5));
    CHECK_FALSE(fake.armed(c.raw));
    CHECK(fake.cq_events_queued(c.raw->channel) == 1);

    SECTION("the channel's fd is readable through poll") {
      pollfd pfd{*c.cq.fd(), POLLIN, 0};
      CHECK(rpmapp::detail::provider().poll(&pfd, 1, 0) == 1);
      CHECK(pfd.revents == POLLIN);
    }
    SECTION("wait / try_wait / wait_for") {
      for (int variant = 0; variant < 3; ++variant) {
        INFO("variant " << variant);
        const auto mark = fake.mark();
        auto waited = variant == 0 ? c.cq.wait() : variant == 1 ? c.cq.try_wait() : c.cq.wait_for(1s);
        REQUIRE(waited);
        auto calls = fake.calls_since(mark);
        REQUIRE(calls.size() == 4);
        CHECK(calls[1] == "ibv_get_cq_event");
        CHECK(calls[2] == "ibv_ack_cq_events");
        CHECK(calls[3] == "ibv_req_notify_cq");
        CHECK(fake.armed(c.raw));
        CHECK(fake.alive("unacked_cq_event") == 0);
        CHECK(fake.acked_cq_events() == static_cast<unsigned long>(variant + 1));
        ibv_wc wc;
        REQUIRE(c.cq.get({&wc, 1}));
        CHECK(wc.wr_id == 5);
        fake.add_completion(c.raw, completion(5));  // the next variant's
      }
    }
    SECTION("nothing pending: no_completion from try_wait and wait_for") {
      REQUIRE(c.cq.wait());
      auto none = c.cq.try_wait();
      REQUIRE_FALSE(none);
      CHECK(none.error().code() == errc::no_completion);
      const auto start = std::chrono::steady_clock::now();
      none = c.cq.wait_for(30ms);
      REQUIRE_FALSE(none);
      CHECK(none.error().code() == errc::no_completion);
      CHECK(std::chrono::steady_clock::now() - start >= 30ms);
      // A completion without re-arming produces no event.
      ibv_wc wc;
      REQUIRE(c.cq.get({&wc, 1}));
      fake.add_completion(c.raw, completion(6));
      CHECK(fake.cq_events_queued(c.raw->channel) == 1);  // re-armed by wait()
    }
  }
  fake.expect_clean();
}

TEST_CASE("Cq::wait: a completion from another thread ends a blocking wait", "[cq][wait]") {
  fake::FakeProvider fake;
  {
    Connected c(fake);
    std::thread later([&] {
      std::this_thread::sleep_for(50ms);
      fake.add_completion(c.raw, completion(9));
    });
    auto waited = c.cq.wait();
    later.join();
    REQUIRE(waited);
    ibv_wc wc;
    REQUIRE(c.cq.get({&wc, 1}));
    CHECK(wc.wr_id == 9);
  }
  fake.expect_clean();
}

TEST_CASE("Cq::wait retries EINTR (poll and ibv_get_cq_event)", "[cq][wait]") {
  for (const char* call : {"poll", "ibv_get_cq_event"}) {
    INFO(call);
    fake::FakeProvider fake;
    {
      Connected c(fake);
      fake.add_completion(c.raw, completion(1));
      fake.fail(call, EINTR);
      REQUIRE(c.cq.wait());
      CHECK(fake.pending_faults() == 0);
      CHECK(fake.armed(c.raw));
    }
    fake.expect_clean();
  }
}

TEST_CASE("Cq::wait, try_wait, wait_for: each provider call fails in turn; the CQ stays usable",
          "[cq][fail-each]") {
  const std::vector<std::string> calls = {"poll", "ibv_get_cq_event", "ibv_ack_cq_events",
                                          "ibv_req_notify_cq"};
  for (int variant = 0; variant < 3; ++variant) {
    for (int err : {kErr, ENOMEM}) {
      INFO("variant " << variant);
      fail_each_call(calls, err, [&](fake::FakeProvider& fake, Probe& probe) {
        Connected c(fake);
        fake.add_completion(c.raw, completion(1));
        probe.begin();
        auto waited = variant == 0 ? c.cq.wait() : variant == 1 ? c.cq.try_wait() : c.cq.wait_for(1s);
        probe.end();
        const bool failed = probe.check_outcome(waited);
        CHECK(fake.alive("unacked_cq_event") == 0);  // acknowledged whatever failed after
        if (failed) {
          if (probe.injected()->call == "ibv_req_notify_cq") {
            CHECK_FALSE(fake.armed(c.raw));  // taken and acknowledged, not re-armed
            REQUIRE(c.cq.arm());             // the documented recovery
            CHECK(fake.armed(c.raw));
          } else {
            // The event was not taken: the next wait takes it.
            CHECK(fake.cq_events_queued(c.raw->channel) == 1);
            REQUIRE(c.cq.try_wait());
            CHECK(fake.armed(c.raw));
          }
        }
        ibv_wc wc;
        auto got = c.cq.get({&wc, 1});
        REQUIRE(got);
        CHECK(wc.wr_id == 1);
      });
    }
  }
}

TEST_CASE("Cq::next, next_for: each provider call fails in turn; the caller's buffer untouched",
          "[cq][fail-each][next]") {
  const std::vector<std::string> calls = {"ibv_poll_cq",       "poll",        "ibv_get_cq_event",
                                          "ibv_ack_cq_events", "ibv_req_notify_cq", "ibv_poll_cq"};
  for (int variant = 0; variant < 2; ++variant) {
    for (int err : {kErr, ENOMEM}) {
      INFO("variant " << variant);
      fail_each_call(calls, err, [&](fake::FakeProvider& fake, Probe& probe) {
        Connected c(fake);
        fake.complete_after_empty_poll(c.raw, completion(1));
        PoisonedWcs<2> out;
        probe.begin();
        auto got = variant == 0 ? c.cq.next(out.span()) : c.cq.next_for(out.span(), 1s);
        probe.end();
        if (!probe.failing()) {
          REQUIRE(got);
          REQUIRE(got->size() == 1);
          CHECK(out.wc[0].wr_id == 1);
          return;
        }
        REQUIRE_FALSE(got);
        if (probe.injected()->call == "ibv_poll_cq") check_poll_cq_returned(got.error(), -err);
        else probe.check(got.error());
        CHECK(out.untouched());
        CHECK(fake.alive("unacked_cq_event") == 0);
        // Still usable: the completion is read (waiting for it first when it is not there yet).
        auto again = c.cq.next_for(out.span(), 1s);
        INFO((again ? std::string() : again.error().message()));
        REQUIRE(again);
        REQUIRE(again->size() == 1);
        CHECK(out.wc[0].wr_id == 1);
      });
    }
  }
}

TEST_CASE("Conn::wait_completion, try_ and _for: each provider call fails in turn; the queues stay usable",
          "[cq][fail-each][shared]") {
  const std::vector<std::string> calls = {"poll", "ibv_get_cq_event", "ibv_ack_cq_events",
                                          "ibv_req_notify_cq"};
  for (int variant = 0; variant < 3; ++variant) {
    for (int err : {kErr, ENOMEM}) {
      INFO("variant " << variant);
      fail_each_call(calls, err, [&](fake::FakeProvider& fake, Probe& probe) {
        Connected c(fake, shared_channel_config());
        Cq rcq = *c.conn.rcq();
        fake.add_completion(*rcq.native(), completion(1, IBV_WC_SUCCESS, IBV_WC_RECV));
        probe.begin();
        auto fired = variant == 0   ? c.conn.wait_completion()
                     : variant == 1 ? c.conn.try_wait_completion()
                                    : c.conn.wait_completion_for(1s);
        probe.end();
        const bool failed = probe.check_outcome(fired);
        CHECK(fake.alive("unacked_cq_event") == 0);
        if (!failed) {
          CHECK(*fired == rcq);
        } else if (probe.injected()->call == "ibv_req_notify_cq") {
          CHECK_FALSE(fake.armed(*rcq.native()));
        } else {
          auto again = c.conn.try_wait_completion();
          REQUIRE(again);
          CHECK(*again == rcq);
          CHECK(fake.armed(*rcq.native()));
        }
        CHECK(fake.armed(c.raw));  // the other queue is not touched
        ibv_wc wc;
        REQUIRE(rcq.get({&wc, 1}));
        CHECK(wc.wr_id == 1);
      });
    }
  }
}

TEST_CASE("an event for another CQ on the channel: unknown, acknowledged, the queue unchanged",
          "[cq][wait]") {
  fake::FakeProvider fake;
  {
    Connected c(fake);
    const auto& p = rpmapp::detail::provider();
    ibv_cq* other = p.create_cq(c.raw->context, 4, nullptr, c.raw->channel, 0);
    REQUIRE(other);
    for (int variant = 0; variant < 5; ++variant) {
      INFO("variant " << variant);
      REQUIRE(p.req_notify_cq(other, 0) == 0);
      fake.add_completion(other, completion(100));
      REQUIRE(fake.cq_events_queued(c.raw->channel) == 1);
      PoisonedWcs<1> out;
      const unsigned long acked = fake.acked_cq_events();
      expected<void> waited;
      if (variant < 3) {
        waited = variant == 0 ? c.cq.wait() : variant == 1 ? c.cq.try_wait() : c.cq.wait_for(1s);
      } else {
        auto got = variant == 3 ? c.cq.next(out.span()) : c.cq.next_for(out.span(), 1s);
        if (!got) waited = rpmapp::unexpected(got.error());
        CHECK(out.untouched());
      }
      REQUIRE_FALSE(waited);
      INFO("error: " << waited.error().message());
      CHECK(waited.error().code() == errc::unknown);
      CHECK(waited.error().sys_errno() == 0);
      CHECK(waited.error().call() == "ibv_get_cq_event");
      CHECK(fake.acked_cq_events() == acked + 1);
      CHECK(fake.alive("unacked_cq_event") == 0);
      CHECK(fake.cq_events_queued(c.raw->channel) == 0);
      CHECK(fake.armed(c.raw));  // still armed: its own event will come
      ibv_wc drained;
      REQUIRE(p.poll_cq(other, 1, &drained) == 1);
    }
    fake.add_completion(c.raw, completion(7));
    REQUIRE(c.cq.wait_for(1s));
    ibv_wc wc;
    REQUIRE(c.cq.get({&wc, 1}));
    CHECK(wc.wr_id == 7);
    CHECK(p.destroy_cq(other) == 0);  // no unacknowledged event on it
  }
  fake.expect_clean();
}

TEST_CASE("Conn::wait_completion: an event for a queue not of this connection is unknown, acknowledged",
          "[cq][shared]") {
  fake::FakeProvider fake;
  {
    Connected c(fake, shared_channel_config());
    Cq rcq = *c.conn.rcq();
    const auto& p = rpmapp::detail::provider();
    ibv_cq* other = p.create_cq(c.raw->context, 4, nullptr, c.raw->channel, 0);
    REQUIRE(other);
    for (int variant = 0; variant < 3; ++variant) {
      INFO("variant " << variant);
      REQUIRE(p.req_notify_cq(other, 0) == 0);
      fake.add_completion(other, completion(100));
      auto fired = variant == 0   ? c.conn.wait_completion()
                   : variant == 1 ? c.conn.try_wait_completion()
                                  : c.conn.wait_completion_for(1s);
      REQUIRE_FALSE(fired);
      INFO("error: " << fired.error().message());
      CHECK(fired.error().code() == errc::unknown);
      CHECK(fired.error().sys_errno() == 0);
      CHECK(fired.error().call() == "ibv_get_cq_event");
      CHECK(fake.alive("unacked_cq_event") == 0);
      CHECK(fake.cq_events_queued(c.raw->channel) == 0);
      CHECK(fake.armed(c.raw));
      CHECK(fake.armed(*rcq.native()));
      ibv_wc drained;
      REQUIRE(p.poll_cq(other, 1, &drained) == 1);
    }
    fake.add_completion(*rcq.native(), completion(8, IBV_WC_SUCCESS, IBV_WC_RECV));
    auto fired = c.conn.wait_completion_for(1s);
    REQUIRE(fired);
    CHECK(*fired == rcq);
    CHECK(p.destroy_cq(other) == 0);
  }
  fake.expect_clean();
}

TEST_CASE("Cq::next: a completion arriving between the poll and the wait is not lost", "[cq][next]") {
  fake::FakeProvider fake;
  {
    Connected c(fake);
    fake.complete_after_empty_poll(c.raw, completion(77));
    ibv_wc wc[2];
    const auto mark = fake.mark();
    auto got = c.cq.next_for(wc, 2s);
    REQUIRE(got);
    REQUIRE(got->size() == 1);
    CHECK(wc[0].wr_id == 77);
    CHECK(fake.calls_since(mark) ==
          std::vector<std::string>{"ibv_poll_cq", "poll", "ibv_get_cq_event", "ibv_ack_cq_events",
                                   "ibv_req_notify_cq", "ibv_poll_cq"});
    // Already there: no wait at all.
    fake.add_completion(c.raw, completion(78));
    const auto mark2 = fake.mark();
    got = c.cq.next(wc);
    REQUIRE(got);
    CHECK(wc[0].wr_id == 78);
    CHECK(fake.calls_since(mark2) == std::vector<std::string>{"ibv_poll_cq"});
    // The event of that completion is still queued: the next wait takes it and polls.
    auto none = c.cq.next_for(wc, 20ms);
    REQUIRE_FALSE(none);
    CHECK(none.error().code() == errc::no_completion);
    CHECK(fake.alive("unacked_cq_event") == 0);
  }
  fake.expect_clean();
}

TEST_CASE("a shared completion channel: Conn::wait_completion returns the queue that fired", "[cq][shared]") {
  fake::FakeProvider fake;
  {
    ConnConfig cfg;
    cfg.rcq_size = 5;
    cfg.shared_completion_channel = true;
    Connected c(fake, cfg);
    Cq rcq = *c.conn.rcq();
    REQUIRE(rcq);
    CHECK(*c.cq.shared_channel());
    CHECK(*rcq.shared_channel());
    CHECK(*c.conn.completion_fd() == *c.cq.fd());
    CHECK(*rcq.fd() == *c.cq.fd());
    const auto mark = fake.mark();
    auto shared = c.cq.wait();
    REQUIRE_FALSE(shared);
    CHECK(shared.error().code() == errc::shared_channel);
    CHECK(rcq.try_wait().error().code() == errc::shared_channel);
    CHECK(c.cq.next_for({}, 1ms).error().code() == errc::inval);
    CHECK(fake.calls_since(mark).empty());

    fake.add_completion(*rcq.native(), completion(1, IBV_WC_SUCCESS, IBV_WC_RECV));
    auto fired = c.conn.wait_completion_for(1s);
    REQUIRE(fired);
    CHECK(*fired == rcq);
    CHECK(fake.armed(*rcq.native()));
    fake.add_completion(c.raw, completion(2));
    fired = c.conn.wait_completion();
    REQUIRE(fired);
    CHECK(*fired == c.cq);
    auto none = c.conn.try_wait_completion();
    REQUIRE_FALSE(none);
    CHECK(none.error().code() == errc::no_completion);
    CHECK(fake.alive("unacked_cq_event") == 0);
  }
  fake.expect_clean();
}

TEST_CASE("separate channels: completion_fd and wait_completion are not_shared_chnl", "[cq][shared]") {
  fake::FakeProvider fake;
  {
    ConnConfig cfg;
    cfg.rcq_size = 5;
    Connected c(fake, cfg);
    Cq rcq = *c.conn.rcq();
    CHECK(*rcq.fd() != *c.cq.fd());
    CHECK_FALSE(*c.cq.shared_channel());
    const auto mark = fake.mark();
    CHECK(c.conn.completion_fd().error().code() == errc::not_shared_chnl);
    CHECK(c.conn.wait_completion().error().code() == errc::not_shared_chnl);
    CHECK(c.conn.try_wait_completion().error().code() == errc::not_shared_chnl);
    CHECK(c.conn.wait_completion_for(1ms).error().code() == errc::not_shared_chnl);
    CHECK(fake.calls_since(mark).empty());
    // Each queue waits on its own channel.
    fake.add_completion(*rcq.native(), completion(3, IBV_WC_SUCCESS, IBV_WC_RECV));
    CHECK(c.cq.try_wait().error().code() == errc::no_completion);
    REQUIRE(rcq.try_wait());
  }
  fake.expect_clean();
}

TEST_CASE("an empty Cq (no receive CQ): every call is inval", "[cq]") {
  fake::FakeProvider fake;
  {
    Connected c(fake);
    Cq none = *c.conn.rcq();
    CHECK_FALSE(none);
    ibv_wc wc;
    const auto mark = fake.mark();
    check_inval(none.fd().error(), "Cq::fd");
    check_inval(none.native().error(), "Cq::native");
    check_inval(none.wait().error(), "Cq::wait");
    check_inval(none.try_wait().error(), "Cq::try_wait");
    check_inval(none.get({&wc, 1}).error(), "Cq::get");
    check_inval(none.next({&wc, 1}).error(), "Cq::get");
    check_inval(none.shared_channel().error(), "Cq::shared_channel");
    CHECK(fake.calls_since(mark).empty());
    CHECK_FALSE(Cq());
  }
  fake.expect_clean();
}

TEST_CASE("check(wc): a failed completion's Error names its status; immediate() is host order", "[cq]") {
  CHECK(check(completion(1)));
  for (auto status : {IBV_WC_LOC_PROT_ERR, IBV_WC_REM_ACCESS_ERR, IBV_WC_RETRY_EXC_ERR,
                      IBV_WC_WR_FLUSH_ERR, IBV_WC_RNR_RETRY_EXC_ERR}) {
    auto wc = completion(0xbeef, status);
    auto e = check(wc);
    REQUIRE_FALSE(e);
    CHECK(e.error().code() == errc::provider);
    CHECK(e.error().call() == "ibv_poll_cq");
    CHECK_THAT(e.error().message(), Catch::Contains(ibv_wc_status_str(status)));
    CHECK_THAT(e.error().message(), Catch::Contains("0xbeef"));
    CHECK(to_string(status) == ibv_wc_status_str(status));
  }
  ibv_wc wc = completion(1, IBV_WC_SUCCESS, IBV_WC_RECV);
  wc.imm_data = htonl(0x11223344u);
  CHECK(immediate(wc) == 0x11223344u);
  CHECK(to_string(IBV_WC_RDMA_READ) == "read");
  CHECK(to_string(IBV_WC_RECV_RDMA_WITH_IMM) == "recv_rdma_with_imm");
  CHECK(to_string(static_cast<ibv_wc_opcode>(rpmapp::detail::native_atomic_write_abi::wc_atomic_write)) ==
        "atomic_write");
}

TEST_CASE("a connection's work completions end up on the right CQ", "[cq]") {
  fake::FakeProvider fake;
  {
    ConnConfig cfg;
    cfg.rcq_size = 4;
    Connected c(fake, cfg);
    Cq rcq = *c.conn.rcq();
    Buffer buf(64);
    MrLocal mr = reg(c.peer, buf, all_usages);
    REQUIRE(c.conn.recv(mr, 0, 64, 1));
    REQUIRE(c.conn.send(mr, 0, 8, Completion::always, 2));
    REQUIRE(c.conn.send(mr, 0, 8, Completion::on_error, 3));
    REQUIRE(c.conn.send(mr, 0, 8, Completion::on_error, 4));
    fake.complete_sends(*c.conn.qp(), 2);
    fake.complete_sends(*c.conn.qp(), 1, IBV_WC_REM_ACCESS_ERR);  // unsignaled, but failed
    REQUIRE(fake.deliver_recv(*c.conn.qp(), as_bytes("abc")));
    ibv_wc wc[4];
    auto sends = c.cq.get(wc);
    REQUIRE(sends);
    REQUIRE(sends->size() == 2);
    CHECK(wc[0].wr_id == 2);
    CHECK(wc[1].wr_id == 4);
    CHECK(wc[1].status == IBV_WC_REM_ACCESS_ERR);
    auto recvs = rcq.get(wc);
    REQUIRE(recvs);
    REQUIRE(recvs->size() == 1);
    CHECK(wc[0].wr_id == 1);
    CHECK(wc[0].byte_len == 3);
  }
  fake.expect_clean();
}

TEST_CASE("bounded waits: no_completion after about their bound; zero or negative is a try",
          "[cq][wait][timing]") {
  constexpr auto bound = 80ms;
  constexpr auto margin = 1500ms;  // generous: a loaded CI machine, sanitizers
  fake::FakeProvider fake;
  {
    Connected c(fake);
    Connected s(fake, shared_channel_config());
    PoisonedWcs<2> out;
    auto check_bounded = [&](auto&& wait, const char* what) {
      INFO(what);
      errc code = errc::inval;
      const auto took = timed([&] {
        auto r = wait(bound);
        REQUIRE_FALSE(r);
        code = r.error().code();
      });
      CHECK(code == errc::no_completion);
      CHECK(took >= bound);
      CHECK(took < bound + margin);
    };
    check_bounded([&](auto t) { return c.cq.wait_for(t); }, "Cq::wait_for");
    check_bounded([&](auto t) { return c.cq.next_for(out.span(), t); }, "Cq::next_for");
    check_bounded([&](auto t) { return s.conn.wait_completion_for(t); }, "Conn::wait_completion_for");
    CHECK(out.untouched());

    // Zero or negative: a try, returning at once (a wait forever would meet the fake's
    // watchdog and be recorded as a hang).
    for (auto t : {0ms, -1ms, -5000ms}) {
      INFO("timeout " << t.count() << "ms");
      const auto quick = fake.watchdog / 4;
      CHECK(timed([&] { CHECK(c.cq.wait_for(t).error().code() == errc::no_completion); }) < quick);
      CHECK(timed([&] { CHECK(c.cq.next_for(out.span(), t).error().code() == errc::no_completion); }) < quick);
      CHECK(timed([&] {
              CHECK(s.conn.wait_completion_for(t).error().code() == errc::no_completion);
            }) < quick);
      CHECK(out.untouched());
      // What is pending is still taken.
      fake.add_completion(c.raw, completion(1));
      CHECK(c.cq.wait_for(t));
      fake.add_completion(c.raw, completion(2));
      auto got = c.cq.next_for(out.span(), t);
      REQUIRE(got);
      REQUIRE(got->size() == 2);
      CHECK(out.wc[0].wr_id == 1);
      CHECK(out.wc[1].wr_id == 2);
      std::memset(out.wc, 0xAB, sizeof out.wc);
      fake.add_completion(s.raw, completion(3));
      auto fired = s.conn.wait_completion_for(t);
      REQUIRE(fired);
      CHECK(*fired == s.cq);
      ibv_wc wc;
      REQUIRE(s.cq.get({&wc, 1}));
      CHECK(wc.wr_id == 3);
      // The event of completion 2 is still queued: take it so the next round starts empty.
      REQUIRE(c.cq.try_wait());
    }
    CHECK(fake.alive("unacked_cq_event") == 0);
  }
  fake.expect_clean();
}

TEST_CASE("Cq::get: ibv_poll_cq returning a negative value or more than asked", "[cq]") {
  fake::FakeProvider fake;
  {
    Connected c(fake);
    fake.add_completion(c.raw, completion(1));
    PoisonedWcs<2> out;
    for (int returned : {-1, -2, -EINVAL, -1000}) {
      INFO("returned " << returned);
      fake.poll_cq_returns(c.raw, returned);
      auto got = c.cq.get(out.span());
      REQUIRE_FALSE(got);
      check_poll_cq_returned(got.error(), returned);
      CHECK(out.untouched());
      // next / next_for: the error at once, no wait.
      fake.poll_cq_returns(c.raw, returned);
      const auto mark = fake.mark();
      auto next = c.cq.next_for(out.span(), 1s);
      REQUIRE_FALSE(next);
      check_poll_cq_returned(next.error(), returned);
      CHECK(fake.calls_since(mark) == std::vector<std::string>{"ibv_poll_cq"});
      CHECK(out.untouched());
    }
    for (int returned : {3, 1000}) {
      INFO("returned " << returned);
      fake.poll_cq_returns(c.raw, returned);
      auto got = c.cq.get(out.span());
      REQUIRE_FALSE(got);
      INFO("error: " << got.error().message());
      CHECK(got.error().code() == errc::unknown);
      CHECK(got.error().sys_errno() == 0);
      CHECK(got.error().call() == "ibv_poll_cq");
      CHECK_THAT(got.error().message(),
                 Catch::Contains("returned " + std::to_string(returned) + " completions for room for 2"));
      fake.poll_cq_returns(c.raw, returned);
      auto next = c.cq.next(out.span());
      REQUIRE_FALSE(next);
      CHECK(next.error().code() == errc::unknown);
    }
    // The queue is still read as before.
    auto got = c.cq.get(out.span());
    REQUIRE(got);
    REQUIRE(got->size() == 1);
    CHECK(out.wc[0].wr_id == 1);
    REQUIRE(c.cq.try_wait());  // its event
  }
  fake.expect_clean();
}

TEST_CASE("a retry-exceeded completion: the connection reports lost once, before rdma_cm's events, "
          "which still come", "[cq][lost]") {
  fake::FakeProvider fake;
  {
    Connected c(fake);
    Buffer buf(64);
    MrLocal mr = reg(c.peer, buf, all_usages);
    REQUIRE(c.conn.send(mr, 0, 8, Completion::always, 1));
    REQUIRE(c.conn.send(mr, 0, 8, Completion::always, 2));
    fake.complete_sends(*c.conn.qp(), 1, IBV_WC_RETRY_EXC_ERR);
    fake.complete_sends(*c.conn.qp(), 1, IBV_WC_WR_FLUSH_ERR);
    // Not known before the completion is read: nothing else tells the connection.
    auto before = c.conn.try_next_event();
    REQUIRE_FALSE(before);
    CHECK(before.error().code() == errc::no_event);
    ibv_wc wc[4];
    SECTION("read with Cq::get") { REQUIRE(c.cq.get(wc)->size() == 2); }
    SECTION("read with Cq::next") { REQUIRE(c.cq.next_for(wc, 1000ms)->size() == 2); }
    CHECK(wc[0].status == IBV_WC_RETRY_EXC_ERR);
    fake.inject_event(*c.conn.fd(), RDMA_CM_EVENT_DISCONNECTED);
    CHECK(c.conn.next_event_for(1000ms) == ConnEvent::lost);
    CHECK(c.conn.next_event_for(1000ms) == ConnEvent::closed);
    auto after = c.conn.try_next_event();
    REQUIRE_FALSE(after);
    CHECK(after.error().code() == errc::no_event);
  }
  fake.expect_clean();
}

TEST_CASE("lost: other failed statuses, and a retry-exceeded one read again, are not reported as lost",
          "[cq][lost]") {
  fake::FakeProvider fake;
  {
    Connected c(fake);
    ibv_wc wc[8];
    SECTION("statuses of a failed request, not of the path") {
      for (auto status : {IBV_WC_REM_ACCESS_ERR, IBV_WC_WR_FLUSH_ERR, IBV_WC_RNR_RETRY_EXC_ERR,
                          IBV_WC_LOC_PROT_ERR, IBV_WC_REM_OP_ERR})
        fake.add_completion(c.raw, completion(1, status));
      REQUIRE(c.cq.get(wc)->size() == 5);
      auto none = c.conn.try_next_event();
      REQUIRE_FALSE(none);
      CHECK(none.error().code() == errc::no_event);
    }
    SECTION("a second retry-exceeded completion: lost was reported already") {
      fake.add_completion(c.raw, completion(1, IBV_WC_RETRY_EXC_ERR));
      REQUIRE(c.cq.get(wc));
      CHECK(c.conn.try_next_event() == ConnEvent::lost);
      fake.add_completion(c.raw, completion(2, IBV_WC_RETRY_EXC_ERR));
      REQUIRE(c.cq.get(wc));
      auto again = c.conn.try_next_event();
      REQUIRE_FALSE(again);
      CHECK(again.error().code() == errc::no_event);
    }
  }
  fake.expect_clean();
}

TEST_CASE("lost: found through the receive CQ and through Conn::wait_completion's queue", "[cq][lost]") {
  fake::FakeProvider fake;
  {
    SECTION("the connection's own receive CQ") {
      ConnConfig cfg;
      cfg.rcq_size = 4;
      Connected c(fake, cfg);
      fake.add_completion(*c.conn.rcq()->native(), completion(1, IBV_WC_RETRY_EXC_ERR, IBV_WC_RECV));
      ibv_wc wc[2];
      REQUIRE(c.conn.rcq()->get(wc));
      CHECK(c.conn.try_next_event() == ConnEvent::lost);
    }
    SECTION("the queue a shared channel fired for") {
      Connected c(fake, shared_channel_config());
      fake.add_completion(c.raw, completion(1, IBV_WC_RETRY_EXC_ERR));
      auto fired = c.conn.wait_completion_for(1000ms);
      REQUIRE(fired);
      ibv_wc wc[2];
      REQUIRE(fired->get(wc));
      CHECK(c.conn.try_next_event() == ConnEvent::lost);
    }
  }
  fake.expect_clean();
}

}  // namespace cq_test
