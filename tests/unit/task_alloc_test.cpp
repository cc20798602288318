// "No allocation per await beyond the coroutine frame": this binary replaces the global
// operator new/delete to count allocations, so it is kept apart from the shared unit-test
// binary. A warmed-up loop then runs 1000 awaits inside one coroutine, and the count over
// them must stay 0.
#include "fake_provider.hpp"
#include "forwarding_provider.hpp"

#include <rpmapp/event_loop.hpp>
#include <rpmapp/task.hpp>

#include "catch2_compat.hpp"

#include <atomic>
#include <cstdlib>
#include <memory>
#include <new>

namespace {

std::atomic<bool> counting{false};
std::atomic<long> allocations{0};
// Allocations made inside the fake provider (its call log, its events) are the provider's,
// not rpmapp's: a real librdmacm allocates in rdma_get_cm_event too.
thread_local int outside_rpmapp = 0;

void* allocate(std::size_t n, std::size_t align = 0) {
  if (counting.load(std::memory_order_relaxed) && outside_rpmapp == 0) allocations.fetch_add(1);
  if (n == 0) n = 1;
  void* p = nullptr;
  if (align > alignof(std::max_align_t)) {
    if (posix_memalign(&p, align, (n + align - 1) / align * align) != 0) p = nullptr;
  } else {
    p = std::malloc(n);
  }
  return p;
}

}  // namespace

void* operator new(std::size_t n) {
  if (void* p = allocate(n)) return p;
  throw std::bad_alloc();
}
void* operator new[](std::size_t n) {
  if (void* p = allocate(n)) return p;
  throw std::bad_alloc();
}
void* operator new(std::size_t n, const std::nothrow_t&) noexcept { return allocate(n); }
void* operator new[](std::size_t n, const std::nothrow_t&) noexcept { return allocate(n); }
void* operator new(std::size_t n, std::align_val_t a) {
  if (void* p = allocate(n, static_cast<std::size_t>(a))) return p;
  throw std::bad_alloc();
}
void* operator new[](std::size_t n, std::align_val_t a) {
  if (void* p = allocate(n, static_cast<std::size_t>(a))) return p;
  throw std::bad_alloc();
}
void operator delete(void* p) noexcept { std::free(p); }
void operator delete[](void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t) noexcept { std::free(p); }
void operator delete(void* p, std::align_val_t) noexcept { std::free(p); }
void operator delete[](void* p, std::align_val_t) noexcept { std::free(p); }
void operator delete(void* p, std::size_t, std::align_val_t) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t, std::align_val_t) noexcept { std::free(p); }

namespace {

using namespace rpmapp;
using namespace std::chrono_literals;

/// Counts allocations between its construction and count().
struct Window {
  long start;
  Window() : start(allocations.load()) { counting = true; }
  long count() {
    counting = false;
    return allocations.load() - start;
  }
  ~Window() { counting = false; }
};

/// Marks code that is not rpmapp's (the fake), whose allocations do not count.
struct NotRpmapp {
  NotRpmapp() { ++outside_rpmapp; }
  ~NotRpmapp() { --outside_rpmapp; }
  NotRpmapp(const NotRpmapp&) = delete;
};

EventLoop make_loop() {
  auto loop = EventLoop::create();
  REQUIRE(loop);
  return std::move(*loop);
}

}  // namespace

TEST_CASE("the allocation counter counts", "[alloc]") {
  Window w;
  auto p = std::make_unique<int>(1);
  auto a = std::make_unique<int[]>(3);
  CHECK(w.count() == 2);
}

TEST_CASE("1000 sleep_for awaits on a warmed-up loop allocate nothing (the system's epoll)", "[alloc]") {
  EventLoop loop = make_loop();
  auto sleeper = [&]() -> Task<long> {
    for (int i = 0; i < 3; ++i)  // warm-up: the loop's slot tables
      if (auto slept = co_await loop.sleep_for(0ms); !slept) FAIL(slept.error().message());
    Window w;
    int ok = 0;
    for (int i = 0; i < 1000; ++i) ok += co_await loop.sleep_for(i % 10 == 0 ? 1ms : 0ms) ? 1 : 0;
    const long n = w.count();
    REQUIRE(ok == 1000);
    co_return n;
  };
  auto n = block_on(loop, sleeper());
  REQUIRE(n);
  CHECK(*n == 0);
}

TEST_CASE("1000 next_event awaits, each suspended until the event arrives, allocate nothing", "[alloc]") {
  fake::FakeProvider fake;
  {
    test::ForwardingProvider<NotRpmapp> hooked;  // provider calls: the fake's allocations
    auto peer = Peer::open(fake.context(0));
    REQUIRE(peer);
    auto pending = ConnReq::start(*peer, "169.254.77.9", "7471");
    REQUIRE(pending);
    auto request = std::move(*pending).wait();
    REQUIRE(request);
    auto conn = std::move(*request).connect();
    REQUIRE(conn);
    const int fd = *conn->fd();
    EventLoop loop = make_loop();

    constexpr int rounds = 1000;
    bool waiting = false;
    int seen = 0;
    long counted = -1;
    // Awaits each event before it is there (a real suspension each time).
    auto waiter = [&]() -> Task<void> {
      for (int i = 0; i < 3; ++i) {  // warm-up
        waiting = true;
        auto ev = co_await loop.next_event(*conn, 2000ms);
        waiting = false;
        REQUIRE(ev);
      }
      Window w;
      for (int i = 0; i < rounds; ++i) {
        waiting = true;
        auto ev = co_await loop.next_event(*conn, 2000ms);
        waiting = false;
        if (ev && *ev == ConnEvent::unreachable) ++seen;
      }
      counted = w.count();
    };
    // Queues the next event once the waiter is suspended, from a sleeping coroutine.
    auto feeder = [&]() -> Task<void> {
      for (int sent = 0; sent < rounds + 3;) {
        auto slept = co_await loop.sleep_for(0ms);
        if (!slept) co_return;
        NotRpmapp fake_code;
        if (waiting && fake.queued(fd) == 0) {
          fake.inject_event(fd, RDMA_CM_EVENT_UNREACHABLE);
          ++sent;
        }
      }
    };
    REQUIRE(spawn(loop, feeder()));
    auto done = block_on(loop, waiter());
    REQUIRE(done);
    CHECK(seen == rounds);
    CHECK(counted == 0);
  }
  fake.expect_clean();
}
