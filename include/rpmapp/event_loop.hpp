// rpmapp::EventLoop: an epoll loop on the caller's thread that calls handlers for
// connection requests, connection events, outgoing requests, completions and plain fds
// (ib_cm's cm_handler, for user space), and drives coroutines (task.hpp).
#pragma once

#include <rpmapp/config.hpp>
#include <rpmapp/conn.hpp>
#include <rpmapp/conn_req.hpp>
#include <rpmapp/cq.hpp>
#include <rpmapp/detail/handler_waiters.hpp>
#include <rpmapp/detail/loop_awaiters.hpp>
#include <rpmapp/detail/loop_core.hpp>
#include <rpmapp/endpoint.hpp>
#include <rpmapp/error.hpp>
#include <rpmapp/log.hpp>
#include <rpmapp/shared_cq.hpp>

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <utility>

RPMAPP_BEGIN_NAMESPACE

/// A handler registration (EventLoop::serve, watch, resolve, watch_completions, watch_fd).
/// Destroying it, or reset(), unregisters the handler: it is not called again, also when
/// that happens inside the handler itself. A registration outlives its loop and its source
/// safely: it just becomes inactive.
/// Thread safety: on the loop's thread only.
class Registration {
 public:
  Registration() = default;
  Registration(Registration&& other) noexcept : waiter_(std::exchange(other.waiter_, nullptr)) {}
  Registration& operator=(Registration&& other) noexcept;
  ~Registration() { reset(); }

  /// Unregisters (idempotent).
  void reset() noexcept {
    if (waiter_ != nullptr) std::exchange(waiter_, nullptr)->release();
  }
  /// True while the handler can still be called: registered, the loop and the source alive
  /// (a resolve() registration ends when resolution is over).
  bool active() const noexcept { return waiter_ != nullptr && waiter_->active(); }
  explicit operator bool() const noexcept { return active(); }

 private:
  friend class EventLoop;
  explicit Registration(detail::HandlerWaiter* w) noexcept : waiter_(w) {}
  detail::HandlerWaiter* waiter_ = nullptr;
};

/// Which completion queue of a connection EventLoop::watch_completions watches.
enum class CqKind {
  main,     ///< Conn::cq(): send completions (and receive ones without a receive CQ); with
            ///< ConnConfig::shared_completion_channel, both queues' completions
  receive,  ///< Conn::rcq(): the connection's own receive CQ on its own channel
};

/// An event loop (epoll) that runs on the calling thread: run(), run_for(), run_once().
/// It never starts a thread. Handlers registered on it (serve, watch, resolve,
/// watch_completions, watch_fd) and coroutines spawned on it (task.hpp) run inside those
/// calls, one at a time. Any number of loops may exist in a process, each on its own
/// thread.
///
/// Re-entrancy: a handler may accept or reject requests, close or destroy its own
/// connection (or any other source), register and unregister handlers (its own
/// included: it is not called again), and stop the loop. It must not call run, run_for
/// or run_once (inval).
///
/// Lifetimes: destroying a watched source (Conn, Endpoint handle) unregisters what waits on
/// it, first (its fds leave the epoll set while still open); a coroutine awaiting it
/// resumes with an error. Destroying the loop destroys the coroutines it owns
/// (spawn) without resuming them, and leaves the registrations inactive. Either may go
/// first. A handler or coroutine of the loop may destroy the loop itself (e.g. the server
/// object that owns it): it goes once that handler returns, and the run call returns.
///
/// Exceptions escaping a handler or a spawned coroutine are caught, reported through the
/// log hook (LogLevel::error) and make the run call return errc::unknown whose reason
/// gives what(); the loop stays usable (run again to go on).
///
/// Thread safety: stop() and wake() may be called from any thread while the loop lives;
/// everything else (including the sources it watches) on the thread that runs it.
class EventLoop {
 public:
  /// Creates the loop's epoll set and eventfd.
  /// Errors: provider (epoll_create1, eventfd, epoll_ctl), nomem.
  static expected<EventLoop> create() noexcept;

  EventLoop(EventLoop&&) noexcept = default;
  /// Assigning over a loop destroys it first (see ~EventLoop).
  EventLoop& operator=(EventLoop&& other) noexcept;
  /// Destroys the coroutines the loop owns and leaves the registrations inactive. From one
  /// of the loop's own handlers or coroutines, the loop goes once that handler returns or
  /// that coroutine suspends: nothing else of the round runs, and the run call in progress
  /// returns (success, or the failure a handler left).
  ~EventLoop() { release_core(); }

  explicit operator bool() const noexcept { return core_ != nullptr; }

  // ---- running

  /// Runs until stop(). Before it returns because of stop(), every coroutine awaiting on
  /// the loop is resumed with an error (no_event, "the event loop was stopped"); handlers
  /// stay registered.
  /// A signal does not end it: epoll_wait's EINTR is retried (with the time left, for
  /// run_for and run_once).
  /// Errors: inval (empty loop; called from a handler); provider (epoll_wait); unknown (a
  /// handler or spawned coroutine threw: see the class comment).
  expected<void> run() noexcept;
  /// As run(), returning also when `duration` has passed (without cancelling anything).
  expected<void> run_for(std::chrono::milliseconds duration) noexcept;
  /// Waits up to `timeout` (negative: without limit; zero: not at all) for something to
  /// do, does what is ready, and returns how many handlers and coroutine steps ran. A
  /// pending stop() is handled as by run() (and returns 0).
  /// Errors: as run().
  expected<std::size_t> run_once(std::chrono::milliseconds timeout = std::chrono::milliseconds(-1)) noexcept;

  /// Makes run() / run_for() return (run_once: the next one) and cancels the awaiting
  /// coroutines, as described at run(). Thread-safe, async-signal-unsafe.
  void stop() noexcept;
  /// Makes a waiting run call look again (e.g. after another thread changed what a handler
  /// will see). Thread-safe.
  void wake() noexcept {
    if (core_) core_->wake();
  }

  // ---- handlers

  /// Calls `handler` for each connection request of `endpoint` (each exactly once, also
  /// when several loops serve handles of one shared listener), creating each request's
  /// queue pair from `config`. The handler decides: accept, reject, or keep the request.
  /// With an empty `handler`, the shared listener's own (Endpoint::listen_shared with a
  /// handler) is used.
  /// Errors: inval (empty loop or endpoint; bad config; no handler given and the listener has
  /// none; a handler given while the listener has its own, unless the same); provider
  /// (epoll_ctl); nomem.
  expected<Registration> serve(Endpoint& endpoint, ConnReqHandler handler = {},
                               const ConnConfig& config = {}) noexcept;

  /// Calls `handler` for each event of `conn` (as Conn::next_event reports them; an error
  /// reading the channel is passed on too). ConnEvent::lost found by a completion (a
  /// retry-exceeded status read by this loop or by Cq::get in a handler) comes from the
  /// loop after the dispatch that read it.
  /// Errors: inval (empty loop or Conn); provider (epoll_ctl: EEXIST if this loop already
  /// watches the Conn); nomem.
  expected<Registration> watch(Conn& conn, std::function<void(expected<ConnEvent> event)> handler) noexcept;

  /// Takes over `pending` and calls `handler` once, when its resolution is over, with the
  /// ready ConnReq or the error (as PendingConnReq::try_wait). Resolution is bounded by
  /// rdma_cm (ConnConfig::timeout per step). The registration ends after the call;
  /// destroying it earlier abandons the request (released).
  /// Errors: inval (empty loop or request; empty handler); provider (epoll_ctl); nomem.
  expected<Registration> resolve(PendingConnReq&& pending,
                                 std::function<void(expected<ConnReq> request)> handler) noexcept;

  /// Calls `handler` with the completions of `conn`'s queue `which`, in batches of up to 16
  /// (a span valid during the call), as they arrive. Check each completion's status
  /// (check(wc)). The queue is re-armed before it is polled and then polled empty, so no
  /// completion is missed: a drain cut short (256 completions per round, so that other
  /// sources get their turn; the handler throwing; ibv_poll_cq failing) goes on in the
  /// loop's next round without waiting for a new completion. Errors of the queue are
  /// passed on: ibv_poll_cq and ibv_req_notify_cq failing are retried in the next round
  /// (the handler gets each failure: unregister to give up); ibv_get_cq_event failing is
  /// passed on, and with EIO (the device is gone) it ends the registration. The completion
  /// channel's fd is made non-blocking. Do not also wait on the same queue elsewhere.
  /// Errors: inval (empty loop or Conn; a connection without completion channels, ConnConfig::
  /// completion_channel false; `receive` on a connection without its own receive
  /// channel); provider (fcntl, epoll_ctl: EEXIST when this loop already watches that
  /// channel); nomem.
  expected<Registration> watch_completions(
      Conn& conn, std::function<void(expected<std::span<const ibv_wc>> batch)> handler,
      CqKind which = CqKind::main) noexcept;

  /// Calls `handler` with the completions of `shared`'s queue as they arrive, as
  /// watch_completions on a Conn does (batches of up to 16, re-armed before polling, a drain
  /// cut short goes on in the next round, errors passed on, EIO ends it), each batch with
  /// its tags: conns[i] is the ConnId of the connection of batch[i] (Cq::get with `conns`;
  /// empty with an error). The registration holds the queue: the SharedCq handle may go.
  /// Watch one SharedCq from one loop, and do not also wait on it elsewhere (reading it with
  /// Cq::get in a handler is fine).
  /// Errors: inval (empty loop or SharedCq; empty handler; a queue without a completion
  /// channel, SharedCqConfig::completion_channel false); provider (fcntl, epoll_ctl: EEXIST
  /// when this loop already watches it); nomem.
  expected<Registration> watch_completions(
      const SharedCq& shared,
      std::function<void(expected<std::span<const ibv_wc>> batch, std::span<const ConnId> conns)> handler) noexcept;

  /// Calls `handler` with epoll's event bits whenever `fd` (the user's: a socket, a pipe,
  /// a timerfd...) is ready for `events` (EPOLLIN, EPOLLOUT...; level-triggered). Unregister
  /// (destroy the Registration) before closing the fd.
  /// Errors: inval (empty loop, negative fd, empty handler); provider (epoll_ctl: EBADF,
  /// EPERM for a regular file, EEXIST when this loop already watches the fd); nomem.
  expected<Registration> watch_fd(int fd, std::uint32_t events,
                                  std::function<void(std::uint32_t events)> handler) noexcept;

  // ---- coroutines: co_await these from a coroutine running on this loop (Task and spawn
  // in task.hpp, or any coroutine type resumed only by this loop's thread). Each resumes
  // the coroutine exactly once: with the result; with no_event when `timeout` passed
  // (negative: no limit) or the loop was stopped (run's stop(): "the event loop was
  // stopped"); with inval when the awaited object was destroyed or closed meanwhile. The
  // awaiter lives in the coroutine frame: an await allocates nothing. The awaited object
  // must outlive the co_await (destroying it is fine; moving it is not, except Endpoint).

  /// The next connection request of `endpoint` (as Endpoint::next_conn_req).
  detail::NextConnReqAwaiter next_conn_req(Endpoint& endpoint, const ConnConfig& config = {},
                                           std::chrono::milliseconds timeout = std::chrono::milliseconds(-1)) noexcept {
    return {core_.get(), endpoint, config, timeout};
  }
  /// The next event of `conn` (as Conn::next_event).
  detail::NextEventAwaiter next_event(Conn& conn, std::chrono::milliseconds timeout = std::chrono::milliseconds(-1)) noexcept {
    return {core_.get(), conn, timeout};
  }
  /// The outgoing request once resolved (as PendingConnReq::wait); the awaiter owns it.
  detail::ResolveAwaiter resolve(PendingConnReq&& pending,
                                 std::chrono::milliseconds timeout = std::chrono::milliseconds(-1)) noexcept {
    return {core_.get(), std::move(pending), timeout};
  }
  /// Resolves `addr`:`port`, connects with `private_data` and waits for ESTABLISHED: the
  /// connection, established. A rejection is provider ECONNREFUSED ("rdma_connect"),
  /// UNREACHABLE EHOSTUNREACH, another end ECONNRESET; errors as ConnReq::start and
  /// ConnReq::connect otherwise; private data longer than the Peer's transport allows
  /// (Peer::private_data_limits) is inval before anything is created. `addr`, `port` are
  /// read before the first suspension; `private_data` is copied.
  /// On iWARP rdma_connect blocks (siw makes the TCP connection inside it: up to TCP's SYN
  /// retries, 130 s, for an address nobody has), so it is made on a thread of its own
  /// (provider pthread_create or eventfd if that cannot be made) and the loop runs on. A
  /// call still in progress when the coroutine goes (a timeout, stop()) is kept by the
  /// loop until it returns; destroying the loop waits for it.
  detail::ConnectAwaiter connect(const Peer& peer, std::string_view addr, std::string_view port,
                                 const ConnConfig& config = {}, std::span<const std::byte> private_data = {},
                                 std::chrono::milliseconds timeout = std::chrono::milliseconds(-1)) noexcept {
    return {core_.get(), peer, addr, port, config, private_data, timeout};
  }
  /// The next completions of `conn`'s queue `which` into `out` (the filled part): at once
  /// if some are queued, else when the queue's completion channel fires (re-armed before
  /// polling: none is missed). With a shared completion channel, CqKind::main returns
  /// either queue's. Errors also: inval (empty `out`; a connection without completion
  /// channels, ConnConfig::completion_channel false, even with completions queued;
  /// CqKind::receive without a receive CQ); provider (fcntl, ibv_get_cq_event, ibv_req_notify_cq, ibv_poll_cq).
  detail::CompletionAwaiter completions(Conn& conn, std::span<ibv_wc> out, CqKind which = CqKind::main,
                                        std::chrono::milliseconds timeout = std::chrono::milliseconds(-1)) noexcept {
    return {core_.get(), conn, out, which == CqKind::receive, timeout};
  }
  /// The next completions of `shared`'s queue into `out` (the filled part), each tagged in
  /// `conns` (conns[i] for out[i], as Cq::get): at once if some are queued, else when its
  /// channel fires. The await holds the queue. Errors also: inval (empty SharedCq; empty
  /// `out`; `conns` shorter than `out`; a queue without a completion channel); provider
  /// (fcntl, ibv_get_cq_event, ibv_req_notify_cq, ibv_poll_cq).
  detail::SharedCompletionAwaiter completions(const SharedCq& shared, std::span<ibv_wc> out, std::span<ConnId> conns,
                                              std::chrono::milliseconds timeout = std::chrono::milliseconds(-1)) noexcept {
    return {core_.get(), shared.state(), out, conns, timeout};
  }
  /// Resumes after `duration` (success), or when the loop stops (no_event).
  detail::SleepAwaiter sleep_for(std::chrono::milliseconds duration) noexcept { return {core_.get(), duration}; }

  /// The loop's internals, for task.hpp.
  detail::LoopCore* core() const noexcept { return core_.get(); }

 private:
  explicit EventLoop(std::unique_ptr<detail::LoopCore> core) noexcept : core_(std::move(core)) {}



  expected<void> check_running(const char* call) const noexcept;

  // Destroys the core, or, inside one of its dispatches, leaves that to the run call.
  void release_core() noexcept;

  expected<void> run_until(const char* call, const detail::Deadline& deadline) noexcept;
  expected<void> run_rounds(const char* call, const detail::Deadline& deadline) noexcept;

  std::unique_ptr<detail::LoopCore> core_;
};

RPMAPP_END_NAMESPACE

#if !defined(RPMAPP_SEPARATE_COMPILATION)
#  include <rpmapp/impl/event_loop.ipp>
#endif
