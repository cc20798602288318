// rpmapp::Task: a small coroutine type for code that runs on an EventLoop, and the two ways
// to run one: spawn() (the loop owns it) and block_on() (run the loop until it is done).
//
// Any coroutine type can co_await the loop's awaitables (EventLoop::next_conn_req, ...):
// they need only that the coroutine is resumed on the loop's thread. Task is provided so
// that none has to be written.
#pragma once

#include <rpmapp/event_loop.hpp>

#include <coroutine>
#include <exception>
#include <optional>
#include <stdexcept>
#include <type_traits>
#include <utility>

RPMAPP_BEGIN_NAMESPACE

template <class T = void> class Task;

namespace detail {

struct TaskPromiseBase {
  std::coroutine_handle<> continuation;  // the coroutine awaiting this one
  std::exception_ptr exception;
  LoopCore* owner = nullptr;             // spawned: the loop that owns the frame
  bool* finished = nullptr;              // block_on's flag

  std::suspend_always initial_suspend() noexcept { return {}; }
  void unhandled_exception() noexcept { exception = std::current_exception(); }
};

/// A spawned task's ownership by its loop: started from the loop's posted work, destroyed
/// when it finishes or with the loop.
template <class Promise> struct SpawnedTask final : Waiter, OwnedTask {
  std::coroutine_handle<Promise> handle;
  void ready(std::uint32_t) noexcept override {}
  void run_posted() noexcept override { handle.resume(); }
  void destroy_owned() noexcept override {
    // The loop is going away: the frame is destroyed without being resumed.
    if (loop != nullptr) loop->unpost(*this);
    loop = nullptr;
    handle.destroy();
  }
};

template <class Promise> struct FinalAwaiter {
  bool await_ready() noexcept { return false; }
  std::coroutine_handle<> await_suspend(std::coroutine_handle<Promise> self) noexcept {
    Promise& promise = self.promise();
    if (promise.continuation) return promise.continuation;
    if (promise.finished != nullptr) *promise.finished = true;
    if (promise.owner != nullptr) {
      // Spawned: report an escaped exception, then the frame goes.
      if (promise.exception) promise.owner->note_exception(promise.exception);
      promise.owner->disown(promise.spawned);
      self.destroy();
    }
    return std::noop_coroutine();
  }
  void await_resume() noexcept {}
};

template <class T> struct TaskPromise : TaskPromiseBase {
  std::optional<T> value;
  SpawnedTask<TaskPromise> spawned;
  Task<T> get_return_object() noexcept;
  FinalAwaiter<TaskPromise> final_suspend() noexcept { return {}; }
  template <class U> void return_value(U&& v) noexcept(std::is_nothrow_constructible_v<T, U&&>) {
    value.emplace(std::forward<U>(v));
  }
  T result() {
    if (exception) std::rethrow_exception(exception);
    return std::move(*value);
  }
};

template <> struct TaskPromise<void> : TaskPromiseBase {
  SpawnedTask<TaskPromise> spawned;
  Task<void> get_return_object() noexcept;
  FinalAwaiter<TaskPromise> final_suspend() noexcept { return {}; }
  void return_void() noexcept {}
  void result() {
    if (exception) std::rethrow_exception(exception);
  }
};

template <class T> inline constexpr bool is_expected = false;
template <class U> inline constexpr bool is_expected<expected<U>> = true;

/// What co_await of an empty Task (moved from, or handed to spawn) gives: inval when T is an
/// expected, else a thrown std::invalid_argument (which reaches the awaiting coroutine).
template <class T> T empty_task_result() {
  constexpr const char* reason = "co_await on an empty Task (moved from, or handed to spawn)";
  if constexpr (is_expected<T>) return fail(Error(errc::inval, 0, "Task", reason).name_operation("Task"));
  else throw std::invalid_argument(reason);
}

}  // namespace detail

/// A lazily started coroutine returning T. Start it by co_awaiting it (from another
/// coroutine: the result, or the exception it let escape, comes back there), by spawn(),
/// or by block_on(). Destroying a Task that has not finished destroys its frame (and so
/// cancels what it awaited: the awaiters leave the loop). co_await on an empty Task (moved
/// from, or handed to spawn) gives errc::inval when T is an expected, else throws
/// std::invalid_argument in the awaiting coroutine.
/// Thread safety: on the thread of the loop it runs on.
template <class T> class Task {
 public:
  using promise_type = detail::TaskPromise<T>;
  using handle_type = std::coroutine_handle<promise_type>;

  Task(Task&& other) noexcept : handle_(std::exchange(other.handle_, nullptr)) {}
  Task& operator=(Task&& other) noexcept {
    if (this != &other) {
      if (handle_) handle_.destroy();
      handle_ = std::exchange(other.handle_, nullptr);
    }
    return *this;
  }
  ~Task() {
    if (handle_) handle_.destroy();
  }

  explicit operator bool() const noexcept { return static_cast<bool>(handle_); }

  /// Awaiting a Task starts it and resumes the awaiting coroutine when it finishes. (A
  /// separate awaiter, made for each co_await: g++ 11 cannot compile `auto r = co_await
  /// task;` when the Task lvalue is its own awaiter and T is an expected.)
  struct Awaiter {
    handle_type handle;
    bool await_ready() const noexcept { return !handle || handle.done(); }
    std::coroutine_handle<> await_suspend(std::coroutine_handle<> awaiting) noexcept {
      handle.promise().continuation = awaiting;
      return handle;
    }
    T await_resume() {
      if (!handle) [[unlikely]]
        return detail::empty_task_result<T>();
      return handle.promise().result();
    }
  };
  Awaiter operator co_await() const noexcept { return Awaiter{handle_}; }

 private:
  friend promise_type;
  template <class U> friend expected<U> block_on(EventLoop&, Task<U>) noexcept(false);
  friend expected<void> spawn(EventLoop&, Task<void>) noexcept;
  explicit Task(handle_type h) noexcept : handle_(h) {}
  handle_type handle_;
};

namespace detail {
template <class T> Task<T> TaskPromise<T>::get_return_object() noexcept {
  return Task<T>(std::coroutine_handle<TaskPromise<T>>::from_promise(*this));
}
inline Task<void> TaskPromise<void>::get_return_object() noexcept {
  return Task<void>(std::coroutine_handle<TaskPromise<void>>::from_promise(*this));
}
}  // namespace detail

/// Hands `task` to `loop`, which starts it in its next run call and owns it: its frame is
/// destroyed when it finishes, or with the loop (without being resumed). An exception
/// escaping it is reported as a handler's is (log hook, errc::unknown from the run call).
/// Errors: inval (empty loop or task; a task already started).
/// Thread safety: on the loop's thread.
inline expected<void> spawn(EventLoop& loop, Task<void> task) noexcept {
  if (!loop) return detail::fail(detail::moved_from("spawn").name_operation("spawn"));
  // A task awaited by another coroutine (started) is that coroutine's to resume.
  if (!task.handle_ || task.handle_.done() || task.handle_.promise().continuation)
    return detail::fail(
        detail::invalid("spawn", "the task is empty, already started or finished").name_operation("spawn"));
  auto handle = std::exchange(task.handle_, nullptr);
  auto& promise = handle.promise();
  detail::LoopCore* core = loop.core();
  promise.owner = core;
  promise.spawned.handle = handle;
  core->own(promise.spawned);
  core->post(promise.spawned);
  return {};
}

/// Runs `loop` until `task` finishes, and returns its result. The loop's other handlers
/// and coroutines run meanwhile. An exception escaping the task is rethrown here.
/// Errors: the loop's (as run(): provider epoll_wait; unknown: a handler or spawned
/// coroutine threw; the task is destroyed then); inval (empty loop or task, a task another
/// coroutine is awaiting, or called from a handler or coroutine of the loop; the loop
/// destroyed by one of its handlers or coroutines before the task finished). When `T` is
/// itself an expected, the two levels are returned as they are.
/// Thread safety: on the loop's thread.
template <class T> expected<T> block_on(EventLoop& loop, Task<T> task) noexcept(false) {
  constexpr const char* call = "block_on";
  // the loop's own errors name block_on; the task's result is returned as it is
  const auto fail = [](Error e) { return detail::fail(e.name_operation(call)); };
  if (!loop) return fail(detail::moved_from(call));
  if (!task.handle_) return fail(detail::invalid(call, "the task is empty"));
  if (!task.handle_.done() && task.handle_.promise().continuation)
    return fail(detail::invalid(call, "the task is already started by another coroutine"));
  if (loop.core()->dispatch_depth > 0)
    return fail(detail::invalid(call, "called from a handler or coroutine of this loop"));
  detail::LoopCore* core = loop.core();  // the task may destroy `loop`: only `core` from here
  bool finished = task.handle_.done();
  task.handle_.promise().finished = &finished;
  bool destroyed = false;
  if (!finished) {
    ++core->dispatch_depth;  // its first step is one of the loop's coroutines too
    task.handle_.resume();
    --core->dispatch_depth;
    if (core->doomed) {
      destroyed = true;
      if (auto failed = detail::LoopCore::destroy_doomed(core); !failed) return fail(failed.error());
    }
  }
  while (!finished) {
    if (destroyed)
      return fail(detail::invalid(call, "the event loop was destroyed before the task finished"));
    auto ran = detail::run_round(core, detail::Deadline(detail::Wait::forever()), destroyed);
    if (!ran) return fail(ran.error());
  }
  if constexpr (std::is_void_v<T>) {
    task.handle_.promise().result();
    return {};
  } else {
    return expected<T>(expected_in_place, task.handle_.promise().result());
  }
}

RPMAPP_END_NAMESPACE
