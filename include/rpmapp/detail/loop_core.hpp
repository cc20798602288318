// The event loop's machinery: an epoll set whose entries are Waiters (handler
// registrations and awaiting coroutines), an eventfd that wakes it from other threads,
// deadlines, and work posted to run after the current dispatch.
//
// epoll entries carry a token (slot index | generation << 32), never a pointer: a waiter
// removed while its event sits in the batch being dispatched is recognised as gone.
// Nothing here allocates per wait: slots are reused, deadlines and posted work are
// intrusive lists.
#pragma once

#include <rpmapp/detail/cm_event.hpp>
#include <rpmapp/detail/errors.hpp>
#include <rpmapp/detail/source_link.hpp>
#include <rpmapp/log.hpp>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <exception>
#include <utility>
#include <vector>

RPMAPP_BEGIN_NAMESPACE
namespace detail {

class LoopCore;

/// Something a loop waits for: an fd in its epoll set, optionally with a deadline.
struct Waiter : SourceWatcher {
  static constexpr std::uint32_t no_slot = 0xffffffffu;
  using clock = std::chrono::steady_clock;

  LoopCore* loop = nullptr;     // set while registered (or awaiting a deadline or posted)
  std::uint32_t slot = no_slot;  // its epoll entry, or none
  int fd = -1;
  bool timed = false;
  clock::time_point deadline{};
  Waiter* timer_prev = nullptr;
  Waiter* timer_next = nullptr;
  bool posted = false;
  bool signalled = false;  // posted by post_signal: run as ready(EPOLLIN), not run_posted()
  Waiter* post_next = nullptr;

  /// The fd is ready (epoll's events). A handler's exception leaves through here.
  virtual void ready(std::uint32_t events) = 0;
  /// The deadline passed; the loop has already removed the waiter.
  virtual void timed_out() noexcept {}
  /// The loop is stopping: coroutines give up, handlers stay.
  virtual void loop_stopping() noexcept {}
  /// The loop is being destroyed; it has already removed the waiter.
  virtual void loop_gone() noexcept {}
  /// Work posted with LoopCore::post, run after the dispatch that posted it.
  virtual void run_posted() noexcept {}
  void source_gone() noexcept override {}

 protected:
  ~Waiter() = default;
};

/// Frames of coroutines the loop owns (EventLoop::spawn): destroyed with the loop.
struct OwnedTask {
  OwnedTask* owned_prev = nullptr;
  OwnedTask* owned_next = nullptr;
  virtual void destroy_owned() noexcept = 0;

 protected:
  ~OwnedTask() = default;
};

/// `timeout` from now, saturated at the clock's end: milliseconds::max() (the usual way to
/// write "forever") would overflow steady_clock's nanoseconds.
inline Waiter::clock::time_point deadline_after(std::chrono::milliseconds timeout) noexcept {
  const auto now = Waiter::clock::now();
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(Waiter::clock::time_point::max() - now);
  return timeout >= left ? Waiter::clock::time_point::max() : now + timeout;
}

class LoopCore {
 public:
  static constexpr std::uint64_t wake_token = ~std::uint64_t{0};
  static constexpr int batch = 64;

  const Provider* seam = current_provider;
  int epfd = -1;
  int wakefd = -1;
  std::atomic<bool> stop_requested{false};
  bool stopping = false;  // coroutines are being cancelled by stop(): new awaits fail at once
  int dispatch_depth = 0;
  /// Its EventLoop was destroyed by one of its handlers or coroutines: the run call in
  /// progress stops dispatching and destroys the core once that dispatch is over.
  bool doomed = false;
  bool failed = false;  // a handler threw since the last report
  Error failure;
  OwnedTask* owned = nullptr;

  LoopCore() = default;
  LoopCore(const LoopCore&) = delete;
  LoopCore& operator=(const LoopCore&) = delete;

  /// Creates the epoll set and the eventfd. Errors: provider (epoll_create1, eventfd,
  /// epoll_ctl).
  expected<void> open() noexcept {
    const Provider& p = *seam;
    errno = 0;
    epfd = p.epoll_create1(EPOLL_CLOEXEC);
    if (epfd < 0) return fail(provider_error("epoll_create1", errno));
    errno = 0;
    wakefd = p.eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (wakefd < 0) return fail(provider_error("eventfd", errno));
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.u64 = wake_token;
    errno = 0;
    if (p.epoll_ctl(epfd, EPOLL_CTL_ADD, wakefd, &ev) != 0)
      return fail(provider_error("epoll_ctl", errno, "adding the loop's eventfd"));
    return {};
  }

  /// Destroys the owned coroutines, lets go of every waiter, closes the fds.
  ~LoopCore() {
    while (owned != nullptr) {
      OwnedTask* t = owned;
      disown(*t);
      t->destroy_owned();
    }
    for (Waiter** head : {&posted_head, &next_head})
      while (Waiter* w = *head) {
        *head = w->post_next;
        w->posted = false;
        w->post_next = nullptr;
        w->loop = nullptr;
        w->loop_gone();
      }
    for (auto& s : slots) {
      if (s.waiter == nullptr) continue;
      Waiter* w = s.waiter;
      remove(*w);
      w->loop = nullptr;
      w->loop_gone();
    }
    while (Waiter* w = timers) {
      clear_deadline(*w);
      w->loop = nullptr;
      w->loop_gone();
    }
    const Provider& p = *seam;
    // The epoll fd first: the eventfd is in its set.
    if (epfd >= 0 && p.close(epfd) != 0) log(LogLevel::warning, "~EventLoop", provider_error("close", errno, "the loop's epoll fd"));
    if (wakefd >= 0 && p.close(wakefd) != 0) log(LogLevel::warning, "~EventLoop", provider_error("close", errno, "the loop's eventfd"));
  }

  // ---- waiters

  /// Adds `w` (for `fd`, `events`) to the epoll set. Errors: provider (epoll_ctl: EEXIST
  /// when something already waits on the fd in this loop), nomem.
  expected<void> add(Waiter& w, int fd, std::uint32_t events) noexcept {
    std::uint32_t index;
    if (!free_slots.empty()) {
      index = free_slots.back();
    } else {
      try {
        slots.push_back({});
        free_slots.reserve(slots.size());
      } catch (const std::bad_alloc&) {
        return fail(Error(errc::nomem, ENOMEM, "EventLoop", "memory allocation failed"));
      }
      index = static_cast<std::uint32_t>(slots.size() - 1);
      free_slots.push_back(index);
    }
    epoll_event ev{};
    ev.events = events;
    ev.data.u64 = (std::uint64_t{slots[index].generation} << 32) | index;
    errno = 0;
    if (seam->epoll_ctl(epfd, EPOLL_CTL_ADD, fd, &ev) != 0) {
      const int e = errno;
      return fail(provider_error("epoll_ctl", e, e == EEXIST ? "the fd is already watched by this loop" : ""));
    }
    free_slots.pop_back();
    slots[index].waiter = &w;
    w.loop = this;
    w.slot = index;
    w.fd = fd;
    return {};
  }

  /// Takes `w` out of the epoll set, its deadline and the posted work: it no longer
  /// refers to the loop.
  void remove(Waiter& w) noexcept {
    unwatch(w);
    clear_deadline(w);
    unpost(w);
    w.loop = nullptr;
  }

  /// Takes `w` out of the epoll set only (its deadline stays): before a call that may
  /// destroy the fd it waits on.
  void unwatch(Waiter& w) noexcept {
    if (w.slot != Waiter::no_slot) {
      errno = 0;
      if (seam->epoll_ctl(epfd, EPOLL_CTL_DEL, w.fd, nullptr) != 0)
        log(LogLevel::warning, "EventLoop", provider_error("epoll_ctl", errno, "removing a watched fd"));
      Slot& s = slots[w.slot];
      s.waiter = nullptr;
      ++s.generation;
      free_slots.push_back(w.slot);  // reserved: never throws
      w.slot = Waiter::no_slot;
      w.fd = -1;
    }
  }

  void set_deadline(Waiter& w, Waiter::clock::time_point when) noexcept {
    clear_deadline(w);
    w.loop = this;
    w.timed = true;
    w.deadline = when;
    w.timer_next = timers;
    if (timers != nullptr) timers->timer_prev = &w;
    timers = &w;
  }
  void clear_deadline(Waiter& w) noexcept {
    if (!w.timed) return;
    if (w.timer_prev != nullptr) w.timer_prev->timer_next = w.timer_next;
    else timers = w.timer_next;
    if (w.timer_next != nullptr) w.timer_next->timer_prev = w.timer_prev;
    w.timer_prev = w.timer_next = nullptr;
    w.timed = false;
  }

  /// Runs w.run_posted() after the current dispatch (or in the next run_once).
  void post(Waiter& w) noexcept {
    w.signalled = false;  // what the waiter posts itself for wins over a signal
    if (w.posted) return;
    append(w, posted_head, posted_tail);
  }
  /// Runs w.ready(EPOLLIN) after the current dispatch: its source has news that its fd
  /// does not announce (SourceWatcher::source_signalled). Nothing if `w` is posted already.
  void post_signal(Waiter& w) noexcept {
    if (w.posted) return;
    post(w);
    w.signalled = true;
  }
  /// Runs w.ready(EPOLLIN) at the start of the next run_once, after this round: a source
  /// with more to do than one round's share (a completion queue not drained) takes its
  /// turn after the others. Nothing if `w` is posted already.
  void post_next_round(Waiter& w) noexcept {
    if (w.posted) return;
    append(w, next_head, next_tail);
    w.signalled = true;
  }
  void unpost(Waiter& w) noexcept {
    if (!w.posted) return;
    if (!unlink(w, posted_head, posted_tail)) unlink(w, next_head, next_tail);
    w.posted = false;
    w.signalled = false;
    w.post_next = nullptr;
  }

  void own(OwnedTask& t) noexcept {
    t.owned_prev = nullptr;
    t.owned_next = owned;
    if (owned != nullptr) owned->owned_prev = &t;
    owned = &t;
  }
  void disown(OwnedTask& t) noexcept {
    if (t.owned_prev != nullptr) t.owned_prev->owned_next = t.owned_next;
    else if (owned == &t) owned = t.owned_next;
    if (t.owned_next != nullptr) t.owned_next->owned_prev = t.owned_prev;
    t.owned_prev = t.owned_next = nullptr;
  }

  // ---- running

  /// Records an exception that escaped a handler or a spawned coroutine: logged, and
  /// returned by the run call in progress.
  void note_exception(std::exception_ptr e) noexcept {
    char what[Error::max_reason];
    std::size_t n = 0;
    try {
      std::rethrow_exception(e);
    } catch (const std::exception& ex) {
      n = detail::format_to_n(what, sizeof what, "a handler threw: {}", ex.what()).size;
    } catch (...) {
      n = detail::format_to_n(what, sizeof what, "a handler threw an exception that is not a std::exception").size;
    }
    Error error(errc::unknown, 0, "EventLoop::run", {what, n < sizeof what ? n : sizeof what});
    log(LogLevel::error, "EventLoop::run", error);
    if (!failed) {
      failed = true;
      failure = error;
    }
  }

  /// Waits until `deadline` for something to do, and does it: ready fds, expired
  /// deadlines, posted work. Returns how many waiters it ran.
  expected<std::size_t> run_once(const Deadline& deadline) noexcept {
    if (next_head != nullptr) {  // the last round's leftovers join this round's posted work
      (posted_tail != nullptr ? posted_tail->post_next : posted_head) = next_head;
      posted_tail = next_tail;
      next_head = next_tail = nullptr;
    }
    std::size_t ran = run_posted();
    epoll_event events[batch];
    int n;
    for (;;) {
      int timeout = ran > 0 ? 0 : deadline.poll_timeout();
      if (timeout != 0 && timers != nullptr) {
        const auto left = std::chrono::ceil<std::chrono::milliseconds>(earliest() - Waiter::clock::now()).count();
        const int t = left <= 0 ? 0 : left > 0x7fffffff ? 0x7fffffff : static_cast<int>(left);
        timeout = timeout < 0 ? t : std::min(timeout, t);
      }
      errno = 0;
      n = seam->epoll_wait(epfd, events, batch, timeout);
      if (n >= 0) break;
      if (errno != EINTR) return fail(provider_error("epoll_wait", errno));
      if (deadline.passed()) {
        n = 0;
        break;
      }
    }
    for (int i = 0; i < n; ++i) {
      const std::uint64_t token = events[i].data.u64;
      if (token == wake_token) {
        drain_wake();
        continue;
      }
      const auto index = static_cast<std::uint32_t>(token);
      if (index >= slots.size() || slots[index].generation != static_cast<std::uint32_t>(token >> 32))
        continue;  // removed while this batch was being dispatched
      Waiter* w = slots[index].waiter;
      if (w == nullptr) continue;
      ++ran;
      ++dispatch_depth;
      try {
        w->ready(events[i].events);
      } catch (...) {
        note_exception(std::current_exception());
      }
      --dispatch_depth;
      if (doomed) return ran;  // the rest of the batch went with the loop
    }
    ran += expire();
    ran += run_posted();
    return ran;
  }

  /// Makes every coroutine waiting on the loop give up (stop()).
  void cancel_awaiters() noexcept {
    stopping = true;
    for (std::size_t i = 0; i < slots.size(); ++i)
      if (Waiter* w = slots[i].waiter) w->loop_stopping();
    for (Waiter* w = timers; w != nullptr;) {
      Waiter* next = w->timer_next;
      w->loop_stopping();
      w = next;
    }
    run_posted();
    stopping = false;
  }

  /// The failure a handler left since the last call, if any.
  expected<void> take_failure() noexcept {
    if (!failed) return {};
    failed = false;
    return fail(failure);
  }

  /// Destroys a doomed core once its run call's dispatch is over; the failure a handler
  /// left, if any, is returned.
  static expected<void> destroy_doomed(LoopCore* core) noexcept {
    auto result = core->take_failure();
    delete core;
    return result;
  }

  void wake() noexcept {
    const std::uint64_t one = 1;
    // EAGAIN: the counter is full, so the loop is already due to wake.
    if (seam->write(wakefd, &one, sizeof one) < 0 && errno != EAGAIN)
      log(LogLevel::warning, "EventLoop::wake", provider_error("write", errno, "the loop's eventfd"));
  }

 private:
  struct Slot {
    Waiter* waiter = nullptr;
    std::uint32_t generation = 0;
  };

  Waiter::clock::time_point earliest() const noexcept {
    auto when = Waiter::clock::time_point::max();
    for (const Waiter* w = timers; w != nullptr; w = w->timer_next) when = std::min(when, w->deadline);
    return when;
  }

  std::size_t expire() noexcept {
    if (timers == nullptr) return 0;
    const auto now = Waiter::clock::now();
    std::size_t ran = 0;
    for (Waiter* w = timers; w != nullptr;) {
      Waiter* next = w->timer_next;
      if (w->deadline <= now) {
        remove(*w);
        w->timed_out();  // posts what it resumes: no user code runs here
        ++ran;
        next = timers;  // timed_out may have changed the list: start over
      }
      w = next;
    }
    return ran;
  }

  std::size_t run_posted() noexcept {
    std::size_t ran = 0;
    while (Waiter* w = posted_head) {
      posted_head = w->post_next;
      if (posted_head == nullptr) posted_tail = nullptr;
      w->posted = false;
      w->post_next = nullptr;
      ++dispatch_depth;  // a coroutine resumed here is inside the loop too (no nested run)
      if (std::exchange(w->signalled, false)) {
        try {
          w->ready(EPOLLIN);
        } catch (...) {
          note_exception(std::current_exception());
        }
      } else {
        w->run_posted();
      }
      --dispatch_depth;
      ++ran;
      if (doomed) return ran;
    }
    return ran;
  }

  void drain_wake() noexcept {
    std::uint64_t count = 0;
    if (seam->read(wakefd, &count, sizeof count) < 0 && errno != EAGAIN)
      log(LogLevel::warning, "EventLoop::run", provider_error("read", errno, "the loop's eventfd"));
  }

  // Posts `w` (not posted) at the end of the list [head, tail].
  void append(Waiter& w, Waiter*& head, Waiter*& tail) noexcept {
    w.loop = this;
    w.posted = true;
    w.post_next = nullptr;
    (tail != nullptr ? tail->post_next : head) = &w;
    tail = &w;
  }

  // Takes `w` out of the list [head, tail]; whether it was there.
  static bool unlink(Waiter& w, Waiter*& head, Waiter*& tail) noexcept {
    Waiter* prev = nullptr;
    for (Waiter* at = head; at != nullptr; prev = at, at = at->post_next)
      if (at == &w) {
        (prev != nullptr ? prev->post_next : head) = w.post_next;
        if (tail == &w) tail = prev;
        return true;
      }
    return false;
  }

  std::vector<Slot> slots;
  std::vector<std::uint32_t> free_slots;
  Waiter* timers = nullptr;
  Waiter* posted_head = nullptr;
  Waiter* posted_tail = nullptr;
  Waiter* next_head = nullptr;  // post_next_round's, for the next run_once
  Waiter* next_tail = nullptr;
};

/// One round of `core` (EventLoop::run_once, block_on): a pending stop() cancels the
/// awaiting coroutines (0 ran); else waits until `deadline` and runs what is ready. Returns
/// how many ran, or the failure a handler left. When a handler or coroutine destroyed the
/// loop meanwhile, destroys the core and sets `destroyed`.
inline expected<std::size_t> run_round(LoopCore* core, const Deadline& deadline, bool& destroyed) noexcept {
  expected<std::size_t> ran = std::size_t{0};
  if (core->stop_requested.exchange(false)) core->cancel_awaiters();
  else ran = core->run_once(deadline);
  if (core->doomed) {
    destroyed = true;
    if (auto failed = LoopCore::destroy_doomed(core); !failed) return fail(failed.error());
    return ran;
  }
  if (!ran) return ran;
  if (auto failed = core->take_failure(); !failed) return fail(failed.error());
  return ran;
}

}  // namespace detail
RPMAPP_END_NAMESPACE
