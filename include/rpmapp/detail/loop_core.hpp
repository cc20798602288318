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
#include <rpmapp/detail/event_routes.hpp>
#include <rpmapp/detail/source_link.hpp>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <exception>
#include <memory>
#include <vector>

RPMAPP_BEGIN_NAMESPACE
namespace detail {

class LoopCore;

/// Something a loop waits for: an fd in its epoll set, optionally with a deadline.
struct Waiter : SourceWatcher {
  static constexpr std::uint32_t no_slot = 0xffffffffu;
  using clock = std::chrono::steady_clock;

  // Small: an event loop keeps one per watched connection. So the fd is in the loop's
  // slot, and the slot and every flag, the handler waiters' too, share one word.
  LoopCore* loop = nullptr;     // set while registered (or awaiting a deadline or posted)
  Waiter* post_next = nullptr;
  /// Waiting for a connection's events on a shared event channel (LoopCore::add_routed):
  /// its inbox, and the loop's pump reading that channel.
  EventInbox* inbox = nullptr;
  Waiter* pump = nullptr;
  Waiter* routed_prev = nullptr;
  Waiter* routed_next = nullptr;
  std::uint32_t slot = no_slot;  // its epoll entry, or none
  // Written on the loop's thread only (bits of one byte).
  bool timed : 1 = false;      // a TimedWaiter whose deadline applies
  bool posted : 1 = false;
  bool signalled : 1 = false;  // posted by post_signal: run as ready(EPOLLIN), not run_posted()
  // HandlerWaiter's, here to share the word.
  bool dispatching = false;
  bool orphaned = false;

  /// Whether it waits for an fd or for routed events (it may be woken by something).
  bool watching() const noexcept { return slot != no_slot || inbox != nullptr; }

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
  /// Routed events wake it as its fd would (post_signal).
  void events_routed() noexcept override;

 protected:
  ~Waiter() = default;
};

/// A waiter with a deadline (a coroutine's await with a timeout): the handlers' waiters,
/// one per watched connection, have none and do without these fields.
struct TimedWaiter : Waiter {
  clock::time_point deadline{};
  TimedWaiter* timer_prev = nullptr;
  TimedWaiter* timer_next = nullptr;

 protected:
  ~TimedWaiter() = default;
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
Waiter::clock::time_point deadline_after(std::chrono::milliseconds timeout) noexcept;

/// Work a loop finishes for a coroutine that is gone (EventLoop::connect's thread on
/// iWARP, its coroutine destroyed mid-call): LoopCore::adopt keeps it until finished(),
/// then destroys it on the loop's thread; the loop's destructor waits for the rest.
/// (Its implementations define their virtual functions in the class, so that no translation
/// unit emits a vtable it does not use.)
struct Orphan {
  virtual ~Orphan() = default;
  virtual bool finished() const noexcept = 0;
  /// From now on the loop keeps it: wake the loop when finished.
  virtual void adopted_by(LoopCore& loop) noexcept = 0;
};

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
  expected<void> open() noexcept;

  /// Destroys the owned coroutines, lets go of every waiter, closes the fds.
  ~LoopCore();

  // ---- waiters

  /// Adds `w` (for `fd`, `events`) to the epoll set. Errors: provider (epoll_ctl: EEXIST
  /// when something already waits on the fd in this loop), nomem.
  expected<void> add(Waiter& w, int fd, std::uint32_t events) noexcept;

  /// Makes `w` wait for the events routed to `inbox` on the shared channel `routes`: the
  /// channel's fd joins the epoll set once per loop (its pump, which routes what it reads
  /// and wakes the waiters of those inboxes). Errors: inval (another loop drives the
  /// channel); provider (epoll_ctl: EEXIST when something of this loop already waits on
  /// the inbox); nomem.
  expected<void> add_routed(const char* call, Waiter& w, const std::shared_ptr<EventRoutes>& routes,
                            EventInbox& inbox) noexcept;

  /// Takes `w` out of the epoll set (or its inbox), its deadline and the posted work: it
  /// no longer refers to the loop.
  void remove(Waiter& w) noexcept;

  /// Takes `w` out of the epoll set (or its inbox) only (its deadline stays): before a
  /// call that may destroy the fd it waits on.
  void unwatch(Waiter& w) noexcept;

  void set_deadline(TimedWaiter& w, Waiter::clock::time_point when) noexcept;
  void clear_deadline(Waiter& w) noexcept;

  /// Runs w.run_posted() after the current dispatch (or in the next run_once).
  void post(Waiter& w) noexcept;
  /// Runs w.ready(EPOLLIN) after the current dispatch: its source has news that its fd
  /// does not announce (SourceWatcher::source_signalled). Nothing if `w` is posted already.
  void post_signal(Waiter& w) noexcept;
  /// post_signal for every waiter of routed events whose channel `pump` reads (after the
  /// pump failed to read it).
  void signal_routed(const Waiter* pump) noexcept;
  /// Runs w.ready(EPOLLIN) at the start of the next run_once, after this round: a source
  /// with more to do than one round's share (a completion queue not drained) takes its
  /// turn after the others. Nothing if `w` is posted already.
  void post_next_round(Waiter& w) noexcept;
  void unpost(Waiter& w) noexcept;

  /// Keeps `orphan` until it finished (destroyed in run_once, woken by it), else until
  /// the destructor, which waits for it. Out of memory: destroyed here (waits).
  void adopt(std::unique_ptr<Orphan> orphan) noexcept;

  void own(OwnedTask& t) noexcept;
  void disown(OwnedTask& t) noexcept;

  // ---- running

  /// Records an exception that escaped a handler or a spawned coroutine: logged, and
  /// returned by the run call in progress.
  void note_exception(std::exception_ptr e) noexcept;

  /// Waits until `deadline` for something to do, and does it: ready fds, expired
  /// deadlines, posted work. Returns how many waiters it ran.
  expected<std::size_t> run_once(const Deadline& deadline) noexcept;

  /// Makes every coroutine waiting on the loop give up (stop()).
  void cancel_awaiters() noexcept;

  /// The failure a handler left since the last call, if any.
  expected<void> take_failure() noexcept;

  /// Destroys a doomed core once its run call's dispatch is over; the failure a handler
  /// left, if any, is returned.
  static expected<void> destroy_doomed(LoopCore* core) noexcept;

  void wake() noexcept;

 private:
  struct Slot {
    Waiter* waiter = nullptr;
    std::uint32_t generation = 0;
    int fd = -1;  // the waiter's
  };

  Waiter::clock::time_point earliest() const noexcept;

  std::size_t expire() noexcept;

  std::size_t run_posted() noexcept;

  void drain_wake() noexcept;

  // Destroys the finished orphans.
  void reap_orphans() noexcept;

  // Posts `w` (not posted) at the end of the list [head, tail].
  void append(Waiter& w, Waiter*& head, Waiter*& tail) noexcept;

  // Takes `w` out of the list [head, tail]; whether it was there.
  static bool unlink(Waiter& w, Waiter*& head, Waiter*& tail) noexcept;

  std::vector<Slot> slots;
  std::vector<std::uint32_t> free_slots;
  TimedWaiter* timers = nullptr;
  Waiter* posted_head = nullptr;
  Waiter* posted_tail = nullptr;
  Waiter* next_head = nullptr;  // post_next_round's, for the next run_once
  Waiter* next_tail = nullptr;
  Waiter* routed = nullptr;  // the waiters of routed events (add_routed)
  std::vector<std::unique_ptr<Orphan>> orphans;
};

/// One round of `core` (EventLoop::run_once, block_on): a pending stop() cancels the
/// awaiting coroutines (0 ran); else waits until `deadline` and runs what is ready. Returns
/// how many ran, or the failure a handler left. When a handler or coroutine destroyed the
/// loop meanwhile, destroys the core and sets `destroyed`.
expected<std::size_t> run_round(LoopCore* core, const Deadline& deadline, bool& destroyed) noexcept;

}  // namespace detail
RPMAPP_END_NAMESPACE

#if !defined(RPMAPP_SEPARATE_COMPILATION)
#  include <rpmapp/impl/detail_loop_core.ipp>
#endif
