// Coroutines on the event loop (fake provider): Task, spawn and block_on (task.hpp), and
// EventLoop's awaitables next_conn_req, next_event, resolve, connect, completions and
// sleep_for: each completes with its result whether it was there before the co_await or
// came later; each is cancelled by each cause (timeout, stop() from the loop's thread and
// from another, the awaited object destroyed, the loop destroyed), resumed exactly once.
#include "data_util.hpp"
#include "loop_util.hpp"

#include <rpmapp/event_loop.hpp>
#include <rpmapp/log.hpp>
#include <rpmapp/task.hpp>

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <coroutine>
#include <memory>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace task_test {

using namespace test;
using namespace std::chrono_literals;

namespace {

using ms = std::chrono::milliseconds;

std::span<const std::byte> bytes_of(std::string_view s) {
  return {reinterpret_cast<const std::byte*>(s.data()), s.size()};
}

std::string text_of(std::span<const std::byte> b) {
  return {reinterpret_cast<const char*>(b.data()), b.size()};
}

/// A coroutine type of the test's own (awaiters work with any): runs at once up to its first
/// suspension; its frame lives until the object goes.
struct Eager {
  struct promise_type {
    Eager get_return_object() { return Eager(std::coroutine_handle<promise_type>::from_promise(*this)); }
    std::suspend_never initial_suspend() noexcept { return {}; }
    std::suspend_always final_suspend() noexcept { return {}; }
    void return_void() noexcept {}
    void unhandled_exception() noexcept { std::terminate(); }
  };
  explicit Eager(std::coroutine_handle<promise_type> h) : handle(h) {}
  Eager(Eager&& o) noexcept : handle(std::exchange(o.handle, nullptr)) {}
  Eager(const Eager&) = delete;
  ~Eager() {
    if (handle) handle.destroy();
  }
  std::coroutine_handle<promise_type> handle;
};

template <class Make, class R = AwaitResult<Make>> Eager eager_once(Make make, Outcome<R>& out) {
  ++out.started;
  auto result = co_await make();
  ++out.resumed;
  out.at = Clock::now();
  out.result.emplace(std::move(result));
}

void check_error(const Error& e, errc code, std::string_view call, std::string_view words) {
  INFO("error: " << e.message());
  CHECK(e.code() == code);
  CHECK(e.call() == call);
  CHECK_THAT(e.message(), Catch::Contains(std::string(words)));
}

void check_stopped(const Error& e, std::string_view call) {
  check_error(e, errc::no_event, call, "the event loop was stopped");
  CHECK(e.sys_errno() == 0);
}

bool has_call(const std::vector<std::string>& calls, std::string_view name) {
  for (auto& c : calls)
    if (c == name) return true;
  return false;
}

/// The loop's epoll set holds only its eventfd (no awaiter is left in it).
void check_only_wakefd(const fake::FakeProvider& fake, const EventLoop& loop) {
  auto set = fake.watched(loop.core()->epfd);
  CHECK(set.size() == 1);
  CHECK(set.count(loop.core()->wakefd) == 1);
}

// ---- the awaitables under test, each with its source, its event and its checks

struct ConnReqSubject {
  static constexpr const char* call = "EventLoop::next_conn_req";
  static constexpr bool ready_before = true, has_timeout = true, has_source = true;
  fake::FakeProvider& fake;
  Peer peer;
  std::optional<Endpoint> ep;
  explicit ConnReqSubject(fake::FakeProvider& f) : fake(f), peer(open_peer(f)), ep(listen_on(peer, "169.254.77.1")) {}
  auto make(EventLoop& loop, ms timeout = ms(-1)) { return loop.next_conn_req(*ep, {}, timeout); }
  void make_ready() {
    fake::Request r;
    r.private_data = "hello";
    fake.inject_connect_request(*ep->fd(), r);
  }
  void check_result(expected<ConnReq>& r) {
    INFO((r ? std::string() : r.error().message()));
    REQUIRE(r);
    CHECK(*r->is_incoming());
    CHECK(text_of(*r->private_data()).substr(0, 5) == "hello");
  }
  void destroy_source() { ep.reset(); }
  void close_source() { CHECK(std::move(*ep).shutdown()); }
};

struct EventSubject {
  static constexpr const char* call = "EventLoop::next_event";
  static constexpr bool ready_before = true, has_timeout = true, has_source = true;
  fake::FakeProvider& fake;
  Peer peer;
  std::optional<Conn> conn;
  explicit EventSubject(fake::FakeProvider& f) : fake(f), peer(open_peer(f)), conn(connected(f, peer)) {}
  auto make(EventLoop& loop, ms timeout = ms(-1)) { return loop.next_event(*conn, timeout); }
  void make_ready() { fake.inject_event(*conn->fd(), RDMA_CM_EVENT_DISCONNECTED); }
  void check_result(expected<ConnEvent>& r) {
    INFO((r ? std::string() : r.error().message()));
    REQUIRE(r);
    CHECK(*r == ConnEvent::closed);
  }
  void destroy_source() { conn.reset(); }
  void close_source() { CHECK(std::move(*conn).close()); }
};

struct ResolveSubject {
  static constexpr const char* call = "EventLoop::resolve";
  static constexpr bool ready_before = true, has_timeout = true, has_source = false;
  fake::FakeProvider& fake;
  Peer peer;
  PendingConnReq pending;
  static PendingConnReq start(fake::FakeProvider& f, const Peer& peer) {
    f.auto_resolve = false;  // resolution waits for make_ready()
    auto p = ConnReq::start(peer, "169.254.77.9", "7471");
    INFO((p ? std::string() : p.error().message()));
    REQUIRE(p);
    return std::move(*p);
  }
  explicit ResolveSubject(fake::FakeProvider& f) : fake(f), peer(open_peer(f)), pending(start(f, peer)) {}
  ~ResolveSubject() { fake.deliver_held(); }  // events held for a released request are discarded
  auto make(EventLoop& loop, ms timeout = ms(-1)) { return loop.resolve(std::move(pending), timeout); }
  void make_ready() {
    fake.auto_resolve = true;  // the route resolves as soon as it is asked for
    fake.deliver_held();
  }
  void check_result(expected<ConnReq>& r) {
    INFO((r ? std::string() : r.error().message()));
    REQUIRE(r);
    CHECK_FALSE(*r->is_incoming());
    CHECK(*r->device() == "fake0");
  }
};

struct ConnectSubject {
  static constexpr const char* call = "EventLoop::connect";
  // ESTABLISHED can only follow rdma_connect, made within the co_await
  static constexpr bool ready_before = false, has_timeout = true, has_source = false;
  fake::FakeProvider& fake;
  Peer peer;
  explicit ConnectSubject(fake::FakeProvider& f) : fake(f), peer(open_peer(f)) {}
  ~ConnectSubject() { fake.deliver_held(); }
  auto make(EventLoop& loop, ms timeout = ms(-1)) {
    return loop.connect(peer, "169.254.77.9", "7471", {}, bytes_of("hi there"), timeout);
  }
  int conn_fd() {
    REQUIRE(fake.connects.size() == 1);
    return fake.connects.back().id->channel->fd;
  }
  void make_ready() { fake.inject_event(conn_fd(), RDMA_CM_EVENT_ESTABLISHED); }
  void check_result(expected<Conn>& r) {
    INFO((r ? std::string() : r.error().message()));
    REQUIRE(r);
    CHECK(fake.connected(*r->qp()));
    CHECK(fake.connects.back().text() == "hi there");
    CHECK(*r->fd() == conn_fd());
  }
};

struct CompletionsSubject {
  static constexpr const char* call = "EventLoop::completions";
  static constexpr bool ready_before = true, has_timeout = true, has_source = true;
  fake::FakeProvider& fake;
  Peer peer;
  std::optional<Conn> conn;
  Buffer buf{64};
  MrLocal mr;
  ibv_wc wc[4]{};
  explicit CompletionsSubject(fake::FakeProvider& f)
      : fake(f), peer(open_peer(f)), conn(connected(f, peer)), mr(reg(peer, buf, MrUsage::send)) {
    REQUIRE(conn->send(mr, 0, 8, Completion::always, 77));
  }
  auto make(EventLoop& loop, ms timeout = ms(-1)) { return loop.completions(*conn, wc, CqKind::main, timeout); }
  void make_ready() { REQUIRE(fake.complete_sends(*conn->qp(), 1) == 1); }
  void check_result(expected<std::span<ibv_wc>>& r) {
    INFO((r ? std::string() : r.error().message()));
    REQUIRE(r);
    REQUIRE(r->size() == 1);
    CHECK(r->data() == wc);
    CHECK(wc[0].wr_id == 77);
    CHECK(wc[0].status == IBV_WC_SUCCESS);
    CHECK(wc[0].opcode == IBV_WC_SEND);
  }
  void destroy_source() { conn.reset(); }
  void close_source() { CHECK(std::move(*conn).close()); }
};

struct SleepSubject {
  static constexpr const char* call = "EventLoop::sleep_for";
  static constexpr bool ready_before = false, has_timeout = false, has_source = false;
  explicit SleepSubject(fake::FakeProvider&) {}
  auto make(EventLoop& loop, ms = ms(-1)) { return loop.sleep_for(20s); }
};

template <class S> auto maker(S& s, EventLoop& loop, ms timeout = ms(-1)) {
  return [&s, &loop, timeout] { return s.make(loop, timeout); };
}
template <class S> using SubjectResult = AwaitResult<decltype(maker(std::declval<S&>(), std::declval<EventLoop&>()))>;

/// Spawns an awaiting coroutine and lets it reach its co_await.
template <class S> void spawn_waiting(EventLoop& loop, S& s, Outcome<SubjectResult<S>>& out, ms timeout = ms(-1),
                                      int* frames = nullptr) {
  REQUIRE(spawn(loop, await_once(maker(s, loop, timeout), out, FrameMark(frames))));
  REQUIRE(loop.run_once(0ms));
  REQUIRE(out.suspended());
}

Task<void> after(EventLoop& loop, ms delay, std::function<void()> fn) {
  auto slept = co_await loop.sleep_for(delay);
  REQUIRE(slept);
  fn();
}

}  // namespace

TEMPLATE_TEST_CASE("awaitables: the result, and cancellation by each cause, each resuming once", "[task][await]",
                   ConnReqSubject, EventSubject, ResolveSubject, ConnectSubject, CompletionsSubject, SleepSubject) {
  using S = TestType;
  using R = SubjectResult<S>;
  fake::FakeProvider fake;
  {
    std::optional<EventLoop> loop(make_loop());
    S s(fake);
    Outcome<R> out;

    if constexpr (S::ready_before) {
      SECTION("the result is there before the co_await: no suspension") {
        s.make_ready();
        const auto mark = fake.mark();
        Eager co = eager_once(maker(s, *loop), out);  // runs up to its end or first suspension
        CHECK(out.resumed == 1);
        CHECK(co.handle.done());
        CHECK_FALSE(has_call(fake.calls_since(mark), "epoll_ctl"));  // never waited
        REQUIRE(out.result.has_value());
        s.check_result(*out.result);
        settle(*loop);
        CHECK(out.resumed == 1);
      }
    }
    if constexpr (!std::is_same_v<S, SleepSubject>) {
      SECTION("the result arrives later: resumed once with it") {
        spawn_waiting(*loop, s, out);
        settle(*loop);
        CHECK(out.resumed == 0);  // nothing to resume it yet
        s.make_ready();
        REQUIRE(run_until(*loop, [&] { return out.resumed > 0; }));
        s.check_result(*out.result);
        settle(*loop);
        CHECK(out.resumed == 1);
        check_only_wakefd(fake, *loop);
      }
    }
    if constexpr (S::has_timeout) {
      SECTION("timeout: no_event after it, not much later") {
        const auto t0 = Clock::now();
        spawn_waiting(*loop, s, out, 80ms);
        REQUIRE(run_until(*loop, [&] { return out.resumed > 0; }));
        const auto took = out.at - t0;
        CHECK(took >= 80ms);
        CHECK(took < 1500ms);
        REQUIRE_FALSE(*out.result);
        check_error(out.result->error(), errc::no_event, S::call, "nothing within 80 ms");
        settle(*loop);
        CHECK(out.resumed == 1);
        check_only_wakefd(fake, *loop);
      }
      SECTION("a zero timeout gives up at the next turn when nothing is there") {
        REQUIRE(spawn(*loop, await_once(maker(s, *loop, 0ms), out)));
        REQUIRE(run_until(*loop, [&] { return out.resumed > 0; }, 500ms));
        REQUIRE_FALSE(*out.result);
        CHECK(out.result->error() == errc::no_event);
      }
    }
    SECTION("stop() from the loop's thread before run: no_event, the loop stays usable") {
      spawn_waiting(*loop, s, out);
      loop->stop();
      auto ran = loop->run();
      INFO((ran ? std::string() : ran.error().message()));
      REQUIRE(ran);
      CHECK(out.resumed == 1);
      REQUIRE_FALSE(*out.result);
      check_stopped(out.result->error(), S::call);
      check_only_wakefd(fake, *loop);
      // not stopping any more: a new await waits as usual
      auto slept = block_on(*loop, [](EventLoop& l) -> Task<expected<void>> { co_return co_await l.sleep_for(1ms); }(*loop));
      REQUIRE(slept);
      CHECK(*slept);
      CHECK(out.resumed == 1);
    }
    SECTION("stop() from another coroutine: no_event before run returns") {
      spawn_waiting(*loop, s, out);
      REQUIRE(spawn(*loop, after(*loop, 5ms, [&] { loop->stop(); })));
      REQUIRE(loop->run());
      CHECK(out.resumed == 1);
      REQUIRE_FALSE(*out.result);
      check_stopped(out.result->error(), S::call);
      settle(*loop);
      CHECK(out.resumed == 1);
    }
    SECTION("stop() from another thread: no_event before run returns") {
      spawn_waiting(*loop, s, out);
      EventLoop& l = *loop;
      std::thread stopper([&l] {
        std::this_thread::sleep_for(30ms);
        l.stop();
      });
      const auto t0 = Clock::now();
      auto ran = l.run();
      stopper.join();
      INFO((ran ? std::string() : ran.error().message()));
      REQUIRE(ran);
      CHECK(Clock::now() - t0 < 1500ms);
      CHECK(out.resumed == 1);
      REQUIRE_FALSE(*out.result);
      check_stopped(out.result->error(), S::call);
      settle(*loop);
      CHECK(out.resumed == 1);
    }
    SECTION("an await started while the stop is handled fails at once; the coroutine ends") {
      int second = 0;
      std::optional<expected<void>> again;
      auto retry = [&]() -> Task<void> {
        auto first = co_await s.make(*loop);
        CHECK_FALSE(first);
        again.emplace(co_await loop->sleep_for(10s));  // during stop(): not left suspended
        ++second;
      };
      REQUIRE(spawn(*loop, retry()));
      REQUIRE(loop->run_once(0ms));
      loop->stop();
      REQUIRE(loop->run());
      CHECK(second == 1);
      REQUIRE(again);
      REQUIRE_FALSE(*again);
      check_stopped(again->error(), "EventLoop::sleep_for");
      check_only_wakefd(fake, *loop);
    }
    if constexpr (S::has_source) {
      SECTION("the awaited object destroyed by another coroutine: inval") {
        spawn_waiting(*loop, s, out);
        REQUIRE(spawn(*loop, after(*loop, 5ms, [&] { s.destroy_source(); })));
        REQUIRE(run_until(*loop, [&] { return out.resumed > 0; }));
        REQUIRE_FALSE(*out.result);
        check_error(out.result->error(), errc::inval, S::call, "the awaited object was destroyed or closed");
        settle(*loop);
        CHECK(out.resumed == 1);
        check_only_wakefd(fake, *loop);
      }
      SECTION("the awaited object closed by a handler: inval") {
        int pipe_fds[2];
        REQUIRE(::pipe(pipe_fds) == 0);
        spawn_waiting(*loop, s, out);
        Registration reg;
        auto r = loop->watch_fd(pipe_fds[0], EPOLLIN, [&](std::uint32_t) {
          s.close_source();
          reg.reset();  // once
        });
        REQUIRE(r);
        reg = std::move(*r);
        REQUIRE(::write(pipe_fds[1], "x", 1) == 1);
        REQUIRE(run_until(*loop, [&] { return out.resumed > 0; }));
        REQUIRE_FALSE(*out.result);
        check_error(out.result->error(), errc::inval, S::call, "destroyed or closed");
        settle(*loop);
        CHECK(out.resumed == 1);
        CHECK_FALSE(reg.active());
        ::close(pipe_fds[0]);
        ::close(pipe_fds[1]);
      }
      SECTION("the awaited object destroyed between run calls: inval at the next one") {
        spawn_waiting(*loop, s, out);
        s.destroy_source();
        CHECK(out.resumed == 0);  // never from inside the destructor
        REQUIRE(loop->run_once(0ms));
        CHECK(out.resumed == 1);
        REQUIRE_FALSE(*out.result);
        CHECK(out.result->error() == errc::inval);
      }
      SECTION("destroyed and stopped in the same turn: resumed once") {
        spawn_waiting(*loop, s, out, 5000ms);
        s.destroy_source();
        loop->stop();
        REQUIRE(loop->run());
        settle(*loop);
        CHECK(out.resumed == 1);
        REQUIRE_FALSE(*out.result);
        CHECK(out.result->error() == errc::inval);
      }
    }
    SECTION("the loop destroyed with the spawned coroutine suspended: its frame goes, never resumed") {
      int frames = 0;
      spawn_waiting(*loop, s, out, ms(-1), &frames);
      loop.reset();
      CHECK(frames == 1);
      CHECK(out.resumed == 0);
      // the source goes after the loop (end of scope); the fake then checks nothing leaked
    }
    SECTION("the loop destroyed under a coroutine it does not own: never resumed; destroying it later is safe") {
      Eager co = eager_once(maker(s, *loop), out);
      REQUIRE(out.suspended());
      loop.reset();
      if constexpr (S::has_source) s.destroy_source();
      CHECK(out.resumed == 0);
      // co's frame (with its awaiter) is destroyed here, after the loop
    }
    SECTION("the awaiting frame destroyed: the awaiter leaves the loop") {
      {
        Eager co = eager_once(maker(s, *loop, 30ms), out);
        REQUIRE(out.suspended());
      }
      check_only_wakefd(fake, *loop);
      if constexpr (S::has_source) s.make_ready();
      std::this_thread::sleep_for(40ms);  // past the destroyed awaiter's deadline
      settle(*loop);
      CHECK(out.resumed == 0);
    }
  }
  fake.expect_clean();
  CHECK(fake.closed_while_watched() == 0);
}

TEST_CASE("a frame destroyed while its resumption is posted last: work posted afterwards still runs, the "
          "destroyed one never does",
          "[task][await][mutants][ctl-loop-posted-tail-dangling]") {
  fake::FakeProvider fake;
  {
    EventLoop loop = make_loop();
    EventSubject first(fake), second(fake);
    Outcome<expected<ConnEvent>> kept, dropped;
    Eager kept_co = eager_once(maker(first, loop), kept);
    std::optional<Eager> dropped_co(eager_once(maker(second, loop), dropped));
    REQUIRE(kept.suspended());
    REQUIRE(dropped.suspended());
    // Each destroyed source posts its awaiter's resumption: `dropped` is the last posted.
    first.destroy_source();
    second.destroy_source();
    CHECK(kept.resumed == 0);
    CHECK(dropped.resumed == 0);
    dropped_co.reset();  // its awaiter leaves the posted work with the frame

    // Posted after the removal: it must be linked behind `kept`, not behind the freed
    // frame's awaiter (ASan would report the write; without it the task would never run).
    int later = 0;
    REQUIRE(spawn(loop, [](int& ran) -> Task<void> {
      ++ran;
      co_return;
    }(later)));
    REQUIRE(loop.run_once(0ms));
    CHECK(kept.resumed == 1);
    REQUIRE(kept.result.has_value());
    REQUIRE_FALSE(*kept.result);
    check_error(kept.result->error(), errc::inval, EventSubject::call, "destroyed or closed");
    CHECK(later == 1);
    settle(loop);
    CHECK(kept.resumed == 1);
    CHECK(later == 1);
    CHECK(dropped.resumed == 0);
    check_only_wakefd(fake, loop);
  }
  fake.expect_clean();
}

TEST_CASE("sleep_for: resumes after the duration with success", "[task][await]") {
  fake::FakeProvider fake;
  {
    EventLoop loop = make_loop();
    Outcome<expected<void>> out;
    const auto t0 = Clock::now();
    REQUIRE(spawn(loop, await_once([&] { return loop.sleep_for(60ms); }, out)));
    REQUIRE(run_until(loop, [&] { return out.resumed > 0; }));
    CHECK(out.at - t0 >= 60ms);
    CHECK(out.at - t0 < 1500ms);
    CHECK(*out.result);
    settle(loop);
    CHECK(out.resumed == 1);

    SECTION("a negative duration is zero") {
      Outcome<expected<void>> now;
      REQUIRE(spawn(loop, await_once([&] { return loop.sleep_for(-5ms); }, now)));
      REQUIRE(run_until(loop, [&] { return now.resumed > 0; }, 500ms));
      CHECK(*now.result);
    }
    SECTION("sleepers resume in deadline order, each once") {
      std::vector<int> order;
      auto sleeper = [&](int id, ms d) -> Task<void> {
        auto r = co_await loop.sleep_for(d);
        CHECK(r);
        order.push_back(id);
      };
      REQUIRE(spawn(loop, sleeper(3, 90ms)));
      REQUIRE(spawn(loop, sleeper(1, 10ms)));
      REQUIRE(spawn(loop, sleeper(2, 50ms)));
      REQUIRE(run_until(loop, [&] { return order.size() == 3; }));
      settle(loop);
      CHECK(order == std::vector<int>{1, 2, 3});
    }
  }
  fake.expect_clean();
}

TEST_CASE("next_event: a coroutine awaiting again after each event sees each once, in order", "[task][await]") {
  fake::FakeProvider fake;
  {
    EventLoop loop = make_loop();
    Peer peer = open_peer(fake);
    Conn conn = outgoing(peer).connect().value();
    std::vector<ConnEvent> seen;
    int resumptions = 0;
    auto watcher = [&]() -> Task<void> {
      for (;;) {
        auto ev = co_await loop.next_event(conn);
        ++resumptions;
        if (!ev) co_return;
        seen.push_back(*ev);
        if (*ev == ConnEvent::closed) co_return;
      }
    };
    REQUIRE(spawn(loop, watcher()));
    REQUIRE(loop.run_once(0ms));
    fake.inject_event(*conn.fd(), RDMA_CM_EVENT_ESTABLISHED, "server says hi");
    REQUIRE(run_until(loop, [&] { return seen.size() == 1; }));
    fake.inject_event(*conn.fd(), RDMA_CM_EVENT_UNREACHABLE);
    fake.inject_event(*conn.fd(), RDMA_CM_EVENT_DISCONNECTED);
    fake.inject_event(*conn.fd(), RDMA_CM_EVENT_TIMEWAIT_EXIT);  // acknowledged, not reported
    REQUIRE(run_until(loop, [&] { return seen.size() == 3; }));
    settle(loop);
    CHECK(seen == std::vector<ConnEvent>{ConnEvent::established, ConnEvent::unreachable, ConnEvent::closed});
    CHECK(resumptions == 3);
    CHECK(text_of(*conn.private_data()).substr(0, 14) == "server says hi");
    CHECK(fake.queued(*conn.fd()) == 1);  // TIMEWAIT_EXIT: nobody awaits any more
  }
  fake.expect_clean();
}

TEST_CASE("an event and the timeout in the same turn: resumed once", "[task][await]") {
  fake::FakeProvider fake;
  {
    EventLoop loop = make_loop();
    EventSubject s(fake);
    Outcome<expected<ConnEvent>> out;
    spawn_waiting(loop, s, out, 20ms);
    s.make_ready();
    std::this_thread::sleep_for(40ms);  // both due when the loop looks next
    REQUIRE(loop.run_once(0ms));
    settle(loop);
    CHECK(out.resumed == 1);
    REQUIRE(out.result.has_value());
    if (*out.result) CHECK(**out.result == ConnEvent::closed);
    else CHECK(out.result->error() == errc::no_event);
  }
  fake.expect_clean();
}

TEST_CASE("completions: the receive queue of a connection with its own", "[task][await]") {
  fake::FakeProvider fake;
  {
    EventLoop loop = make_loop();
    Peer peer = open_peer(fake);
    ConnConfig cfg;
    cfg.rcq_size = 4;
    Conn conn = connected(fake, peer, cfg);
    Buffer buf(64, std::byte{0});
    MrLocal mr = reg(peer, buf, MrUsage::recv);
    REQUIRE(conn.recv(mr, 0, 16, 5));
    REQUIRE(conn.recv(mr, 16, 16, 6));
    ibv_wc wc[4]{};
    Outcome<expected<std::span<ibv_wc>>> out;
    REQUIRE(spawn(loop, await_once([&] { return loop.completions(conn, wc, CqKind::receive); }, out)));
    REQUIRE(loop.run_once(0ms));
    REQUIRE(out.suspended());
    REQUIRE(fake.deliver_recv(*conn.qp(), bytes_of("ping")));
    REQUIRE(run_until(loop, [&] { return out.resumed > 0; }));
    REQUIRE(*out.result);
    REQUIRE((*out.result)->size() == 1);
    CHECK(wc[0].wr_id == 5);
    CHECK(wc[0].opcode == IBV_WC_RECV);
    CHECK(text_of(std::span<const std::byte>(buf.data(), 4)) == "ping");

    SECTION("ready before: the second arrives before the next await") {
      REQUIRE(fake.deliver_recv(*conn.qp(), bytes_of("pong")));
      Outcome<expected<std::span<ibv_wc>>> next;
      Eager co = eager_once([&] { return loop.completions(conn, wc, CqKind::receive); }, next);
      CHECK(next.resumed == 1);
      REQUIRE(*next.result);
      CHECK(wc[0].wr_id == 6);
    }
    SECTION("the main queue of it sees no receive") {
      Outcome<expected<std::span<ibv_wc>>> main_q;
      REQUIRE(fake.deliver_recv(*conn.qp(), bytes_of("pong")));
      REQUIRE(spawn(loop, await_once([&] { return loop.completions(conn, wc, CqKind::main, 30ms); }, main_q)));
      REQUIRE(run_until(loop, [&] { return main_q.resumed > 0; }));
      REQUIRE_FALSE(*main_q.result);
      CHECK(main_q.result->error() == errc::no_event);
    }
  }
  fake.expect_clean();
}

TEST_CASE("completions: bad arguments are inval without waiting", "[task][await]") {
  fake::FakeProvider fake;
  {
    EventLoop loop = make_loop();
    Peer peer = open_peer(fake);
    Conn conn = connected(fake, peer);
    ibv_wc wc[1]{};
    Outcome<expected<std::span<ibv_wc>>> empty_out, no_rcq;
    Eager a = eager_once([&] { return loop.completions(conn, std::span<ibv_wc>()); }, empty_out);
    Eager b = eager_once([&] { return loop.completions(conn, wc, CqKind::receive); }, no_rcq);
    REQUIRE(empty_out.resumed == 1);
    REQUIRE(no_rcq.resumed == 1);
    check_inval(empty_out.result->error(), "EventLoop::completions", "room for 0");
    check_inval(no_rcq.result->error(), "EventLoop::completions", "receive completion queue");
    Conn moved = std::move(conn);
    Outcome<expected<ConnEvent>> from_empty;
    Eager c = eager_once([&] { return loop.next_event(conn); }, from_empty);
    REQUIRE(from_empty.resumed == 1);
    check_inval(from_empty.result->error(), "EventLoop::next_event", "empty");
  }
  fake.expect_clean();
}

TEST_CASE("connect: the peer's refusal, an unreachable peer, resolution errors, too much private data",
          "[task][await][connect]") {
  fake::FakeProvider fake;
  {
    EventLoop loop = make_loop();
    ConnectSubject s(fake);
    Outcome<expected<Conn>> out;
    auto finish_with = [&](rdma_cm_event_type type, int status = 0) {
      spawn_waiting(loop, s, out, 2000ms);
      fake.inject_event(s.conn_fd(), type, {}, status);
      REQUIRE(run_until(loop, [&] { return out.resumed > 0; }));
      settle(loop);
      CHECK(out.resumed == 1);
      REQUIRE_FALSE(*out.result);
      CHECK(fake.alive("cm_id") == 0);  // the failed connection is released
      return out.result->error();
    };
    SECTION("rejected: provider ECONNREFUSED") {
      auto e = finish_with(RDMA_CM_EVENT_REJECTED);
      check_error(e, errc::provider, "rdma_connect", "rejected");
      CHECK(e.sys_errno() == ECONNREFUSED);
    }
    SECTION("unreachable: provider EHOSTUNREACH") {
      auto e = finish_with(RDMA_CM_EVENT_UNREACHABLE);
      check_error(e, errc::provider, "rdma_connect", "unreachable");
      CHECK(e.sys_errno() == EHOSTUNREACH);
    }
    SECTION("the connection ends first: provider ECONNRESET") {
      auto e = finish_with(RDMA_CM_EVENT_CONNECT_ERROR);
      check_error(e, errc::provider, "rdma_connect", "lost");
      CHECK(e.sys_errno() == ECONNRESET);
    }
    SECTION("ADDR_ERROR: the resolution's error, at once") {
      fake.addr_event = RDMA_CM_EVENT_ADDR_ERROR;
      fake.addr_status = -ENETUNREACH;
      Eager co = eager_once(maker(s, loop), out);
      REQUIRE(out.resumed == 1);
      REQUIRE_FALSE(*out.result);
      check_error(out.result->error(), errc::provider, "rdma_resolve_addr", "ADDR_ERROR");
      CHECK(out.result->error().sys_errno() == ENETUNREACH);
      CHECK(fake.connects.empty());
      CHECK(fake.alive("cm_id") == 0);
    }
    SECTION("ADDR_ERROR after a suspension") {
      fake.auto_resolve = false;
      fake.addr_event = RDMA_CM_EVENT_ADDR_ERROR;
      fake.addr_status = -EHOSTUNREACH;
      spawn_waiting(loop, s, out);
      fake.deliver_held();
      REQUIRE(run_until(loop, [&] { return out.resumed > 0; }));
      REQUIRE_FALSE(*out.result);
      CHECK(out.result->error().call() == "rdma_resolve_addr");
      CHECK(out.result->error().sys_errno() == EHOSTUNREACH);
      CHECK(fake.alive("cm_id") == 0);
    }
    SECTION("resolution in steps, then ESTABLISHED") {
      fake.auto_resolve = false;
      spawn_waiting(loop, s, out);
      fake.deliver_held();  // ADDR_RESOLVED: the route is asked for
      REQUIRE(run_until(loop, [&] { return fake.calls().back() != "rdma_resolve_addr" && has_call(fake.calls(), "rdma_resolve_route"); }));
      fake.deliver_held();  // ROUTE_RESOLVED: rdma_connect
      REQUIRE(run_until(loop, [&] { return !fake.connects.empty(); }));
      CHECK(out.resumed == 0);
      s.make_ready();
      REQUIRE(run_until(loop, [&] { return out.resumed > 0; }));
      s.check_result(*out.result);
      settle(loop);
      CHECK(out.resumed == 1);
    }
    SECTION("one timeout for resolution and establishment together") {
      fake.auto_resolve = false;
      const auto t0 = Clock::now();
      spawn_waiting(loop, s, out, 400ms);
      auto deliver = [&]() -> Task<void> {
        auto slept = co_await loop.sleep_for(250ms);  // (no co_await inside Catch's macros)
        fake.deliver_held();
        auto slept_again = co_await loop.sleep_for(10ms);
        fake.deliver_held();
        CHECK(slept);
        CHECK(slept_again);
      };
      REQUIRE(spawn(loop, deliver()));
      REQUIRE(run_until(loop, [&] { return out.resumed > 0; }));
      const auto took = out.at - t0;
      CHECK(fake.connects.size() == 1);  // it got as far as connecting
      REQUIRE_FALSE(*out.result);
      check_error(out.result->error(), errc::no_event, "EventLoop::connect", "nothing within 400 ms");
      CHECK(took >= 400ms);
      CHECK(took < 600ms);  // not 400 ms again from the connect
      CHECK(fake.alive("cm_id") == 0);
    }
    SECTION("private data longer than 56 bytes: inval, nothing created") {
      const std::string long_data(57, 'x');
      const auto mark = fake.mark();
      Eager co = eager_once([&] { return loop.connect(s.peer, "169.254.77.9", "7471", {}, bytes_of(long_data)); }, out);
      REQUIRE(out.resumed == 1);
      REQUIRE_FALSE(*out.result);
      check_inval(out.result->error(), "EventLoop::connect", "57 bytes");
      CHECK(fake.calls_since(mark).empty());
      CHECK(fake.alive("cm_id") == 0);
      CHECK(fake.alive("event_channel") == 0);
    }
    SECTION("56 bytes are sent as they are") {
      const std::string max_data(56, 'y');
      Eager co = eager_once([&] { return loop.connect(s.peer, "169.254.77.9", "7471", {}, bytes_of(max_data)); }, out);
      REQUIRE(out.suspended());
      REQUIRE(fake.connects.size() == 1);
      CHECK(fake.connects[0].text() == max_data);
    }
    SECTION("on an iWARP device: 251 bytes are sent, 252 are inval naming the device, nothing created") {
      fake.set_caps(1, fake::DeviceCaps::siw());
      Peer siw = open_peer(fake, 1);
      const auto mark = fake.mark();
      Eager refused = eager_once(
          [&] { return loop.connect(siw, "169.254.78.9", "7471", {}, bytes_of(std::string(252, 'x'))); }, out);
      REQUIRE(out.resumed == 1);
      REQUIRE_FALSE(*out.result);
      check_inval(out.result->error(), "EventLoop::connect", "252 bytes, more than the 251 that fake1 (iWARP)");
      CHECK(fake.calls_since(mark).empty());
      const std::string max_data(251, 'w');
      Outcome<expected<Conn>> sent;
      Eager co = eager_once([&] { return loop.connect(siw, "169.254.78.9", "7471", {}, bytes_of(max_data)); }, sent);
      REQUIRE(sent.suspended());
      // rdma_connect runs on a thread of its own there: done once its eventfd is gone
      REQUIRE(run_until(loop, [&] { return fake.alive("eventfd") == 1; }));
      REQUIRE(fake.connects.size() == 1);
      CHECK(fake.connects[0].text() == max_data);
    }
    SECTION("a bad address is ConnReq::start's error, at once") {
      Eager co = eager_once([&] { return loop.connect(s.peer, "not an address", "7471"); }, out);
      REQUIRE(out.resumed == 1);
      REQUIRE_FALSE(*out.result);
      CHECK(out.result->error() == errc::inval);
      CHECK(fake.alive("cm_id") == 0);
    }
  }
  fake.expect_clean();
}

TEST_CASE("connect on iWARP: rdma_connect (siw's blocking TCP connect) on a thread of its own, the loop runs on",
          "[task][await][iwarp]") {
  fake::FakeProvider fake;
  fake.set_caps(1, fake::DeviceCaps::siw());
  {
    std::optional<EventLoop> loop(make_loop());
    Peer siw = open_peer(fake, 1);
    Outcome<expected<Conn>> out;
    const auto connect = [&](ms timeout) {
      return [&, timeout] { return loop->connect(siw, "169.254.78.9", "7471", {}, bytes_of("hi there"), timeout); };
    };
    // The loop's own eventfd only: the call's signal is closed once it was taken.
    const auto taken = [&] { return fake.alive("eventfd") == 1; };

    SECTION("other coroutines run while the call is held; then ESTABLISHED") {
      fake.hold_connects();
      REQUIRE(spawn(*loop, await_once(connect(ms(-1)), out)));
      REQUIRE(loop->run_once(0ms));  // the coroutine starts: resolved, the call on its thread
      REQUIRE(fake.connects_held(1));
      Outcome<expected<void>> slept;
      REQUIRE(spawn(*loop, await_once([&] { return loop->sleep_for(20ms); }, slept)));
      REQUIRE(run_until(*loop, [&] { return slept.resumed == 1; }));
      CHECK(*slept.result);
      CHECK(out.suspended());
      fake.release_connects();
      REQUIRE(run_until(*loop, taken));
      CHECK(out.suspended());  // now waiting for ESTABLISHED
      REQUIRE(fake.connects.size() == 1);
      CHECK(fake.connects[0].text() == "hi there");
      fake.inject_event(fake.connects[0].id->channel->fd, RDMA_CM_EVENT_ESTABLISHED);
      REQUIRE(run_until(*loop, [&] { return out.resumed == 1; }));
      INFO((*out.result ? std::string() : out.result->error().message()));
      REQUIRE(*out.result);
      CHECK(fake.connected(*(*out.result)->qp()));
    }
    SECTION("rdma_connect's failure comes back from its thread as ConnReq::connect's; the request is released") {
      fake.fail("rdma_connect", ECONNREFUSED);
      REQUIRE(spawn(*loop, await_once(connect(ms(-1)), out)));
      REQUIRE(run_until(*loop, [&] { return out.resumed == 1; }));
      REQUIRE_FALSE(*out.result);
      check_injected(out.result->error(), "rdma_connect", ECONNREFUSED);
      CHECK(out.result->error().operation() == std::string_view("EventLoop::connect"));
      CHECK(fake.alive("cm_id") == 0);
      CHECK(taken());
    }
    SECTION("the thread's eventfd or the thread itself cannot be made: provider, nothing left") {
      const std::string call = GENERATE("eventfd", "pthread_create");
      fake.fail(call, kErr);
      REQUIRE(spawn(*loop, await_once(connect(ms(-1)), out)));
      REQUIRE(run_until(*loop, [&] { return out.resumed == 1; }));
      REQUIRE_FALSE(*out.result);
      check_injected(out.result->error(), call, kErr);
      CHECK(fake.alive("cm_id") == 0);
      CHECK(fake.alive("qp") == 0);
      CHECK(taken());
      CHECK(fake.connects.empty());
    }
    SECTION("a timeout while the call is held resumes at once; the loop releases the request once the call returns") {
      fake.hold_connects();
      const auto t0 = Clock::now();
      REQUIRE(spawn(*loop, await_once(connect(100ms), out)));
      REQUIRE(loop->run_once(0ms));  // the coroutine starts: resolved, the call on its thread
      REQUIRE(fake.connects_held(1));
      REQUIRE(run_until(*loop, [&] { return out.resumed == 1; }));
      CHECK(out.at - t0 < 1s);
      REQUIRE_FALSE(*out.result);
      check_error(out.result->error(), errc::no_event, "EventLoop::connect", "nothing within 100 ms");
      CHECK(fake.alive("cm_id") == 1);  // still in rdma_connect
      fake.release_connects();
      REQUIRE(run_until(*loop, [&] { return fake.alive("cm_id") == 0; }));
      CHECK(taken());
    }
    SECTION("destroying the loop waits for a call in progress, then releases its request") {
      fake.hold_connects();
      REQUIRE(spawn(*loop, await_once(connect(ms(-1)), out)));
      REQUIRE(loop->run_once(0ms));  // the coroutine starts: resolved, the call on its thread
      REQUIRE(fake.connects_held(1));
      std::thread releaser([&] {
        std::this_thread::sleep_for(50ms);
        fake.release_connects();
      });
      loop.reset();
      releaser.join();
      CHECK(out.suspended());  // the loop's coroutine was destroyed, never resumed
      CHECK(fake.alive("cm_id") == 0);
      CHECK(fake.alive("eventfd") == 0);
    }
    SECTION("on InfiniBand and RoCE the call is made in the await itself: no thread") {
      Peer ib = open_peer(fake, 0);
      const auto mark = fake.mark();
      Eager co = eager_once([&] { return loop->connect(ib, "169.254.77.9", "7471"); }, out);
      REQUIRE(out.suspended());
      const auto calls = fake.calls_since(mark);
      CHECK(std::count(calls.begin(), calls.end(), "rdma_connect") == 1);
      CHECK(std::count(calls.begin(), calls.end(), "pthread_create") == 0);
      fake.deliver_held();
    }
  }
  fake.expect_clean();
}

TEST_CASE("next_conn_req: an Endpoint moved during the await still delivers; one assigned over is gone",
          "[task][await]") {
  fake::FakeProvider fake;
  {
    EventLoop loop = make_loop();
    ConnReqSubject s(fake);
    Outcome<expected<ConnReq>> out;
    spawn_waiting(loop, s, out);
    SECTION("moved: the link moves with the handle") {
      Endpoint moved = std::move(*s.ep);
      s.ep.emplace(std::move(moved));
      s.make_ready();
      REQUIRE(run_until(loop, [&] { return out.resumed > 0; }));
      s.check_result(*out.result);
    }
    SECTION("assigned over: inval") {
      Endpoint other = listen_on(s.peer, "169.254.77.1", "7472");
      *s.ep = std::move(other);
      REQUIRE(run_until(loop, [&] { return out.resumed > 0; }));
      REQUIRE_FALSE(*out.result);
      CHECK(out.result->error() == errc::inval);
    }
    settle(loop);
    CHECK(out.resumed == 1);
  }
  fake.expect_clean();
}

TEST_CASE("500 coroutines each await their own connection's next event: each resumed once", "[task][await][many]") {
  fake::FakeProvider fake;
  {
    EventLoop loop = make_loop();
    Peer peer = open_peer(fake);
    constexpr int n = 500;
    std::vector<Conn> conns;
    conns.reserve(n);
    for (int i = 0; i < n; ++i) conns.push_back(connected(fake, peer));
    std::vector<int> resumed(n, 0);
    std::vector<std::optional<expected<ConnEvent>>> got(n);
    int finished = 0;
    auto waiter = [&](int i) -> Task<void> {
      auto ev = co_await loop.next_event(conns[static_cast<std::size_t>(i)], 5000ms);
      ++resumed[static_cast<std::size_t>(i)];
      got[static_cast<std::size_t>(i)].emplace(ev);
      ++finished;
    };
    for (int i = 0; i < n; ++i) REQUIRE(spawn(loop, waiter(i)));
    REQUIRE(loop.run_once(0ms));
    CHECK(finished == 0);
    CHECK(fake.watched(loop.core()->epfd).size() == n + 1);
    // in reverse order, and the odd ones first
    for (int i = n - 1; i >= 0; --i)
      if (i % 2) fake.inject_event(*conns[static_cast<std::size_t>(i)].fd(), RDMA_CM_EVENT_DISCONNECTED);
    for (int i = n - 1; i >= 0; --i)
      if (!(i % 2)) fake.inject_event(*conns[static_cast<std::size_t>(i)].fd(), RDMA_CM_EVENT_UNREACHABLE);
    REQUIRE(run_until(loop, [&] { return finished == n; }));
    settle(loop);
    for (int i = 0; i < n; ++i) {
      INFO("coroutine " << i);
      CHECK(resumed[static_cast<std::size_t>(i)] == 1);
      REQUIRE(got[static_cast<std::size_t>(i)]);
      REQUIRE(*got[static_cast<std::size_t>(i)]);
      CHECK(**got[static_cast<std::size_t>(i)] == (i % 2 ? ConnEvent::closed : ConnEvent::unreachable));
    }
    check_only_wakefd(fake, loop);
  }
  fake.expect_clean();
}

// ---- Task, spawn, block_on

namespace {

Task<int> answer(EventLoop& loop) {
  auto slept = co_await loop.sleep_for(1ms);
  REQUIRE(slept);
  co_return 42;
}
Task<int> answer_now() { co_return 7; }
Task<std::unique_ptr<std::string>> boxed(EventLoop& loop, std::string s) {
  if (auto slept = co_await loop.sleep_for(1ms); !slept) FAIL(slept.error().message());
  co_return std::make_unique<std::string>(std::move(s));
}
Task<int> throws_after_await(EventLoop& loop) {
  if (auto slept = co_await loop.sleep_for(1ms); !slept) FAIL(slept.error().message());
  throw std::runtime_error("boom after await");
}
Task<int> throws_at_once() { throw std::runtime_error("boom at once"); co_return 0; }

struct LogCapture {
  struct Entry {
    LogLevel level;
    std::string where, message;
  };
  static inline std::mutex mutex;
  static inline std::vector<Entry> entries;
  static void record(LogLevel level, std::string_view where, std::string_view message) noexcept {
    std::lock_guard<std::mutex> lock(mutex);
    entries.push_back({level, std::string(where), std::string(message)});
  }
  LogCapture() {
    entries.clear();
    set_log_function(&record);
  }
  ~LogCapture() { set_log_function(nullptr); }
};

}  // namespace

TEST_CASE("Task: nested tasks return values and pass exceptions to the awaiting coroutine", "[task]") {
  fake::FakeProvider fake;
  {
    EventLoop loop = make_loop();
    SECTION("values, move-only ones too") {
      auto outer = [&]() -> Task<std::string> {
        int a = co_await answer(loop);
        int b = co_await answer_now();
        auto box = co_await boxed(loop, "boxed");
        co_return std::to_string(a) + "," + std::to_string(b) + "," + *box;
      };
      auto r = block_on(loop, outer());
      REQUIRE(r);
      CHECK(*r == "42,7,boxed");
    }
    SECTION("an exception, thrown after a suspension or at once, reaches the awaiting coroutine") {
      auto outer = [&]() -> Task<std::string> {
        std::string seen;
        try {
          (void)co_await throws_after_await(loop);
          seen += "not thrown;";
        } catch (const std::runtime_error& e) {
          seen += std::string(e.what()) + ";";
        }
        try {
          (void)co_await throws_at_once();
          seen += "not thrown;";
        } catch (const std::runtime_error& e) {
          seen += e.what();
        }
        co_return seen;
      };
      auto r = block_on(loop, outer());
      REQUIRE(r);
      CHECK(*r == "boom after await;boom at once");
    }
    SECTION("block_on rethrows what escapes the task") {
      auto outer = [&]() -> Task<int> { co_return co_await throws_after_await(loop); };
      CHECK_THROWS_WITH(block_on(loop, outer()), "boom after await");
      CHECK_THROWS_WITH(block_on(loop, throws_at_once()), "boom at once");
      // the loop goes on
      auto r = block_on(loop, answer(loop));
      REQUIRE(r);
      CHECK(*r == 42);
    }
    SECTION("a Task of expected: both levels come back as they are") {
      auto inner = [&]() -> Task<expected<int>> { co_return detail::fail(detail::invalid("inner", "said no")); };
      auto r = block_on(loop, inner());
      REQUIRE(r);
      REQUIRE_FALSE(*r);
      CHECK(r->error() == Error(errc::inval, 0, "inner", "said no"));  // as the task made it
    }
  }
  fake.expect_clean();
}

TEST_CASE("Task: one destroyed before it ran does nothing; a spawned one goes with the loop unrun", "[task]") {
  fake::FakeProvider fake;
  int ran = 0, frames = 0;
  auto body = [](int& r, FrameMark) -> Task<void> {
    ++r;
    co_return;
  };
  {
    auto t = body(ran, FrameMark(&frames));
    CHECK(t);
  }
  CHECK(ran == 0);
  CHECK(frames == 1);
  {
    EventLoop loop = make_loop();
    REQUIRE(spawn(loop, body(ran, FrameMark(&frames))));
    CHECK(ran == 0);  // not before the loop runs
  }
  CHECK(ran == 0);
  CHECK(frames == 2);
  {
    EventLoop loop = make_loop();
    REQUIRE(spawn(loop, body(ran, FrameMark(&frames))));
    REQUIRE(loop.run_once(0ms));
    CHECK(ran == 1);
    CHECK(frames == 3);  // finished: the loop destroyed its frame
  }
  fake.expect_clean();
}

TEST_CASE("spawn: an escaping exception is logged and returned by run as unknown", "[task]") {
  fake::FakeProvider fake;
  LogCapture log;
  {
    EventLoop loop = make_loop();
    int frames = 0;
    auto thrower = [&](FrameMark) -> Task<void> {
      if (auto slept = co_await loop.sleep_for(1ms); !slept) FAIL(slept.error().message());
      throw std::runtime_error("spawned boom");
    };
    REQUIRE(spawn(loop, thrower(FrameMark(&frames))));
    auto r = loop.run_for(2000ms);
    REQUIRE_FALSE(r);
    check_error(r.error(), errc::unknown, "EventLoop::run", "spawned boom");
    CHECK(frames == 1);
    {
      std::lock_guard<std::mutex> lock(LogCapture::mutex);
      REQUIRE(LogCapture::entries.size() == 1);
      CHECK(LogCapture::entries[0].level == LogLevel::error);
      CHECK(LogCapture::entries[0].where == "EventLoop::run");
      CHECK_THAT(LogCapture::entries[0].message, Catch::Contains("spawned boom"));
    }
    SECTION("something else than a std::exception") {
      auto odd = []() -> Task<void> {
        throw 42;
        co_return;
      };
      REQUIRE(spawn(loop, odd()));
      auto again = loop.run_once(0ms);
      REQUIRE_FALSE(again);
      check_error(again.error(), errc::unknown, "EventLoop::run", "not a std::exception");
    }
    SECTION("the loop goes on afterwards") {
      auto ok = block_on(loop, answer(loop));
      REQUIRE(ok);
      CHECK(*ok == 42);
    }
    SECTION("block_on returns it and destroys its own task") {
      REQUIRE(spawn(loop, thrower(FrameMark(&frames))));
      int own_frames = 0;
      auto waits = [&](FrameMark) -> Task<int> {
        if (auto slept = co_await loop.sleep_for(10s); !slept) FAIL(slept.error().message());
        co_return 1;
      };
      auto b = block_on(loop, waits(FrameMark(&own_frames)));
      REQUIRE_FALSE(b);
      check_error(b.error(), errc::unknown, "EventLoop::run", "spawned boom");
      CHECK(own_frames == 1);
      check_only_wakefd(fake, loop);
    }
  }
  fake.expect_clean();
}

TEST_CASE("spawn and block_on: what they refuse", "[task]") {
  fake::FakeProvider fake;
  {
    EventLoop loop = make_loop();
    SECTION("an empty task") {
      auto t = answer_now();
      auto moved = std::move(t);
      Task<void> empty = []() -> Task<void> { co_return; }();
      Task<void> taken = std::move(empty);
      check_inval(spawn(loop, std::move(empty)).error(), "spawn", "empty");
      check_inval(block_on(loop, std::move(t)).error(), "block_on", "empty");
    }
    SECTION("an empty loop") {
      EventLoop other = std::move(loop);
      check_inval(spawn(loop, []() -> Task<void> { co_return; }()).error(), "spawn");
      check_inval(block_on(loop, answer_now()).error(), "block_on");
    }
    SECTION("a finished task") {
      Task<void> t = []() -> Task<void> { co_return; }();
      auto awaits = [](Task<void>& inner) -> Task<void> { co_await inner; };
      REQUIRE(block_on(loop, awaits(t)));
      check_inval(spawn(loop, std::move(t)).error(), "spawn", "finished");
    }
    SECTION("a started task, suspended in its await") {
      int done = 0;
      auto sleeper = [&]() -> Task<void> {
        if (auto slept = co_await loop.sleep_for(20ms); !slept) FAIL(slept.error().message());
        ++done;
      };
      Task<void> t = sleeper();
      auto awaits = [&](Task<void>& inner) -> Task<void> {
        co_await inner;
        ++done;
      };
      Task<void> outer = awaits(t);
      // started by `outer`, which stays the only one to resume it
      auto keep = [&](Task<void>& o) -> Task<void> { co_await o; };
      REQUIRE(spawn(loop, keep(outer)));
      REQUIRE(loop.run_once(0ms));
      check_inval(spawn(loop, std::move(t)).error(), "spawn", "started");
      // t's frame went with the refused spawn; outer stays suspended until the loop goes
      settle(loop);
      CHECK(done == 0);
    }
    SECTION("block_on from a handler") {
      int pipe_fds[2];
      REQUIRE(::pipe(pipe_fds) == 0);
      std::optional<expected<int>> inner;
      auto reg = loop.watch_fd(pipe_fds[0], EPOLLIN, [&](std::uint32_t) {
        if (!inner) inner.emplace(block_on(loop, answer_now()));
      });
      REQUIRE(reg);
      REQUIRE(::write(pipe_fds[1], "x", 1) == 1);
      REQUIRE(run_until(loop, [&] { return inner.has_value(); }));
      reg->reset();
      ::close(pipe_fds[0]);
      ::close(pipe_fds[1]);
      REQUIRE_FALSE(*inner);
      check_inval(inner->error(), "block_on", "from a handler or coroutine");
    }
    SECTION("block_on and run from a coroutine of the loop") {
      std::optional<expected<int>> nested;
      std::optional<expected<void>> ran;
      auto co = [&]() -> Task<void> {
        nested.emplace(block_on(loop, answer_now()));
        ran.emplace(loop.run_for(10ms));
        co_return;
      };
      auto later = [&]() -> Task<void> {  // (a coroutine lambda must outlive its coroutine)
        if (auto slept = co_await loop.sleep_for(1ms); !slept) FAIL(slept.error().message());
        co_await co();
      };
      SECTION("spawned") { REQUIRE(spawn(loop, co())); }
      SECTION("resumed after an await") { REQUIRE(spawn(loop, later())); }
      REQUIRE(run_until(loop, [&] { return ran.has_value(); }));
      REQUIRE_FALSE(*nested);
      check_inval(nested->error(), "block_on", "from a handler or coroutine");
      REQUIRE_FALSE(*ran);
      check_inval(ran->error(), "EventLoop::run_for", "from a handler or coroutine");
    }
  }
  fake.expect_clean();
}

TEST_CASE("block_on: a task awaiting when another thread stops the loop gets the stop error", "[task]") {
  fake::FakeProvider fake;
  {
    EventLoop loop = make_loop();
    auto waits = [&]() -> Task<expected<void>> { co_return co_await loop.sleep_for(10s); };
    std::thread stopper([&loop] {
      std::this_thread::sleep_for(30ms);
      loop.stop();
    });
    const auto t0 = Clock::now();
    auto r = block_on(loop, waits());
    stopper.join();
    CHECK(Clock::now() - t0 < 2000ms);
    REQUIRE(r);
    REQUIRE_FALSE(*r);
    check_stopped(r->error(), "EventLoop::sleep_for");
  }
  fake.expect_clean();
}

TEST_CASE("next_event: a coroutine waiting on a connection resumes with lost when a completion says "
          "the peer stopped answering", "[task][await][lost]") {
  fake::FakeProvider fake;
  {
    EventLoop loop = make_loop();
    Peer peer = open_peer(fake);
    Conn conn = outgoing(peer).connect().value();
    std::optional<expected<ConnEvent>> seen;
    std::optional<expected<std::span<ibv_wc>>> read;
    ibv_wc wc[4];
    auto watcher = [&]() -> Task<void> { seen = co_await loop.next_event(conn, 5000ms); };
    auto reader = [&]() -> Task<void> { read = co_await loop.completions(conn, wc, CqKind::main, 5000ms); };
    REQUIRE(spawn(loop, watcher()));
    REQUIRE(spawn(loop, reader()));
    settle(loop);
    CHECK_FALSE(seen.has_value());
    ibv_wc failed{};
    failed.status = IBV_WC_RETRY_EXC_ERR;
    fake.add_completion(*conn.cq()->native(), failed);
    REQUIRE(run_until(loop, [&] { return seen.has_value(); }));
    REQUIRE(read.has_value());
    REQUIRE(*read);
    CHECK((*read)->front().status == IBV_WC_RETRY_EXC_ERR);
    CHECK(*seen == ConnEvent::lost);
  }
  fake.expect_clean();
}

// ---- the second review's defects (review 2.N) and decisions (review 2.D)

TEST_CASE("review 2.1: co_await completions re-arms a queue an earlier await could not: the next "
          "completion comes",
          "[task][await][completions][review]") {
  fake::FakeProvider fake;
  {
    EventLoop loop = make_loop();
    Peer peer = open_peer(fake);
    Conn conn = connected(fake, peer);
    ibv_cq* cq = *conn.cq()->native();
    ibv_wc wc[4]{};
    // The first completion is polled before its event is taken; the second await takes the
    // event, and its re-arm fails.
    fake.add_completion(cq, completion(1));
    {
      Outcome<expected<std::span<ibv_wc>>> first;
      REQUIRE(spawn(loop, await_once([&] { return loop.completions(conn, wc); }, first)));
      REQUIRE(run_until(loop, [&] { return first.resumed > 0; }));
      REQUIRE(*first.result);
      CHECK(wc[0].wr_id == 1);
    }
    fake.fail("ibv_req_notify_cq", kErr);
    Outcome<expected<std::span<ibv_wc>>> failed;
    REQUIRE(spawn(loop, await_once([&] { return loop.completions(conn, wc, CqKind::main, 500ms); }, failed)));
    REQUIRE(run_until(loop, [&] { return failed.resumed > 0; }));
    REQUIRE_FALSE(*failed.result);
    check_injected(failed.result->error(), "ibv_req_notify_cq", kErr);
    CHECK_FALSE(fake.armed(cq));

    Outcome<expected<std::span<ibv_wc>>> next;
    REQUIRE(spawn(loop, await_once([&] { return loop.completions(conn, wc, CqKind::main, 2000ms); }, next)));
    settle(loop);
    CHECK(next.suspended());
    CHECK(fake.armed(cq));  // re-armed before it waits
    fake.add_completion(cq, completion(2));
    REQUIRE(run_until(loop, [&] { return next.resumed > 0; }));
    INFO((*next.result ? std::string() : next.result->error().message()));
    REQUIRE(*next.result);
    CHECK(wc[0].wr_id == 2);
  }
  CHECK(fake.alive("unacked_cq_event") == 0);
  fake.expect_clean();
}

TEST_CASE("review 2.2: co_await next_conn_req holds the Srq's queue: the handle destroyed during the "
          "await, the request still gets it",
          "[task][await][srq][review]") {
  fake::FakeProvider fake;
  {
    EventLoop loop = make_loop();
    Peer peer = open_peer(fake);
    Endpoint ep = listen_on(peer, "169.254.77.1");
    std::optional<Srq> srq;
    {
      auto made = Srq::create(peer, SrqConfig{8, 0});
      REQUIRE(made);
      srq.emplace(std::move(*made));
    }
    ibv_srq* native = *srq->native();
    Outcome<expected<ConnReq>> out;
    {
      ConnConfig cfg;  // gone with the call's scope too
      cfg.srq = &*srq;
      REQUIRE(spawn(loop, await_once([&loop, &ep, cfg] { return loop.next_conn_req(ep, cfg); }, out)));
      settle(loop);
    }
    CHECK(out.suspended());
    srq.reset();
    fake.inject_connect_request(*ep.fd(), {});
    REQUIRE(run_until(loop, [&] { return out.resumed > 0; }));
    INFO((*out.result ? std::string() : out.result->error().message()));
    REQUIRE(*out.result);
    auto conn = std::move(**out.result).connect();
    REQUIRE(conn);
    CHECK((*conn->qp())->srq == native);
  }
  fake.expect_clean();
}

TEST_CASE("review 2.3: a coroutine destroys the loop that runs it: the loop goes when it suspends",
          "[task][lifetime][review]") {
  fake::FakeProvider fake;
  {
    std::optional<EventLoop> loop(make_loop());
    int frames = 0;
    Outcome<expected<void>> sleeper;  // another owned coroutine: destroyed with the loop
    REQUIRE(spawn(*loop, await_once([&] { return loop->sleep_for(1h); }, sleeper, FrameMark(&frames))));
    SECTION("a spawned one, after an await") {
      auto destroyer = [&]() -> Task<void> {
        if (auto slept = co_await loop->sleep_for(1ms); !slept) FAIL(slept.error().message());
        loop.reset();
      };
      REQUIRE(spawn(*loop, destroyer()));
      CHECK(loop->run());
      CHECK(sleeper.started == 1);
    }
    SECTION("block_on's, which finishes") {
      auto destroyer = [&]() -> Task<int> {
        if (auto slept = co_await loop->sleep_for(1ms); !slept) FAIL(slept.error().message());
        loop.reset();
        co_return 5;
      };
      auto r = block_on(*loop, destroyer());
      REQUIRE(r);
      CHECK(*r == 5);
      CHECK(sleeper.started == 1);
    }
    SECTION("block_on's, in its first step, without finishing") {
      auto destroyer = [&]() -> Task<int> {
        loop.reset();
        co_await std::suspend_always{};
        co_return 5;
      };
      auto r = block_on(*loop, destroyer());
      REQUIRE_FALSE(r);
      check_inval(r.error(), "block_on", "destroyed before the task finished");
    }
    CHECK_FALSE(loop);
    CHECK(frames == 1);  // started or not, its frame went with the loop
    CHECK(sleeper.resumed == 0);
  }
  fake.expect_clean();
}

TEST_CASE("review 2.4: a timeout of milliseconds::max() is no limit (no overflow)",
          "[task][await][review]") {
  fake::FakeProvider fake;
  {
    EventLoop loop = make_loop();
    Peer peer = open_peer(fake);
    Conn conn = connected(fake, peer);
    Outcome<expected<ConnEvent>> event;
    Outcome<expected<void>> slept;
    REQUIRE(spawn(loop, await_once([&] { return loop.next_event(conn, ms::max()); }, event)));
    REQUIRE(spawn(loop, await_once([&] { return loop.sleep_for(ms::max()); }, slept)));
    REQUIRE(loop.run_for(50ms));
    CHECK(event.suspended());
    CHECK(slept.suspended());
    loop.stop();
    REQUIRE(loop.run());
    REQUIRE(event.resumed == 1);
    REQUIRE(slept.resumed == 1);
    CHECK_THAT(str(event.result->error().message()), Catch::Contains("stopped"));
    CHECK_THAT(str(slept.result->error().message()), Catch::Contains("stopped"));
  }
  fake.expect_clean();
}

TEST_CASE("review 2.5: co_await on an empty Task: inval for an expected, std::invalid_argument otherwise",
          "[task][review]") {
  fake::FakeProvider fake;
  {
    EventLoop loop = make_loop();
    auto value = []() -> Task<expected<int>> { co_return 1; };
    auto plain = []() -> Task<void> { co_return; };
    auto outer = [&]() -> Task<std::string> {
      std::string seen;
      Task<expected<int>> moved_from = value();
      Task<expected<int>> taken = std::move(moved_from);
      auto r = co_await moved_from;
      if (!r && r.error() == errc::inval && str(r.error().call()) == "Task") seen += "inval[" + str(r.error().reason()) + "];";
      Task<void> spawned = plain();
      if (!spawn(loop, std::move(spawned))) seen += "spawn failed;";
      try {
        co_await spawned;
        seen += "no exception;";
      } catch (const std::invalid_argument& e) {
        seen += "thrown[" + std::string(e.what()) + "];";
      }
      if (auto v = co_await taken; v && *v == 1) seen += "the moved one works";
      co_return seen;
    };
    auto r = block_on(loop, outer());
    REQUIRE(r);
    const std::string reason = "co_await on an empty Task (moved from, or handed to spawn)";
    CHECK(*r == "inval[" + reason + "];thrown[" + reason + "];the moved one works");
  }
  fake.expect_clean();
}

TEST_CASE("review 2.D: co_await completions(CqKind::receive) on a shared completion channel is inval",
          "[task][await][review]") {
  fake::FakeProvider fake;
  {
    EventLoop loop = make_loop();
    Peer peer = open_peer(fake);
    ConnConfig cfg;
    cfg.rcq_size = 8;
    cfg.shared_completion_channel = true;
    Conn conn = connected(fake, peer, cfg);
    ibv_wc wc[1]{};
    Outcome<expected<std::span<ibv_wc>>> out;
    Eager co = eager_once([&] { return loop.completions(conn, wc, CqKind::receive); }, out);
    REQUIRE(out.resumed == 1);
    check_inval(out.result->error(), "EventLoop::completions", "CqKind::main");
  }
  fake.expect_clean();
}

}  // namespace task_test
