// Helpers shared by the event loop and coroutine tests: a loop, a registration, a run that
// must succeed, and one awaiting coroutine's outcome.
#pragma once

#include "test_util.hpp"

#include <rpmapp/event_loop.hpp>
#include <rpmapp/task.hpp>

#include <chrono>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>

namespace test {

using Clock = std::chrono::steady_clock;

// A bound for waits that should end long before it: a hang fails instead of blocking.
inline constexpr std::chrono::milliseconds generous{3000};

inline EventLoop make_loop() {
  auto loop = EventLoop::create();
  INFO((loop ? std::string() : loop.error().message()));
  REQUIRE(loop);
  return std::move(*loop);
}

inline Registration registered(expected<Registration> reg) {
  INFO((reg ? std::string() : reg.error().message()));
  REQUIRE(reg);
  REQUIRE(reg->active());
  return std::move(*reg);
}

/// How many a run_once ran; it must succeed.
inline std::size_t ran(expected<std::size_t> n) {
  INFO((n ? std::string() : n.error().message()));
  REQUIRE(n);
  return *n;
}

/// Runs `loop` until `done()` or `bound` passed; whether done() became true.
template <class Done> bool run_until(EventLoop& loop, Done done, std::chrono::milliseconds bound = generous) {
  const auto end = Clock::now() + bound;
  while (!done() && Clock::now() < end) {
    auto n = loop.run_once(std::chrono::milliseconds(5));
    INFO((n ? std::string() : n.error().message()));
    REQUIRE(n);
  }
  return done();
}

/// A few turns of the loop that must find nothing more to resume.
inline void settle(EventLoop& loop) {
  for (int i = 0; i < 5; ++i) REQUIRE(loop.run_once(std::chrono::milliseconds(1)));
}

/// Counts destroyed coroutine frames (a by-value parameter lives in the frame).
struct FrameMark {
  int* destroyed = nullptr;
  explicit FrameMark(int* d) : destroyed(d) {}
  FrameMark(FrameMark&& o) noexcept : destroyed(std::exchange(o.destroyed, nullptr)) {}
  ~FrameMark() {
    if (destroyed != nullptr) ++*destroyed;
  }
};

template <class Make>
using AwaitResult = decltype(std::declval<std::invoke_result_t<Make&>>().await_resume());

/// What one awaiting coroutine saw.
template <class R> struct Outcome {
  int started = 0;
  int resumed = 0;  // incremented after the co_await: more than 1 is a double resumption
  std::optional<R> result;
  Clock::time_point at{};
  bool suspended() const { return started == 1 && resumed == 0; }
};

/// Awaits `make()` once and records the outcome.
template <class Make, class R = AwaitResult<Make>>
Task<void> await_once(Make make, Outcome<R>& out, [[maybe_unused]] FrameMark mark = FrameMark(nullptr)) {
  ++out.started;
  auto result = co_await make();
  ++out.resumed;
  out.at = Clock::now();
  out.result.emplace(std::move(result));
}

}  // namespace test
