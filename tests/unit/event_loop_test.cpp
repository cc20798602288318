// EventLoop: handlers for plain fds, endpoints, connections, outgoing requests and
// completions; re-entrancy; exceptions escaping handlers; lifetimes of loops, sources and
// registrations; shared listeners with a handler; stop()/wake() from other threads; every
// provider call of the loop failing.
#include "data_util.hpp"
#include "loop_util.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <functional>
#include <mutex>
#include <optional>
#include <set>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace event_loop_test {

using namespace test;
using namespace std::chrono_literals;

namespace {

/// A non-blocking pipe (real fds). Declare it before the loop and the registrations that
/// watch it: it must be closed after they are gone.
struct Pipe {
  int r = -1, w = -1;
  Pipe() {
    int fds[2];
    REQUIRE(::pipe2(fds, O_NONBLOCK | O_CLOEXEC) == 0);
    r = fds[0];
    w = fds[1];
  }
  ~Pipe() {
    if (r >= 0) ::close(r);
    if (w >= 0) ::close(w);
  }
  Pipe(const Pipe&) = delete;
  Pipe& operator=(const Pipe&) = delete;
  void put(std::string_view s) const {
    REQUIRE(::write(w, s.data(), s.size()) == static_cast<ssize_t>(s.size()));
  }
  /// Reads up to `max` bytes ("" when empty).
  std::string take(std::size_t max = 256) const {
    char buf[256];
    const ssize_t n = ::read(r, buf, std::min(max, sizeof buf));
    return n > 0 ? std::string(buf, static_cast<std::size_t>(n)) : std::string();
  }
};

// The log hook: a plain function, so the records are global (guarded: any thread may log).
struct LogRecord {
  LogLevel level;
  std::string where, message;
};
std::mutex log_mutex;
std::vector<LogRecord> log_records;

void record_log(LogLevel level, std::string_view where, std::string_view message) noexcept {
  try {
    std::lock_guard lock(log_mutex);
    log_records.push_back({level, std::string(where), std::string(message)});
  } catch (...) {
  }
}

/// Captures every message (threshold debug) while it lives.
struct LogCapture {
  LogCapture() {
    {
      std::lock_guard lock(log_mutex);
      log_records.clear();
    }
    set_log_threshold(LogLevel::debug);
    set_log_function(record_log);
  }
  ~LogCapture() {
    set_log_function(nullptr);
    set_log_threshold(LogLevel::warning);
  }
  std::vector<LogRecord> records() const {
    std::lock_guard lock(log_mutex);
    return log_records;
  }
  /// The records at `level` whose message contains `words`.
  std::vector<LogRecord> find(LogLevel level, std::string_view words = {}) const {
    std::vector<LogRecord> out;
    for (auto& r : records())
      if (r.level == level && r.message.find(words) != std::string::npos) out.push_back(r);
    return out;
  }
  std::string all() const {
    std::string text;
    for (auto& r : records()) text += std::string(to_string(r.level)) + " " + r.where + ": " + r.message + "\n";
    return text;
  }
};

/// The fds in the loop's epoll set besides its own eventfd.
std::size_t watched_sources(const fake::FakeProvider& fake, const EventLoop& loop) {
  auto set = fake.watched(loop.core()->epfd);
  REQUIRE(set.count(loop.core()->wakefd) == 1);
  return set.size() - 1;
}

/// O_NONBLOCK on a (fake) channel's fd, as the provider's fcntl reports it.
bool nonblocking_fd(int fd) {
  const int flags = rpmapp::detail::provider().fcntl(fd, F_GETFL, 0);
  REQUIRE(flags >= 0);
  return (flags & O_NONBLOCK) != 0;
}

/// A request's private data as text (the fake pads it with zero bytes); "?" when it cannot
/// be read. No assertion: handlers of other threads call it (Catch2 is not thread-safe).
std::string text_of(const ConnReq& req) {
  auto data = req.private_data();
  if (!data) return "?";
  std::string s(as_text(*data));
  return s.substr(0, s.find('\0'));
}

}  // namespace

// ---- plain fds, and the loop's running calls

TEST_CASE("watch_fd: a pipe's readiness reaches the handler until it is unregistered",
          "[event_loop][watch_fd]") {
  fake::FakeProvider fake;
  {
    Pipe pipe;
    EventLoop loop = make_loop();
    std::string got;
    std::vector<std::uint32_t> events;
    auto reg = registered(loop.watch_fd(pipe.r, EPOLLIN, [&](std::uint32_t ev) {
      events.push_back(ev);
      got += pipe.take(1);  // one byte per call: level-triggered, it comes back
    }));
    CHECK(ran(loop.run_once(0ms)) == 0);
    CHECK(events.empty());
    pipe.put("abc");
    for (int i = 0; i < 3; ++i) CHECK(ran(loop.run_once(0ms)) == 1);
    CHECK(got == "abc");  // in order, each byte once
    REQUIRE(events.size() == 3);
    for (auto ev : events) CHECK(ev == EPOLLIN);
    CHECK(ran(loop.run_once(0ms)) == 0);  // drained
    CHECK(events.size() == 3);

    // EPOLLOUT on the write end; EPOLLHUP once the write end is closed.
    int writable = 0;
    auto out = registered(loop.watch_fd(pipe.w, EPOLLOUT, [&](std::uint32_t ev) {
      CHECK((ev & EPOLLOUT) != 0);
      ++writable;
    }));
    CHECK(ran(loop.run_once(0ms)) == 1);
    CHECK(writable == 1);
    out.reset();
    CHECK_FALSE(out.active());
    CHECK(watched_sources(fake, loop) == 1);
    ::close(pipe.w);
    pipe.w = -1;
    CHECK(ran(loop.run_once(1000ms)) == 1);
    REQUIRE(events.size() == 4);
    CHECK((events.back() & EPOLLHUP) != 0);

    reg.reset();
    CHECK_FALSE(reg.active());
    CHECK(watched_sources(fake, loop) == 0);
    CHECK(ran(loop.run_once(0ms)) == 0);  // the hang-up is no longer watched
    CHECK(events.size() == 4);
    CHECK(writable == 1);
  }
  CHECK(fake.closed_while_watched() == 0);
  fake.expect_clean();
}

TEST_CASE("watch_fd: bad arguments are inval; watching an fd twice is EEXIST",
          "[event_loop][watch_fd][inval]") {
  fake::FakeProvider fake;
  {
    Pipe pipe;
    EventLoop loop = make_loop();
    auto negative = loop.watch_fd(-1, EPOLLIN, [](std::uint32_t) {});
    REQUIRE_FALSE(negative);
    check_inval(negative.error(), "EventLoop::watch_fd", "negative");
    auto empty = loop.watch_fd(pipe.r, EPOLLIN, {});
    REQUIRE_FALSE(empty);
    check_inval(empty.error(), "EventLoop::watch_fd", "handler is empty");
    auto first = registered(loop.watch_fd(pipe.r, EPOLLIN, [](std::uint32_t) {}));
    auto twice = loop.watch_fd(pipe.r, EPOLLIN, [](std::uint32_t) {});
    REQUIRE_FALSE(twice);
    CHECK(twice.error().code() == errc::provider);
    CHECK(twice.error().call() == "epoll_ctl");
    CHECK(twice.error().sys_errno() == EEXIST);
    CHECK_THAT(twice.error().message(), Catch::Contains("already watched"));
    CHECK(first.active());  // the failed second registration did not disturb the first

    EventLoop moved = std::move(loop);
    auto from_moved = loop.watch_fd(pipe.r, EPOLLIN, [](std::uint32_t) {});
    REQUIRE_FALSE(from_moved);
    check_inval(from_moved.error(), "EventLoop::watch_fd");
    check_inval(loop.run_once(0ms).error(), "EventLoop::run_once");
    check_inval(loop.run().error(), "EventLoop::run");
    loop.stop();  // harmless on an empty loop
    loop.wake();
    // The registration made through the loop before the move still works.
    int called = 0;
    auto reg = registered(moved.watch_fd(pipe.w, EPOLLOUT, [&](std::uint32_t) { ++called; }));
    CHECK(ran(moved.run_once(0ms)) == 1);
    CHECK(called == 1);
  }
  fake.expect_clean();
}

TEST_CASE("Registration: default, move, reset; it outlives its loop", "[event_loop][lifetime]") {
  fake::FakeProvider fake;
  {
    Pipe pipe;
    Registration none;
    CHECK_FALSE(none.active());
    CHECK_FALSE(static_cast<bool>(none));
    none.reset();  // idempotent on nothing

    std::optional<EventLoop> loop(make_loop());
    int a_calls = 0, b_calls = 0;
    Registration a = registered(loop->watch_fd(pipe.w, EPOLLOUT, [&](std::uint32_t) { ++a_calls; }));
    Registration moved(std::move(a));
    CHECK_FALSE(a.active());
    CHECK(moved.active());
    CHECK(ran(loop->run_once(0ms)) == 1);
    CHECK(a_calls == 1);
    // Assigning over a registration unregisters what it held.
    moved = registered(loop->watch_fd(pipe.r, EPOLLIN, [&](std::uint32_t) { ++b_calls; }));
    CHECK(watched_sources(fake, *loop) == 1);
    CHECK(ran(loop->run_once(0ms)) == 0);  // the write end is no longer watched
    CHECK(a_calls == 1);
    pipe.put("x");
    CHECK(ran(loop->run_once(0ms)) == 1);
    CHECK(b_calls == 1);

    // The loop goes first: the registration becomes inactive and is released safely.
    loop.reset();
    CHECK(fake.alive("epoll") == 0);
    CHECK(fake.alive("eventfd") == 0);
    CHECK_FALSE(moved.active());
    moved.reset();
    moved.reset();
  }
  fake.expect_clean();
}

TEST_CASE("run, run_for, run_once: stop, bounds, and no calls from a handler",
          "[event_loop][run]") {
  fake::FakeProvider fake;
  {
    Pipe pipe;
    EventLoop loop = make_loop();

    SECTION("run_for returns after its bound, run_once(0) at once") {
      const auto start = std::chrono::steady_clock::now();
      CHECK(loop.run_for(50ms));
      const auto took = std::chrono::steady_clock::now() - start;
      CHECK(took >= 50ms);
      CHECK(took < 2000ms);
      CHECK(ran(loop.run_once(0ms)) == 0);
      CHECK(ran(loop.run_once(20ms)) == 0);
    }
    SECTION("stop() before run: run returns at once, once") {
      loop.stop();
      CHECK(loop.run());
      CHECK(ran(loop.run_once(0ms)) == 0);  // consumed by run: nothing pending
      loop.stop();
      CHECK(ran(loop.run_once(0ms)) == 0);  // a pending stop is handled by run_once
      const auto start = std::chrono::steady_clock::now();
      CHECK(loop.run_for(30ms));  // ... and no longer pending
      CHECK(std::chrono::steady_clock::now() - start >= 30ms);
    }
    SECTION("a handler stops the loop: run returns after that dispatch") {
      pipe.put("x");  // stays readable: the handler does not read it
      int calls = 0;
      auto reg = registered(loop.watch_fd(pipe.r, EPOLLIN, [&](std::uint32_t) {
        ++calls;
        loop.stop();
      }));
      CHECK(loop.run());
      CHECK(calls == 1);
      CHECK(reg.active());  // handlers stay registered
      CHECK(loop.run());    // runs again, stopped again by the handler
      CHECK(calls == 2);
    }
    SECTION("run, run_for and run_once from a handler are inval; the loop goes on") {
      std::vector<Error> errors;
      pipe.put("x");
      auto reg = registered(loop.watch_fd(pipe.r, EPOLLIN, [&](std::uint32_t) {
        auto a = loop.run();
        auto b = loop.run_for(10ms);
        auto c = loop.run_once(0ms);
        if (!a) errors.push_back(a.error());
        if (!b) errors.push_back(b.error());
        if (!c) errors.push_back(c.error());
        pipe.take();
      }));
      CHECK(ran(loop.run_once(0ms)) == 1);
      REQUIRE(errors.size() == 3);
      check_inval(errors[0], "EventLoop::run", "called from a handler");
      check_inval(errors[1], "EventLoop::run_for", "called from a handler");
      check_inval(errors[2], "EventLoop::run_once", "called from a handler");
      pipe.put("y");
      CHECK(ran(loop.run_once(0ms)) == 1);  // and outside a handler they work
      CHECK(errors.size() == 6);
    }
  }
  fake.expect_clean();
}

// ---- re-entrancy

TEST_CASE("a handler resets its own registration: not called again, freed after the call",
          "[event_loop][reentrancy]") {
  fake::FakeProvider fake;
  {
    Pipe pipe;
    EventLoop loop = make_loop();
    pipe.put("x");  // stays readable
    int calls = 0;
    std::string state = "captured state stays alive during the call";
    Registration self;
    self = registered(loop.watch_fd(pipe.r, EPOLLIN, [&, state](std::uint32_t) {
      ++calls;
      self.reset();
      // The handler object (and this capture) must live until the call returns.
      CHECK(state == "captured state stays alive during the call");
      CHECK_FALSE(self.active());
    }));
    CHECK(ran(loop.run_once(0ms)) == 1);
    CHECK(calls == 1);
    CHECK(watched_sources(fake, loop) == 0);
    CHECK(ran(loop.run_once(0ms)) == 0);
    CHECK(calls == 1);
  }
  fake.expect_clean();
}

TEST_CASE("a handler unregisters another source whose event is in the same batch: it is not "
          "called, not even through a reused slot",
          "[event_loop][reentrancy]") {
  fake::FakeProvider fake;
  {
    Pipe one, two, three;
    EventLoop loop = make_loop();
    one.put("1");
    two.put("2");
    three.put("3");
    std::vector<std::string> calls;
    Registration first, second, third;
    // Whichever of the two runs first unregisters the other and registers a third
    // handler, which takes the freed slot (a new generation).
    auto make = [&](std::string name, Registration& other) {
      return [&, name](std::uint32_t) {
        calls.push_back(name);
        if (other.active()) {
          other.reset();
          third = registered(loop.watch_fd(three.r, EPOLLIN, [&](std::uint32_t) {
            calls.push_back("three");
            three.take();
          }));
        }
      };
    };
    first = registered(loop.watch_fd(one.r, EPOLLIN, make("one", second)));
    second = registered(loop.watch_fd(two.r, EPOLLIN, make("two", first)));
    CHECK(ran(loop.run_once(1000ms)) == 1);  // both were ready: one batch
    REQUIRE(calls.size() == 1);
    CHECK(first.active() != second.active());
    CHECK(third.active());
    // The new handler runs for its own fd, in the next round.
    CHECK(ran(loop.run_once(1000ms)) >= 1);
    CHECK(std::count(calls.begin(), calls.end(), "three") == 1);
    CHECK(std::count(calls.begin(), calls.end(), calls.front()) >= 2);  // the survivor again
    CHECK(std::count(calls.begin(), calls.end(), calls.front() == "one" ? "two" : "one") == 0);
  }
  fake.expect_clean();
}

TEST_CASE("a handler registers another handler: it runs from the next round",
          "[event_loop][reentrancy]") {
  fake::FakeProvider fake;
  {
    Pipe a, b;
    EventLoop loop = make_loop();
    b.put("b");
    std::vector<std::string> calls;
    Registration later;
    auto reg = registered(loop.watch_fd(a.r, EPOLLIN, [&](std::uint32_t) {
      calls.push_back("a:" + a.take());
      if (!later)
        later = registered(loop.watch_fd(b.r, EPOLLIN, [&](std::uint32_t) { calls.push_back("b:" + b.take()); }));
    }));
    a.put("1");
    CHECK(ran(loop.run_once(0ms)) == 1);
    CHECK(calls == std::vector<std::string>{"a:1"});
    CHECK(ran(loop.run_once(0ms)) == 1);
    CHECK(calls == std::vector<std::string>{"a:1", "b:b"});
    a.put("2");
    CHECK(ran(loop.run_once(0ms)) == 1);
    CHECK(calls.back() == "a:2");
    CHECK(calls.size() == 3);  // registered once only
  }
  fake.expect_clean();
}

// ---- exceptions

TEST_CASE("an exception escaping a handler: run returns unknown with what(), logged as an "
          "error, the loop runs on",
          "[event_loop][exceptions]") {
  fake::FakeProvider fake;
  {
    LogCapture log;
    Pipe pipe;
    EventLoop loop = make_loop();
    bool throw_std = true, throw_other = false;
    int calls = 0;
    auto reg = registered(loop.watch_fd(pipe.r, EPOLLIN, [&](std::uint32_t) {
      ++calls;
      pipe.take(1);
      if (throw_std) throw std::runtime_error("boom number 42");
      if (throw_other) throw 42;
    }));
    pipe.put("abcd");
    auto result = loop.run();
    REQUIRE_FALSE(result);
    INFO(result.error().message());
    CHECK(result.error().code() == errc::unknown);
    CHECK(result.error().call() == "EventLoop::run");
    CHECK_THAT(std::string(result.error().reason()), Catch::Contains("boom number 42"));
    CHECK(calls == 1);
    auto logged = log.find(LogLevel::error, "boom number 42");
    INFO(log.all());
    REQUIRE(logged.size() == 1);
    CHECK(logged[0].where == "EventLoop::run");
    CHECK(reg.active());

    // run_once reports it too; then a non-std exception.
    auto once = loop.run_once(0ms);
    REQUIRE_FALSE(once);
    CHECK(once.error().code() == errc::unknown);
    CHECK_THAT(once.error().message(), Catch::Contains("boom number 42"));
    throw_std = false;
    throw_other = true;
    auto other = loop.run_for(1000ms);
    REQUIRE_FALSE(other);
    CHECK(other.error().code() == errc::unknown);
    CHECK_THAT(once.error().message(), Catch::Contains("boom"));
    CHECK_THAT(other.error().message(), Catch::Contains("not a std::exception"));
    CHECK(log.find(LogLevel::error, "not a std::exception").size() == 1);
    CHECK(calls == 3);

    // Runs again afterwards: the last byte is handled, then nothing.
    throw_other = false;
    CHECK(ran(loop.run_once(0ms)) == 1);
    CHECK(calls == 4);
    CHECK(loop.run_for(20ms));
    CHECK(calls == 4);
    CHECK(log.find(LogLevel::error).size() == 3);
  }
  fake.expect_clean();
}

TEST_CASE("two handlers throw in one batch: both run and are logged, the first is returned",
          "[event_loop][exceptions]") {
  fake::FakeProvider fake;
  {
    LogCapture log;
    Pipe one, two;
    EventLoop loop = make_loop();
    std::vector<std::string> order;
    auto thrower = [&](const Pipe& p, std::string name) {
      return [&p, &order, name](std::uint32_t) {
        p.take();
        order.push_back(name);
        throw std::runtime_error("from " + name);
      };
    };
    auto a = registered(loop.watch_fd(one.r, EPOLLIN, thrower(one, "one")));
    auto b = registered(loop.watch_fd(two.r, EPOLLIN, thrower(two, "two")));
    one.put("x");
    two.put("y");
    auto once = loop.run_once(1000ms);
    REQUIRE_FALSE(once);
    REQUIRE(order.size() == 2);
    CHECK_THAT(once.error().message(), Catch::Contains("from " + order[0]));
    CHECK(log.find(LogLevel::error, "from one").size() == 1);
    CHECK(log.find(LogLevel::error, "from two").size() == 1);
    CHECK(ran(loop.run_once(0ms)) == 0);  // reported once, not again
  }
  fake.expect_clean();
}

// ---- stop and wake from other threads (ThreadSanitizer in CI)

TEST_CASE("stop() and wake() from another thread end a waiting run", "[event_loop][threads]") {
  fake::FakeProvider fake;
  {
    EventLoop loop = make_loop();
    SECTION("stop ends run()") {
      for (int round = 0; round < 50; ++round) {
        std::atomic<bool> started{false};
        std::thread stopper([&] {
          while (!started.load()) std::this_thread::yield();
          std::this_thread::sleep_for(1ms);
          loop.stop();
        });
        started = true;
        const auto start = std::chrono::steady_clock::now();
        auto result = loop.run();  // the fake's epoll_wait gives up (a recorded hang) after 2 s
        stopper.join();
        CHECK(result);
        CHECK(std::chrono::steady_clock::now() - start < 1500ms);
      }
    }
    SECTION("wake ends a waiting run_once, which ran nothing") {
      for (int round = 0; round < 50; ++round) {
        std::thread waker([&] {
          std::this_thread::sleep_for(1ms);
          loop.wake();
        });
        const auto start = std::chrono::steady_clock::now();
        auto n = loop.run_once(5000ms);
        waker.join();
        // The wake may land before run_once waits: it then returns at once.
        CHECK(ran(n) == 0);
        CHECK(std::chrono::steady_clock::now() - start < 1500ms);
      }
    }
    SECTION("many threads stop and wake while run_for runs") {
      std::atomic<bool> done{false};
      std::vector<std::thread> pool;
      for (int t = 0; t < 4; ++t)
        pool.emplace_back([&, t] {
          while (!done.load()) {
            if (t % 2 == 0) loop.wake();
            else loop.stop();
            std::this_thread::sleep_for(100us);
          }
        });
      for (int i = 0; i < 50; ++i) CHECK(loop.run_for(10ms));
      done = true;
      for (auto& th : pool) th.join();
    }
  }
  fake.expect_clean();
}

// ---- connection requests

TEST_CASE("serve: each connection request reaches the handler once, in order",
          "[event_loop][serve]") {
  fake::FakeProvider fake;
  {
    Peer peer = open_peer(fake);
    Endpoint ep = listen_on(peer, "169.254.77.1");
    EventLoop loop = make_loop();
    std::vector<std::string> seen;
    std::vector<Conn> accepted;
    std::vector<Error> errors;
    auto reg = registered(loop.serve(ep, [&](expected<ConnReq> req) {
      if (!req) {
        errors.push_back(req.error());
        return;
      }
      seen.push_back(text_of(*req));
      if (seen.size() % 3 == 0) {
        auto conn = std::move(*req).connect();
        CHECK(conn);
        if (conn) accepted.push_back(std::move(*conn));
      } else if (seen.size() % 3 == 1) {
        CHECK(std::move(*req).reject());
      }  // else left in the argument: rejected when the handler returns
    }));
    CHECK(ran(loop.run_once(0ms)) == 0);
    constexpr int count = 20;  // more than one round (16 per wake-up)
    std::vector<std::string> sent;
    for (int i = 0; i < count; ++i) {
      sent.push_back("request " + std::to_string(i));
      fake.inject_connect_request(*ep.fd(), {0, sent.back(), "169.254.77.2", static_cast<std::uint16_t>(40000 + i)});
    }
    CHECK(ran(loop.run_once(0ms)) == 1);
    CHECK(seen.size() == 16);  // one round, then the other sources get their turn
    CHECK(ran(loop.run_once(0ms)) == 1);
    CHECK(seen == sent);
    CHECK(ran(loop.run_once(0ms)) == 0);
    CHECK(seen.size() == count);
    CHECK(errors.empty());
    CHECK(accepted.size() == count / 3);
    CHECK(fake.accepts.size() == count / 3);
    CHECK(fake.rejects.size() == count - count / 3);
    CHECK(fake.alive("unacked_event") == 0);
  }
  CHECK(fake.closed_while_watched() == 0);
  fake.expect_clean();
}

TEST_CASE("serve: bad arguments are inval", "[event_loop][serve][inval]") {
  fake::FakeProvider fake;
  {
    Peer peer = open_peer(fake);
    Endpoint ep = listen_on(peer, "169.254.77.1");
    EventLoop loop = make_loop();
    auto none = loop.serve(ep);
    REQUIRE_FALSE(none);
    check_inval(none.error(), "EventLoop::serve", "no handler");
    ConnConfig bad;
    bad.cq_size = 0;
    auto bad_config = loop.serve(ep, [](expected<ConnReq>) {}, bad);
    REQUIRE_FALSE(bad_config);
    CHECK(bad_config.error().code() == errc::inval);
    Endpoint moved = std::move(ep);
    auto empty = loop.serve(ep, [](expected<ConnReq>) {});
    REQUIRE_FALSE(empty);
    check_inval(empty.error(), "EventLoop::serve", "endpoint is empty");
    CHECK(watched_sources(fake, loop) == 0);
  }
  fake.expect_clean();
}

TEST_CASE("serve: the Endpoint moved while served is still served; destroyed, it leaves the "
          "loop first",
          "[event_loop][serve][lifetime]") {
  fake::FakeProvider fake;
  {
    Peer peer = open_peer(fake);
    std::optional<Endpoint> ep(listen_on(peer, "169.254.77.1"));
    EventLoop loop = make_loop();
    std::vector<std::string> seen;
    auto reg = registered(loop.serve(*ep, [&](expected<ConnReq> req) {
      CHECK(req);
      if (req) seen.push_back(text_of(*req));
    }));
    std::optional<Endpoint> moved(std::move(*ep));
    CHECK(reg.active());
    fake.inject_connect_request(*moved->fd(), {0, "after the move"});
    CHECK(ran(loop.run_once(0ms)) == 1);
    CHECK(seen == std::vector<std::string>{"after the move"});
    ep.reset();  // the moved-from handle: nothing to tell
    CHECK(reg.active());

    // Move-assigned over: the old listener is released, its watchers told.
    std::optional<Endpoint> other(listen_on(peer, "169.254.77.1", "7472"));
    int other_calls = 0;
    auto other_reg = registered(loop.serve(*other, [&](expected<ConnReq>) { ++other_calls; }));
    *other = std::move(*moved);
    CHECK_FALSE(other_reg.active());
    CHECK(reg.active());
    fake.inject_connect_request(*other->fd(), {0, "to the assigned"});
    CHECK(ran(loop.run_once(0ms)) == 1);
    CHECK(seen.back() == "to the assigned");
    CHECK(other_calls == 0);
    CHECK(watched_sources(fake, loop) == 1);

    other.reset();  // destroyed while served: its fd leaves the set while still open
    CHECK_FALSE(reg.active());
    CHECK(watched_sources(fake, loop) == 0);
    CHECK(fake.closed_while_watched() == 0);
    CHECK(ran(loop.run_once(0ms)) == 0);
    reg.reset();
    other_reg.reset();
  }
  CHECK(fake.closed_while_watched() == 0);
  fake.expect_clean();
}

TEST_CASE("listen_shared with a handler: the same handler shares, another or none is inval",
          "[event_loop][serve][listen_shared]") {
  fake::FakeProvider fake;
  {
    Peer peer = open_peer(fake);
    std::vector<std::string> seen;
    auto handler = std::make_shared<ConnReqHandler>([&](expected<ConnReq> req) {
      CHECK(req);
      if (req) seen.push_back(text_of(*req));
    });
    auto a = Endpoint::listen_shared(peer, "169.254.77.1", "7471", handler);
    REQUIRE(a);
    auto b = Endpoint::listen_shared(peer, "169.254.77.1", "7471", handler);
    REQUIRE(b);
    CHECK(*a->share_count() == 2);
    CHECK(*a->fd() == *b->fd());
    CHECK(*b->handler() == handler);
    const auto mark = fake.mark();
    auto another = Endpoint::listen_shared(peer, "169.254.77.1", "7471",
                                           std::make_shared<ConnReqHandler>([](expected<ConnReq>) {}));
    REQUIRE_FALSE(another);
    check_inval(another.error(), "Endpoint::listen_shared",
                "sharing a listener between different handlers is not supported");
    auto none = Endpoint::listen_shared(peer, "169.254.77.1", "7471");
    REQUIRE_FALSE(none);
    check_inval(none.error(), "Endpoint::listen_shared",
                "sharing a listener between different handlers is not supported");
    auto empty = Endpoint::listen_shared(peer, "169.254.77.1", "7471", std::shared_ptr<ConnReqHandler>());
    REQUIRE_FALSE(empty);
    check_inval(empty.error(), "Endpoint::listen_shared", "handler is empty");
    CHECK(fake.calls_since(mark).empty());
    CHECK(*a->share_count() == 2);
    // And the other way round: a listener without a handler refuses one.
    auto plain = Endpoint::listen_shared(peer, "169.254.77.1", "7472");
    REQUIRE(plain);
    CHECK(*plain->handler() == nullptr);
    auto with = Endpoint::listen_shared(peer, "169.254.77.1", "7472", handler);
    REQUIRE_FALSE(with);
    check_inval(with.error(), "Endpoint::listen_shared",
                "sharing a listener between different handlers is not supported");

    EventLoop loop = make_loop();
    auto own = loop.serve(*a, [](expected<ConnReq>) {});
    REQUIRE_FALSE(own);
    check_inval(own.error(), "EventLoop::serve", "has its own handler");
    auto same = loop.serve(*a, *handler);  // a copy of the same function is another handler
    REQUIRE_FALSE(same);
    auto reg = registered(loop.serve(*a));  // the listener's own
    fake.inject_connect_request(*b->fd(), {0, "to the shared handler"});
    CHECK(ran(loop.run_once(0ms)) == 1);
    CHECK(seen == std::vector<std::string>{"to the shared handler"});
    CHECK(watched_sources(fake, loop) == 1);
  }
  fake.expect_clean();
}

TEST_CASE("listen_shared with a handler: two loops in two threads serve two handles, each "
          "request reaches the handler once",
          "[event_loop][serve][listen_shared][threads]") {
  fake::FakeProvider fake;
  {
    Peer peer = open_peer(fake);
    std::mutex mutex;
    std::vector<std::string> seen;
    std::vector<std::string> problems;
    std::atomic<int> handled{0};
    auto handler = std::make_shared<ConnReqHandler>([&](expected<ConnReq> req) {
      std::lock_guard lock(mutex);
      if (!req) problems.push_back(req.error().message());
      else seen.push_back(text_of(*req));
      ++handled;
    });  // requests left in the argument are rejected
    auto a = Endpoint::listen_shared(peer, "169.254.77.1", "7471", handler);
    auto b = Endpoint::listen_shared(peer, "169.254.77.1", "7471", handler);
    REQUIRE(a);
    REQUIRE(b);
    const int fd = *a->fd();
    constexpr int count = 300;
    std::atomic<bool> done{false};
    std::atomic<int> ready{0};
    auto serve_in_thread = [&](Endpoint& handle) {
      auto loop = EventLoop::create();
      if (!loop) {
        std::lock_guard lock(mutex);
        problems.push_back(loop.error().message());
        ++ready;
        return;
      }
      auto reg = loop->serve(handle);
      if (!reg) {
        std::lock_guard lock(mutex);
        problems.push_back(reg.error().message());
      }
      ++ready;
      while (!done.load())
        if (auto ran = loop->run_for(5ms); !ran) {
          std::lock_guard lock(mutex);
          problems.push_back(ran.error().message());
        }
    };
    std::thread one(serve_in_thread, std::ref(*a)), two(serve_in_thread, std::ref(*b));
    while (ready.load() < 2) std::this_thread::yield();
    std::vector<std::string> sent;
    for (int i = 0; i < count; ++i) {
      sent.push_back("r" + std::to_string(i));
      fake.inject_connect_request(fd, {0, sent.back(), "169.254.77.2", static_cast<std::uint16_t>(40000 + i)});
      if (i % 10 == 0) std::this_thread::sleep_for(1ms);  // let both loops wake for some
    }
    const auto deadline = std::chrono::steady_clock::now() + 10s;
    while (handled.load() < count && std::chrono::steady_clock::now() < deadline)
      std::this_thread::sleep_for(1ms);
    std::this_thread::sleep_for(20ms);  // a duplicate would show up now
    done = true;
    one.join();
    two.join();
    INFO((problems.empty() ? std::string() : problems.front()));
    CHECK(problems.empty());
    CHECK(handled.load() == count);
    std::sort(seen.begin(), seen.end());
    std::sort(sent.begin(), sent.end());
    CHECK(seen == sent);  // each exactly once
    CHECK(fake.rejects.size() == static_cast<std::size_t>(count));
    CHECK(fake.queued(fd) == 0);
  }
  CHECK(fake.closed_while_watched() == 0);
  fake.expect_clean();
}

// ---- connections

TEST_CASE("watch: a connection's events in order, closed reported once",
          "[event_loop][watch]") {
  fake::FakeProvider fake;
  {
    Peer peer = open_peer(fake);
    Conn conn = connect_out(peer);
    EventLoop loop = make_loop();
    std::vector<ConnEvent> events;
    std::vector<Error> errors;
    auto reg = registered(loop.watch(conn, [&](expected<ConnEvent> ev) {
      if (ev) events.push_back(*ev);
      else errors.push_back(ev.error());
    }));
    CHECK(ran(loop.run_once(0ms)) == 0);
    fake.inject_event(*conn.fd(), RDMA_CM_EVENT_ESTABLISHED, "accepted");
    fake.inject_event(*conn.fd(), RDMA_CM_EVENT_DISCONNECTED);
    fake.inject_event(*conn.fd(), RDMA_CM_EVENT_TIMEWAIT_EXIT);
    CHECK(ran(loop.run_once(0ms)) == 1);
    CHECK(events == std::vector<ConnEvent>{ConnEvent::established, ConnEvent::closed});
    CHECK(errors.empty());
    CHECK(fake.alive("unacked_event") == 0);
    CHECK(fake.queued(*conn.fd()) == 0);
    CHECK(ran(loop.run_once(0ms)) == 0);
    CHECK(events.size() == 2);
    CHECK(as_text(*conn.private_data()).substr(0, 8) == "accepted");
    // An unexpected event is passed on as an error; the loop goes on.
    fake.inject_event(*conn.fd(), RDMA_CM_EVENT_MULTICAST_JOIN);
    CHECK(ran(loop.run_once(0ms)) == 1);
    REQUIRE(errors.size() == 1);
    CHECK(errors[0].code() == errc::unknown);
    CHECK_THAT(errors[0].message(), Catch::Contains("MULTICAST_JOIN"));

    auto twice = loop.watch(conn, [](expected<ConnEvent>) {});
    REQUIRE_FALSE(twice);
    CHECK(twice.error().sys_errno() == EEXIST);
    auto empty = loop.watch(conn, {});
    REQUIRE_FALSE(empty);
    check_inval(empty.error(), "EventLoop::watch", "handler is empty");
  }
  CHECK(fake.closed_while_watched() == 0);
  fake.expect_clean();
}

TEST_CASE("a handler closes or destroys its own Conn: no further call, its fds leave the set "
          "while open",
          "[event_loop][watch][reentrancy][lifetime]") {
  fake::FakeProvider fake;
  {
    Peer peer = open_peer(fake);
    std::optional<Conn> conn(connected(fake, peer));
    EventLoop loop = make_loop();
    const bool by_close = GENERATE(true, false);
    INFO((by_close ? "close()" : "destroyed"));
    int calls = 0, completion_calls = 0;
    // Registered first: its event comes first in the batch (the fake's ready list).
    auto reg = registered(loop.watch(*conn, [&](expected<ConnEvent> ev) {
      ++calls;
      CHECK(ev);
      if (by_close) CHECK(std::move(*conn).close());
      else conn.reset();
    }));
    auto completions = registered(loop.watch_completions(*conn, [&](auto) { ++completion_calls; }));
    CHECK(watched_sources(fake, loop) == 2);
    fake.inject_event(*conn->fd(), RDMA_CM_EVENT_DISCONNECTED);
    fake.add_completion(*conn->cq()->native(), completion(1));  // in the same batch
    CHECK(ran(loop.run_once(0ms)) == 1);
    CHECK(calls == 1);
    CHECK(completion_calls == 0);  // its source went first: never called
    CHECK_FALSE(reg.active());
    CHECK_FALSE(completions.active());
    CHECK(watched_sources(fake, loop) == 0);
    CHECK(fake.closed_while_watched() == 0);
    CHECK(ran(loop.run_once(0ms)) == 0);
  }
  fake.expect_clean();
}

TEST_CASE("the loop outlives the Conn; the Conn outlives the loop", "[event_loop][lifetime]") {
  fake::FakeProvider fake;
  {
    LogCapture log;
    Peer peer = open_peer(fake);
    SECTION("Conn destroyed while watched") {
      EventLoop loop = make_loop();
      std::optional<Conn> conn(connected(fake, peer));
      auto events = registered(loop.watch(*conn, [](expected<ConnEvent>) {}));
      auto completions = registered(loop.watch_completions(*conn, [](auto) {}));
      CHECK(watched_sources(fake, loop) == 2);
      conn.reset();
      CHECK_FALSE(events.active());
      CHECK_FALSE(completions.active());
      CHECK(watched_sources(fake, loop) == 0);
      CHECK(ran(loop.run_once(0ms)) == 0);
    }
    SECTION("loop destroyed while watching") {
      Conn conn = connected(fake, peer);
      std::optional<EventLoop> loop(make_loop());
      auto events = registered(loop->watch(conn, [](expected<ConnEvent>) {}));
      auto completions = registered(loop->watch_completions(conn, [](auto) {}));
      loop.reset();
      CHECK_FALSE(events.active());
      CHECK_FALSE(completions.active());
      CHECK(fake.alive("epoll") == 0);
      // The Conn works on, and can be watched by another loop.
      EventLoop next = make_loop();
      int calls = 0;
      auto again = registered(next.watch(conn, [&](expected<ConnEvent>) { ++calls; }));
      fake.inject_event(*conn.fd(), RDMA_CM_EVENT_DISCONNECTED);
      CHECK(ran(next.run_once(0ms)) == 1);
      CHECK(calls == 1);
    }
    CHECK(fake.closed_while_watched() == 0);
    INFO(log.all());
    CHECK(log.find(LogLevel::warning).empty());
  }
  fake.expect_clean();
}

// ---- outgoing requests

TEST_CASE("resolve: the handler is called once, when resolution is over", "[event_loop][resolve]") {
  fake::FakeProvider fake;
  {
    LogCapture log;
    Peer peer = open_peer(fake);
    EventLoop loop = make_loop();
    int calls = 0;
    std::optional<ConnReq> got;
    std::vector<Error> errors;
    auto handler = [&](expected<ConnReq> req) {
      ++calls;
      if (req) got.emplace(std::move(*req));
      else errors.push_back(req.error());
    };

    SECTION("through ADDR_RESOLVED and ROUTE_RESOLVED, one step at a time") {
      fake.auto_resolve = false;
      auto pending = ConnReq::start(peer, "169.254.77.9", "7471");
      REQUIRE(pending);
      auto reg = registered(loop.resolve(std::move(*pending), handler));
      CHECK_FALSE(*pending);  // taken over
      CHECK(ran(loop.run_once(0ms)) == 0);
      fake.deliver_held();  // ADDR_RESOLVED
      CHECK(ran(loop.run_once(0ms)) == 1);
      CHECK(calls == 0);
      CHECK(reg.active());
      fake.deliver_held();  // ROUTE_RESOLVED
      CHECK(ran(loop.run_once(0ms)) == 1);
      CHECK(calls == 1);
      CHECK_FALSE(reg.active());  // over after the call
      REQUIRE(got);
      CHECK(watched_sources(fake, loop) == 0);
      CHECK(ran(loop.run_once(0ms)) == 0);
      CHECK(calls == 1);
      // The request is whole: it connects.
      auto conn = std::move(*got).connect();
      CHECK(conn);
    }
    SECTION("ADDR_ERROR: the error, once; the request's channel left the set before it was destroyed") {
      fake.addr_event = RDMA_CM_EVENT_ADDR_ERROR;
      fake.addr_status = -EHOSTUNREACH;
      auto pending = ConnReq::start(peer, "169.254.77.9", "7471");
      REQUIRE(pending);
      auto reg = registered(loop.resolve(std::move(*pending), handler));
      CHECK(ran(loop.run_once(0ms)) == 1);
      CHECK(calls == 1);
      REQUIRE(errors.size() == 1);
      CHECK(errors[0].code() == errc::provider);
      CHECK(errors[0].call() == "rdma_resolve_addr");
      CHECK(errors[0].sys_errno() == EHOSTUNREACH);
      CHECK_FALSE(reg.active());
      CHECK(watched_sources(fake, loop) == 0);
      CHECK(fake.closed_while_watched() == 0);
      CHECK(fake.alive("cm_id") == 0);
      CHECK(ran(loop.run_once(0ms)) == 0);
    }
    SECTION("abandoned: the registration released before resolution ends releases the request") {
      fake.auto_resolve = false;
      auto pending = ConnReq::start(peer, "169.254.77.9", "7471");
      REQUIRE(pending);
      auto reg = registered(loop.resolve(std::move(*pending), handler));
      fake.deliver_held();
      reg.reset();
      CHECK(fake.alive("cm_id") == 0);
      CHECK(watched_sources(fake, loop) == 0);
      CHECK(ran(loop.run_once(0ms)) == 0);
      CHECK(calls == 0);
    }
    SECTION("the handler resets its own registration") {
      Registration reg;
      auto pending = ConnReq::start(peer, "169.254.77.9", "7471");
      REQUIRE(pending);
      reg = registered(loop.resolve(std::move(*pending), [&](expected<ConnReq> req) {
        reg.reset();
        handler(std::move(req));
      }));
      CHECK(ran(loop.run_once(0ms)) == 1);
      CHECK(calls == 1);
      CHECK(got);
    }
    SECTION("inval") {
      auto pending = ConnReq::start(peer, "169.254.77.9", "7471");
      REQUIRE(pending);
      auto no_handler = loop.resolve(std::move(*pending), std::function<void(expected<ConnReq>)>());
      REQUIRE_FALSE(no_handler);
      check_inval(no_handler.error(), "EventLoop::resolve", "handler is empty");
      CHECK(*pending);  // not taken
      PendingConnReq taken = std::move(*pending);
      auto empty = loop.resolve(std::move(*pending), handler);
      REQUIRE_FALSE(empty);
      check_inval(empty.error(), "EventLoop::resolve", "request is empty");
    }
    CHECK(fake.closed_while_watched() == 0);
    INFO(log.all());
    CHECK(log.find(LogLevel::warning).empty());
  }
  fake.expect_clean();
}

// ---- completions

TEST_CASE("watch_completions: batches of at most 16, in order, each completion once",
          "[event_loop][completions]") {
  fake::FakeProvider fake;
  {
    Peer peer = open_peer(fake);
    ConnConfig cfg;
    cfg.cq_size = 64;
    Conn conn = connected(fake, peer, cfg);
    ibv_cq* cq = *conn.cq()->native();
    EventLoop loop = make_loop();
    std::vector<std::size_t> batches;
    std::vector<std::uint64_t> ids;
    std::vector<Error> errors;
    auto reg = registered(loop.watch_completions(conn, [&](expected<std::span<const ibv_wc>> batch) {
      if (!batch) {
        errors.push_back(batch.error());
        return;
      }
      batches.push_back(batch->size());
      for (const auto& wc : *batch) ids.push_back(wc.wr_id);
    }));
    CHECK(nonblocking_fd(*conn.cq()->fd()));
    CHECK(ran(loop.run_once(0ms)) == 0);
    for (std::uint64_t i = 0; i < 40; ++i) fake.add_completion(cq, completion(i));
    CHECK(ran(loop.run_once(0ms)) == 1);
    CHECK(batches == std::vector<std::size_t>{16, 16, 8});
    std::vector<std::uint64_t> expected_ids(40);
    for (std::uint64_t i = 0; i < 40; ++i) expected_ids[i] = i;
    CHECK(ids == expected_ids);
    CHECK(fake.armed(cq));  // re-armed
    CHECK(fake.alive("unacked_cq_event") == 0);
    CHECK(ran(loop.run_once(0ms)) == 0);

    // Work requests completed by the "device".
    Buffer buf(64);
    MrLocal mr = test::reg(peer, buf, all_usages);
    ids.clear();
    batches.clear();
    for (std::uint64_t id : {101, 102, 103}) REQUIRE(conn.send(mr, 0, 8, Completion::always, id));
    CHECK(fake.complete_sends(*conn.qp()) == 3);
    CHECK(ran(loop.run_once(0ms)) == 1);
    CHECK(ids == std::vector<std::uint64_t>{101, 102, 103});
    CHECK(batches == std::vector<std::size_t>{3});
    CHECK(errors.empty());
  }
  CHECK(fake.closed_while_watched() == 0);
  fake.expect_clean();
}

TEST_CASE("watch_completions: the shared completion channel and CqKind::receive",
          "[event_loop][completions]") {
  fake::FakeProvider fake;
  {
    Peer peer = open_peer(fake);
    Buffer buf(64);
    MrLocal mr = reg(peer, buf, all_usages);
    EventLoop loop = make_loop();
    std::vector<std::uint64_t> main_ids, receive_ids;
    auto collect = [](std::vector<std::uint64_t>& into) {
      return [&into](expected<std::span<const ibv_wc>> batch) {
        CHECK(batch);
        if (batch)
          for (const auto& wc : *batch) into.push_back(wc.wr_id);
      };
    };
    SECTION("shared channel: both queues' completions through CqKind::main") {
      ConnConfig cfg;
      cfg.rcq_size = 5;
      cfg.shared_completion_channel = true;
      Conn conn = connected(fake, peer, cfg);
      auto no_own = loop.watch_completions(conn, collect(receive_ids), CqKind::receive);
      REQUIRE_FALSE(no_own);
      check_inval(no_own.error(), "EventLoop::watch_completions", "no receive completion channel");
      auto r = registered(loop.watch_completions(conn, collect(main_ids)));
      REQUIRE(conn.recv(mr, 0, 64, 1));
      REQUIRE(conn.send(mr, 0, 8, Completion::always, 2));
      REQUIRE(fake.deliver_recv(*conn.qp(), as_bytes("abc")));
      CHECK(fake.complete_sends(*conn.qp()) == 1);
      for (int i = 0; i < 4 && main_ids.size() < 2; ++i) (void)loop.run_once(0ms);
      std::sort(main_ids.begin(), main_ids.end());
      CHECK(main_ids == std::vector<std::uint64_t>{1, 2});
      CHECK(ran(loop.run_once(0ms)) == 0);
      CHECK(main_ids.size() == 2);
    }
    SECTION("own receive channel: CqKind::receive sees the receives only") {
      ConnConfig cfg;
      cfg.rcq_size = 5;
      Conn conn = connected(fake, peer, cfg);
      auto m = registered(loop.watch_completions(conn, collect(main_ids)));
      auto r = registered(loop.watch_completions(conn, collect(receive_ids), CqKind::receive));
      CHECK(watched_sources(fake, loop) == 2);
      REQUIRE(conn.recv(mr, 0, 64, 1));
      REQUIRE(fake.deliver_recv(*conn.qp(), as_bytes("abc")));
      CHECK(ran(loop.run_once(0ms)) == 1);
      CHECK(receive_ids == std::vector<std::uint64_t>{1});
      CHECK(main_ids.empty());
      REQUIRE(conn.send(mr, 0, 8, Completion::always, 2));
      CHECK(fake.complete_sends(*conn.qp()) == 1);
      CHECK(ran(loop.run_once(0ms)) == 1);
      CHECK(main_ids == std::vector<std::uint64_t>{2});
      CHECK(receive_ids.size() == 1);
    }
    SECTION("no receive CQ: CqKind::receive is inval") {
      Conn conn = connected(fake, peer);
      auto none = loop.watch_completions(conn, collect(receive_ids), CqKind::receive);
      REQUIRE_FALSE(none);
      check_inval(none.error(), "EventLoop::watch_completions", "no receive completion channel");
      auto empty = loop.watch_completions(conn, {});
      REQUIRE_FALSE(empty);
      check_inval(empty.error(), "EventLoop::watch_completions", "handler is empty");
      CHECK(watched_sources(fake, loop) == 0);
    }
  }
  CHECK(fake.closed_while_watched() == 0);
  fake.expect_clean();
}

// ---- provider failures

TEST_CASE("EventLoop::create: each provider call fails in turn", "[event_loop][fail-each]") {
  fail_each_call({"epoll_create1", "eventfd", "epoll_ctl"}, kErr, [](fake::FakeProvider&, Probe& probe) {
    probe.begin();
    auto loop = EventLoop::create();
    probe.end();
    probe.check_outcome(loop);
  });
}

TEST_CASE("registrations: epoll_ctl failing leaves nothing registered and the request with "
          "the caller",
          "[event_loop][fail]") {
  fake::FakeProvider fake;
  {
    Peer peer = open_peer(fake);
    Pipe pipe;
    Endpoint ep = listen_on(peer, "169.254.77.1");
    Conn conn = connected(fake, peer);
    EventLoop loop = make_loop();
    auto handler_fd = [](std::uint32_t) { FAIL("called"); };
    auto fails = [&](auto result) {
      REQUIRE_FALSE(result);
      check_injected(result.error(), "epoll_ctl", kErr);
      CHECK(watched_sources(fake, loop) == 0);
    };
    fake.fail("epoll_ctl", kErr);
    fails(loop.watch_fd(pipe.r, EPOLLIN, handler_fd));
    fake.fail("epoll_ctl", kErr);
    fails(loop.serve(ep, [](expected<ConnReq>) { FAIL("called"); }));
    fake.fail("epoll_ctl", kErr);
    fails(loop.watch(conn, [](expected<ConnEvent>) { FAIL("called"); }));
    fake.fail("epoll_ctl", kErr);
    fails(loop.watch_completions(conn, [](auto) { FAIL("called"); }));

    auto pending = ConnReq::start(peer, "169.254.77.9", "7471");
    REQUIRE(pending);
    const int fd = *pending->fd();
    fake.fail("epoll_ctl", kErr);
    fails(loop.resolve(std::move(*pending), [](expected<ConnReq>) { FAIL("called"); }));
    REQUIRE(*pending);  // given back, whole
    CHECK(*pending->fd() == fd);
    auto req = std::move(*pending).wait_for(1000ms);
    CHECK(req);

    // Nothing was linked to the sources: they go without telling anyone.
    pipe.put("x");
    fake.inject_connect_request(*ep.fd(), {});
    fake.inject_event(*conn.fd(), RDMA_CM_EVENT_DISCONNECTED);
    CHECK(ran(loop.run_once(0ms)) == 0);
    // The slot given back is used by the next registration.
    int calls = 0;
    auto ok = registered(loop.watch_fd(pipe.r, EPOLLIN, [&](std::uint32_t) { ++calls; }));
    CHECK(ran(loop.run_once(0ms)) == 1);
    CHECK(calls == 1);
  }
  CHECK(fake.closed_while_watched() == 0);
  fake.expect_clean();
}

TEST_CASE("watch_completions: each provider call of the registration fails in turn",
          "[event_loop][completions][fail-each]") {
  fail_each_call({"fcntl", "fcntl", "epoll_ctl"}, kErr, [](fake::FakeProvider& fake, Probe& probe) {
    Peer peer = open_peer(fake);
    Conn conn = connected(fake, peer);
    EventLoop loop = make_loop();
    int calls = 0;
    probe.begin();
    auto reg = loop.watch_completions(conn, [&](auto) { ++calls; });
    probe.end();
    if (probe.check_outcome(reg)) {
      CHECK(watched_sources(fake, loop) == 0);
      if (probe.injected()->call == "fcntl") {
        CHECK_THAT(reg.error().message(), Catch::Contains("on a completion channel"));
        CHECK_FALSE(nonblocking_fd(*conn.cq()->fd()));  // F_GETFL or F_SETFL failed
      }
      return;
    }
    fake.add_completion(*conn.cq()->native(), completion(7));
    CHECK(ran(loop.run_once(0ms)) == 1);
    CHECK(calls == 1);
  });
}

TEST_CASE("run: epoll_wait failing is returned; EINTR is retried", "[event_loop][fail]") {
  fake::FakeProvider fake;
  {
    Pipe pipe;
    EventLoop loop = make_loop();
    int calls = 0;
    auto reg = registered(loop.watch_fd(pipe.r, EPOLLIN, [&](std::uint32_t) {
      ++calls;
      pipe.take();
    }));
    fake.fail("epoll_wait", kErr);
    auto once = loop.run_once(0ms);
    REQUIRE_FALSE(once);
    check_injected(once.error(), "epoll_wait", kErr);
    fake.fail("epoll_wait", kErr);
    auto run = loop.run();
    REQUIRE_FALSE(run);
    check_injected(run.error(), "epoll_wait", kErr);
    fake.fail("epoll_wait", kErr);
    auto run_for = loop.run_for(1000ms);
    REQUIRE_FALSE(run_for);
    check_injected(run_for.error(), "epoll_wait", kErr);

    pipe.put("x");
    fake.fail("epoll_wait", EINTR);
    const auto mark = fake.mark();
    CHECK(ran(loop.run_once(1000ms)) == 1);
    CHECK(calls == 1);
    const auto log = fake.calls_since(mark);
    CHECK(std::count(log.begin(), log.end(), "epoll_wait") == 2);
    // Twice in a row, and in run_for.
    pipe.put("y");
    fake.fail("epoll_wait", EINTR);
    fake.fail("epoll_wait", EINTR);
    const auto start = std::chrono::steady_clock::now();
    CHECK(loop.run_for(100ms));
    CHECK(std::chrono::steady_clock::now() - start >= 100ms);
    CHECK(calls == 2);
    CHECK(fake.pending_faults() == 0);
  }
  fake.expect_clean();
}

TEST_CASE("the loop's eventfd: read and write failing are logged; a full counter is not an error",
          "[event_loop][fail]") {
  fake::FakeProvider fake;
  {
    LogCapture log;
    EventLoop loop = make_loop();
    const int wakefd = loop.core()->wakefd;
    fake.fail("write", kErr);
    loop.wake();
    auto logged = log.find(LogLevel::warning, "write");
    INFO(log.all());
    REQUIRE(logged.size() == 1);
    CHECK(logged[0].where == "EventLoop::wake");
    CHECK_THAT(logged[0].message, Catch::Contains("errno " + std::to_string(kErr)));
    CHECK(fake.eventfd_value(wakefd) == 0);
    fake.fail("write", EAGAIN);
    loop.wake();
    CHECK(log.records().size() == 1);  // EAGAIN: the loop is due to wake anyway

    loop.wake();
    CHECK(fake.eventfd_value(wakefd) == 1);
    fake.fail("read", kErr);
    CHECK(ran(loop.run_once(0ms)) == 0);
    auto read_failed = log.find(LogLevel::warning, "read");
    REQUIRE(read_failed.size() == 1);
    CHECK(read_failed[0].where == "EventLoop::run");
    CHECK_THAT(read_failed[0].message, Catch::Contains("errno " + std::to_string(kErr)));
    CHECK(fake.eventfd_value(wakefd) == 1);  // still to drain: the next round does
    CHECK(ran(loop.run_once(0ms)) == 0);
    CHECK(fake.eventfd_value(wakefd) == 0);
    CHECK(log.records().size() == 2);

    // stop() with the write failing: logged, and the stop is still seen by the next run.
    fake.fail("write", kErr);
    loop.stop();
    CHECK(log.records().size() == 3);
    const auto start = std::chrono::steady_clock::now();
    CHECK(loop.run());
    CHECK(std::chrono::steady_clock::now() - start < 1000ms);
  }
  fake.expect_clean();
}

TEST_CASE("unregistering and destroying the loop: epoll_ctl DEL and close failing are logged, "
          "nothing leaks",
          "[event_loop][fail]") {
  fake::FakeProvider fake;
  {
    LogCapture log;
    Pipe pipe;
    std::optional<EventLoop> loop(make_loop());
    int calls = 0;
    auto reg = registered(loop->watch_fd(pipe.r, EPOLLIN, [&](std::uint32_t) { ++calls; }));
    fake.fail("epoll_ctl", kErr);
    reg.reset();
    INFO(log.all());
    auto del = log.find(LogLevel::warning, "epoll_ctl");
    REQUIRE(del.size() == 1);
    CHECK_THAT(del[0].message, Catch::Contains("errno " + std::to_string(kErr)));
    CHECK_FALSE(reg.active());
    pipe.put("x");
    (void)loop->run_once(0ms);  // the fd may still be in the set: its handler is gone
    CHECK(calls == 0);

    fake.fail("close", kErr);  // the epoll fd's
    fake.fail("close", kErr);  // the eventfd's
    loop.reset();
    auto closes = log.find(LogLevel::warning, "close");
    CHECK(closes.size() == 2);
    for (auto& c : closes) CHECK(c.where == "~EventLoop");
    CHECK(fake.alive("epoll") == 0);
    CHECK(fake.alive("eventfd") == 0);
  }
  fake.expect_clean();
}

TEST_CASE("watch_completions: ibv_get_cq_event, ibv_req_notify_cq and ibv_poll_cq failing "
          "reach the handler; the loop goes on",
          "[event_loop][completions][fail]") {
  fake::FakeProvider fake;
  {
    Peer peer = open_peer(fake);
    Conn conn = connected(fake, peer);
    ibv_cq* cq = *conn.cq()->native();
    EventLoop loop = make_loop();
    std::vector<std::string> seen;  // "error <call> <errno>" or "batch <ids>"
    auto reg = registered(loop.watch_completions(conn, [&](expected<std::span<const ibv_wc>> batch) {
      if (!batch) {
        seen.push_back("error " + str(batch.error().call()) + " " + std::to_string(batch.error().sys_errno()));
        return;
      }
      std::string text = "batch";
      for (const auto& wc : *batch) text += " " + std::to_string(wc.wr_id);
      seen.push_back(text);
    }));
    const std::string err = std::to_string(kErr);

    // ibv_get_cq_event: reported, and the queue is polled all the same; the event, still
    // there, is taken in the next round.
    fake.add_completion(cq, completion(1));
    fake.fail("ibv_get_cq_event", kErr);
    CHECK(ran(loop.run_once(0ms)) == 1);
    CHECK(seen == std::vector<std::string>{"error ibv_get_cq_event " + err, "batch 1"});
    CHECK(ran(loop.run_once(0ms)) == 1);
    CHECK(seen.size() == 2);
    CHECK(fake.armed(cq));

    // ibv_poll_cq: the completion stays in the queue, the queue is armed, and the waiter is
    // due again: the next round brings it, without another completion (review 2.1).
    seen.clear();
    fake.add_completion(cq, completion(2));
    fake.fail("ibv_poll_cq", kErr);
    CHECK(ran(loop.run_once(0ms)) == 1);
    CHECK(seen == std::vector<std::string>{"error ibv_poll_cq 0"});  // its value, not an errno (review 2.7)
    CHECK(fake.armed(cq));
    CHECK(fake.cq_entries(cq) == 1);
    CHECK(ran(loop.run_once(0ms)) == 1);
    CHECK(seen.back() == "batch 2");

    // ibv_req_notify_cq: reported, and the completions are still delivered.
    seen.clear();
    fake.add_completion(cq, completion(4));
    fake.fail("ibv_req_notify_cq", kErr);
    CHECK(ran(loop.run_once(0ms)) == 1);
    CHECK(seen == std::vector<std::string>{"error ibv_req_notify_cq " + err, "batch 4"});
    CHECK(fake.alive("unacked_cq_event") == 0);
  }
  CHECK(fake.closed_while_watched() == 0);
  fake.expect_clean();
}

TEST_CASE("serve and watch: failures reading a source reach the handler, which is called "
          "again for what follows",
          "[event_loop][fail]") {
  fake::FakeProvider fake;
  {
    Peer peer = open_peer(fake);
    Endpoint ep = listen_on(peer, "169.254.77.1");
    Conn conn = connect_out(peer);
    EventLoop loop = make_loop();
    std::vector<std::string> seen;
    auto served = registered(loop.serve(ep, [&](expected<ConnReq> req) {
      if (req) seen.push_back("request " + text_of(*req));
      else seen.push_back("error " + str(req.error().call()) + " " + std::to_string(req.error().sys_errno()));
    }));
    auto watched = registered(loop.watch(conn, [&](expected<ConnEvent> ev) {
      if (ev) seen.push_back(std::string("event ") + std::string(to_string(*ev)));
      else seen.push_back("error " + str(ev.error().call()) + " " + std::to_string(ev.error().sys_errno()));
    }));
    const std::string err = std::to_string(kErr);

    fake.inject_connect_request(*ep.fd(), {0, "one"});
    fake.fail("rdma_get_cm_event", kErr);
    CHECK(ran(loop.run_once(0ms)) == 1);
    CHECK(seen == std::vector<std::string>{"error rdma_get_cm_event " + err, "request one"});

    // The request's queue pair cannot be made: it is rejected, the error passed on.
    seen.clear();
    fake.inject_connect_request(*ep.fd(), {0, "two"});
    fake.fail("rdma_create_qp", kErr);
    CHECK(ran(loop.run_once(0ms)) == 1);
    CHECK(seen == std::vector<std::string>{"error rdma_create_qp " + err});
    CHECK(fake.rejects.size() == 2);  // "one" (left in the argument) and "two"

    seen.clear();
    fake.inject_event(*conn.fd(), RDMA_CM_EVENT_ESTABLISHED);
    fake.fail("rdma_get_cm_event", kErr);
    CHECK(ran(loop.run_once(0ms)) == 1);
    CHECK(seen == std::vector<std::string>{"error rdma_get_cm_event " + err, "event established"});
    CHECK(fake.alive("unacked_event") == 0);
  }
  CHECK(fake.closed_while_watched() == 0);
  fake.expect_clean();
}

TEST_CASE("watch: a connection found lost by its completions is reported by the loop after that dispatch",
          "[event_loop][lost]") {
  fake::FakeProvider fake;
  {
    Peer peer = open_peer(fake);
    Conn conn = connected(fake, peer);
    ibv_cq* cq = *conn.cq()->native();
    EventLoop loop = make_loop();
    std::vector<ConnEvent> events;
    auto watched = registered(loop.watch(conn, [&](expected<ConnEvent> event) {
      REQUIRE(event);
      events.push_back(*event);
    }));
    ibv_wc failed{};
    failed.wr_id = 7;
    failed.status = IBV_WC_RETRY_EXC_ERR;
    SECTION("read by watch_completions") {
      std::vector<ibv_wc_status> statuses;
      auto completions = registered(loop.watch_completions(conn, [&](expected<std::span<const ibv_wc>> batch) {
        REQUIRE(batch);
        for (const auto& wc : *batch) statuses.push_back(wc.status);
        CHECK(events.empty());  // the event comes after the dispatch that found it
      }));
      fake.add_completion(cq, failed);
      CHECK(ran(loop.run_once(0ms)) == 2);
      CHECK(statuses == std::vector<ibv_wc_status>{IBV_WC_RETRY_EXC_ERR});
      CHECK(events == std::vector<ConnEvent>{ConnEvent::lost});
    }
    SECTION("read by Cq::get outside the loop") {
      fake.add_completion(cq, failed);
      ibv_wc wc[2];
      REQUIRE(conn.cq()->get(wc));
      CHECK(events.empty());
      CHECK(ran(loop.run_once(0ms)) == 1);
      CHECK(events == std::vector<ConnEvent>{ConnEvent::lost});
    }
    SECTION("the registration released before the loop ran: never called") {
      fake.add_completion(cq, failed);
      ibv_wc wc[2];
      REQUIRE(conn.cq()->get(wc));
      watched.reset();
      CHECK(ran(loop.run_once(0ms)) == 0);
      CHECK(events.empty());
      CHECK(conn.try_next_event() == ConnEvent::lost);  // still there for the next reader
    }
    CHECK(ran(loop.run_once(0ms)) == 0);
    fake.inject_event(*conn.fd(), RDMA_CM_EVENT_DISCONNECTED);
    REQUIRE(loop.run_once(0ms));
    if (watched.active()) CHECK(events == std::vector<ConnEvent>{ConnEvent::lost, ConnEvent::closed});
  }
  fake.expect_clean();
}

// ---- the second review's defects (review 2.N) and decisions (review 2.D)

namespace {

/// What a watch_completions handler saw; it throws after batch `throw_after` (0-based).
struct SeenCompletions {
  std::vector<std::uint64_t> ids;
  std::vector<std::size_t> batches;
  std::vector<Error> errors;
  int throw_after = -1;
  std::function<void(expected<std::span<const ibv_wc>>)> handler() {
    return [this](expected<std::span<const ibv_wc>> batch) {
      if (!batch) {
        errors.push_back(batch.error());
        return;
      }
      batches.push_back(batch->size());
      for (const auto& wc : *batch) ids.push_back(wc.wr_id);
      if (static_cast<int>(batches.size()) - 1 == throw_after) throw std::runtime_error("the handler gave up");
    };
  }
};

std::vector<std::uint64_t> ids_from(std::uint64_t first, std::uint64_t count) {
  std::vector<std::uint64_t> ids;
  for (std::uint64_t i = 0; i < count; ++i) ids.push_back(first + i);
  return ids;
}

}  // namespace

TEST_CASE("review 2.1: watch_completions polls the queue empty: what one round leaves, the next "
          "delivers without a new event",
          "[event_loop][completions][review]") {
  fake::FakeProvider fake;
  {
    Peer peer = open_peer(fake);
    ConnConfig cfg;
    cfg.cq_size = 512;
    Conn conn = connected(fake, peer, cfg);
    ibv_cq* cq = *conn.cq()->native();
    ibv_comp_channel* channel = cq->channel;
    EventLoop loop = make_loop();
    SeenCompletions seen;
    auto reg = registered(loop.watch_completions(conn, seen.handler()));

    SECTION("more than one round's 256 queued at once") {
      for (std::uint64_t i = 0; i < 300; ++i) fake.add_completion(cq, completion(i));
      const auto mark = fake.mark();
      CHECK(ran(loop.run_once(0ms)) == 1);
      // one read for the queue's one event: it raises no other until re-armed
      const auto calls = fake.calls_since(mark);
      CHECK(std::count(calls.begin(), calls.end(), "ibv_get_cq_event") == 1);
      CHECK(seen.ids.size() == 256);  // the round's budget: other sources get their turn
      CHECK(fake.cq_events_queued(channel) == 0);  // the queue raises no new event
      CHECK(ran(loop.run_once(0ms)) == 1);
      CHECK(seen.ids == ids_from(0, 300));
    }
    SECTION("the handler throws on the first of three batches") {
      seen.throw_after = 0;
      for (std::uint64_t i = 0; i < 40; ++i) fake.add_completion(cq, completion(i));
      auto first = loop.run_once(0ms);
      REQUIRE_FALSE(first);
      CHECK(first.error().code() == errc::unknown);
      CHECK_THAT(str(first.error().message()), Catch::Contains("the handler gave up"));
      CHECK(seen.ids.size() == 16);
      CHECK(ran(loop.run_once(0ms)) == 1);
      CHECK(seen.batches == std::vector<std::size_t>{16, 16, 8});
      CHECK(seen.ids == ids_from(0, 40));
    }
    SECTION("ibv_poll_cq fails") {
      fake.add_completion(cq, completion(7));
      fake.fail("ibv_poll_cq", kErr);
      CHECK(ran(loop.run_once(0ms)) == 1);
      REQUIRE(seen.errors.size() == 1);
      CHECK(seen.ids.empty());
      CHECK(ran(loop.run_once(0ms)) == 1);  // retried: the completion comes without another
      CHECK(seen.ids == std::vector<std::uint64_t>{7});
    }
    SECTION("ibv_req_notify_cq fails: retried in the next round, so the next completion comes") {
      fake.add_completion(cq, completion(1));
      fake.fail("ibv_req_notify_cq", kErr);
      CHECK(ran(loop.run_once(0ms)) == 1);
      REQUIRE(seen.errors.size() == 1);
      check_injected(seen.errors[0], "ibv_req_notify_cq", kErr);
      CHECK(seen.ids == std::vector<std::uint64_t>{1});
      CHECK_FALSE(fake.armed(cq));
      CHECK(ran(loop.run_once(0ms)) == 1);
      CHECK(fake.armed(cq));
      fake.add_completion(cq, completion(2));
      CHECK(ran(loop.run_once(0ms)) == 1);
      CHECK(seen.ids == std::vector<std::uint64_t>{1, 2});
      CHECK(seen.errors.size() == 1);
    }
    CHECK(ran(loop.run_once(0ms)) == 0);  // drained: nothing due
    CHECK(fake.armed(cq));
    CHECK(fake.alive("unacked_cq_event") == 0);
  }
  CHECK(fake.closed_while_watched() == 0);
  fake.expect_clean();
}

TEST_CASE("review 2.2: serve holds the Srq's queue: the handle destroyed or moved after the call, "
          "every later request still gets it",
          "[event_loop][serve][srq][review]") {
  fake::FakeProvider fake;
  {
    Peer peer = open_peer(fake);
    Endpoint ep = listen_on(peer, "169.254.77.1");
    EventLoop loop = make_loop();
    auto made = Srq::create(peer, SrqConfig{8, 0});
    REQUIRE(made);
    std::vector<Srq> queues;  // grows: its elements move
    queues.push_back(std::move(*made));
    ibv_srq* native = *queues[0].native();
    ConnConfig cfg;
    cfg.srq = &queues[0];
    std::vector<Conn> accepted;
    std::vector<Error> errors;
    auto reg = registered(loop.serve(ep, [&](expected<ConnReq> req) {
      if (!req) {
        errors.push_back(req.error());
        return;
      }
      auto conn = std::move(*req).connect();
      if (conn) accepted.push_back(std::move(*conn));
      else errors.push_back(conn.error());
    }, cfg));
    SECTION("destroyed") { queues.clear(); }
    SECTION("moved") {
      for (int i = 0; i < 8; ++i) {
        auto more = Srq::create(peer, SrqConfig{1, 0});
        REQUIRE(more);
        queues.push_back(std::move(*more));
      }
    }
    for (int i = 0; i < 2; ++i) fake.inject_connect_request(*ep.fd(), {});
    CHECK(ran(loop.run_once(0ms)) == 1);
    for (const auto& e : errors) INFO(e.message());
    CHECK(errors.empty());
    REQUIRE(accepted.size() == 2);
    for (const Conn& conn : accepted) CHECK((*conn.qp())->srq == native);
  }
  fake.expect_clean();
}

TEST_CASE("review 2.3: a handler destroys the loop that runs it: the loop goes when the handler "
          "returns, the run call returns",
          "[event_loop][lifetime][review]") {
  fake::FakeProvider fake;
  {
    Pipe pipe, other;
    std::optional<EventLoop> loop(make_loop());
    int calls = 0;
    auto destroy = [&](std::uint32_t) {
      ++calls;
      loop.reset();
    };
    // Both ready in one batch: whichever runs first destroys the loop, the other must not run.
    auto reg = registered(loop->watch_fd(pipe.r, EPOLLIN, destroy));
    auto other_reg = registered(loop->watch_fd(other.r, EPOLLIN, destroy));
    pipe.put("x");  // stays readable: only the loop's end ends run()
    other.put("x");
    SECTION("run") {
      CHECK(loop->run());
    }
    SECTION("run_once") {
      CHECK(loop->run_once(0ms));
    }
    CHECK_FALSE(loop);
    CHECK(calls == 1);  // nothing more of that round
    CHECK_FALSE(reg.active());
    CHECK_FALSE(other_reg.active());
  }
  fake.expect_clean();
}

TEST_CASE("review 2.7: ibv_poll_cq returning a negative value in the loop is that value, not an errno",
          "[event_loop][completions][review]") {
  fake::FakeProvider fake;
  {
    Peer peer = open_peer(fake);
    Conn conn = connected(fake, peer);
    ibv_cq* cq = *conn.cq()->native();
    EventLoop loop = make_loop();
    SeenCompletions seen;
    auto reg = registered(loop.watch_completions(conn, seen.handler()));
    for (int returned : {-1, -12}) {
      fake.add_completion(cq, completion(1));
      fake.poll_cq_returns(cq, returned);
      seen.errors.clear();
      CHECK(ran(loop.run_once(0ms)) == 1);
      REQUIRE(seen.errors.size() == 1);
      const Error& e = seen.errors[0];
      CHECK(e.code() == errc::provider);  // -12 is not ENOMEM's nomem
      CHECK(e.sys_errno() == 0);          // -1 is not EPERM
      CHECK(str(e.call()) == "ibv_poll_cq");
      CHECK_THAT(str(e.message()), Catch::Contains("returned " + std::to_string(returned)));
      CHECK(ran(loop.run_once(0ms)) == 1);  // then the completion
      seen.ids.clear();
    }
  }
  fake.expect_clean();
}

TEST_CASE("review 2.D: watch_completions: EIO from ibv_get_cq_event (the device is gone) is "
          "passed on once and ends the registration",
          "[event_loop][completions][review]") {
  fake::FakeProvider fake;
  {
    Peer peer = open_peer(fake);
    Conn conn = connected(fake, peer);
    ibv_cq* cq = *conn.cq()->native();
    EventLoop loop = make_loop();
    SeenCompletions seen;
    auto reg = registered(loop.watch_completions(conn, seen.handler()));
    fake.add_completion(cq, completion(1));
    fake.fail("ibv_get_cq_event", EIO);
    CHECK(ran(loop.run_once(0ms)) == 1);
    REQUIRE(seen.errors.size() == 1);
    check_injected(seen.errors[0], "ibv_get_cq_event", EIO);
    CHECK_FALSE(reg.active());
    CHECK(watched_sources(fake, loop) == 0);
    CHECK(ran(loop.run_once(0ms)) == 0);
    CHECK(seen.errors.size() == 1);
  }
  fake.expect_clean();
}

TEST_CASE("review 2.D: the source goes, then the loop, then the registration", "[event_loop][lifetime][review]") {
  fake::FakeProvider fake;
  {
    Peer peer = open_peer(fake);
    std::optional<Conn> conn(connected(fake, peer));
    std::optional<EventLoop> loop(make_loop());
    auto reg = registered(loop->watch(*conn, [](expected<ConnEvent>) {}));
    conn.reset();
    CHECK_FALSE(reg.active());
    loop.reset();
    reg.reset();  // touches nothing of the loop
    CHECK_FALSE(reg.active());
  }
  fake.expect_clean();
}

}  // namespace event_loop_test
