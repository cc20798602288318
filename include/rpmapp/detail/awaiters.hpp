// What a coroutine co_awaits on an EventLoop (EventLoop::next_conn_req, next_event,
// resolve, connect, completions, sleep_for). Each awaiter lives in the coroutine's frame and
// is its own epoll entry and deadline: no allocation per await.
//
// An awaiter resumes its coroutine exactly once: with the result when the fd is ready and
// the operation completes; or with an error when the deadline passes, the loop stops, or
// the awaited source is destroyed (those resume from the loop's posted work, never from
// inside the destructor or stop() that caused them).
#pragma once

#include <rpmapp/detail/loop_core.hpp>

#include <coroutine>

RPMAPP_BEGIN_NAMESPACE
namespace detail {

/// The common part: registration, deadline, cancellation, resumption. `Derived` provides
/// `bool attempt()` (tries the operation without blocking: true when it stored a result or
/// an error), `int wait_fd()`, `SourceLink* source()`, `Result take()` and `fail_with(Error)`.
template <class Derived, class Result>
class Awaiter : public TimedWaiter {
 public:
  Awaiter(LoopCore* core, const char* call, std::chrono::milliseconds timeout) noexcept
      : core_(core), call_(call), timeout_(timeout) {}
  Awaiter(const Awaiter&) = delete;
  Awaiter& operator=(const Awaiter&) = delete;

  bool await_ready() noexcept {
    if (core_ == nullptr) return finish(moved_from(call_));
    if (core_->stopping) return finish(stopped());
    return self().attempt();
  }
  bool await_suspend(std::coroutine_handle<> waiting) noexcept {
    waiting_ = waiting;
    if (auto ok = self().watch(); !ok) return !finish(ok.error());  // resume at once
    if (timeout_.count() >= 0) core_->set_deadline(*this, deadline_after(timeout_));
    return true;
  }
  /// The result; an error names the awaited operation (call_).
  Result await_resume() noexcept { return named(call_, self().take()); }

  void ready(std::uint32_t) noexcept override {
    if (!self().attempt()) return;  // nothing yet (another reader took it): keep waiting
    detach();
    waiting_.resume();
  }
  void timed_out() noexcept override {
    finish(make_error(errc::no_event, 0, call_, "nothing within {} ms", timeout_.count()));
    cancel();
  }
  void loop_stopping() noexcept override {
    finish(stopped());
    cancel();
  }
  void source_gone() noexcept override {
    finish(invalid(call_, "the awaited object was destroyed or closed"));
    cancel();
  }
  void run_posted() noexcept override { waiting_.resume(); }
  /// The loop is gone: a coroutine of a destroyed loop is never resumed (the loop destroys
  /// those it owns; any other must be destroyed by its owner).
  void loop_gone() noexcept override {
    if (link != nullptr) link->detach(*this);
    core_ = nullptr;
  }

 protected:
  // (protected: destroyed only as the final awaiter, so it needs no virtual destructor, and
  // -Wnon-virtual-dtor stays quiet for users who enable it)
  ~Awaiter() { detach(); }
  /// Registers for `fd`, tied to `source` (may be null). Errors: as LoopCore::add.
  expected<void> watch_fd(int fd, SourceLink* source) noexcept {
    if (auto ok = core_->add(*this, fd, EPOLLIN); !ok) return ok;
    if (source != nullptr) source->attach(*this);
    return {};
  }
  /// Stores `e` as the result (Derived::fail_with); true, for await_ready.
  bool finish(const Error& e) noexcept {
    self().fail_with(e);
    return true;
  }
  /// Leaves the epoll set, the deadline list and the source.
  void detach() noexcept {
    if (loop != nullptr) loop->remove(*this);
    if (link != nullptr) link->detach(*this);
  }
  /// Leaves everything and resumes the coroutine from the loop's posted work.
  void cancel() noexcept {
    detach();
    if (core_ != nullptr) core_->post(*this);
  }
  const char* call() const noexcept { return call_; }
  LoopCore* core() const noexcept { return core_; }

 private:
  Derived& self() noexcept { return static_cast<Derived&>(*this); }
  Error stopped() const noexcept { return Error(errc::no_event, 0, call_, "the event loop was stopped"); }

  LoopCore* core_;
  const char* call_;
  std::chrono::milliseconds timeout_;
  std::coroutine_handle<> waiting_;
};

}  // namespace detail
RPMAPP_END_NAMESPACE
