// rpmapp::EventLoop: an epoll loop on the caller's thread that calls handlers for
// connection requests, connection events, outgoing requests, completions and plain fds
// (ib_cm's cm_handler, for user space), and drives coroutines (task.hpp).
#pragma once

#include <rpmapp/config.hpp>
#include <rpmapp/conn.hpp>
#include <rpmapp/conn_req.hpp>
#include <rpmapp/cq.hpp>
#include <rpmapp/detail/awaiters.hpp>
#include <rpmapp/detail/channel_queues.hpp>
#include <rpmapp/detail/loop_core.hpp>
#include <rpmapp/endpoint.hpp>
#include <rpmapp/error.hpp>
#include <rpmapp/log.hpp>

#include <array>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <utility>

RPMAPP_BEGIN_NAMESPACE

class EventLoop;

namespace detail {

/// A ConnConfig kept for every later request of a listener (EventLoop::serve, co_await
/// next_conn_req): its Srq's queue held, not the pointer (the handle may move or go).
struct KeptConfig {
  explicit KeptConfig(const ConnConfig& cfg) noexcept : config(cfg), srq(srq_of(cfg)) { config.srq = nullptr; }
  ConnConfig config;
  std::shared_ptr<SrqState> srq;
};

/// The sources' internals the loop works with.
struct LoopAccess {
  static ListenerState* listener(const Endpoint& e) noexcept { return e.state_.get(); }
  static SourceLink& link(Endpoint& e) noexcept { return e.watchers_; }
  static ConnectionCore* core(const Conn& c) noexcept { return c.core_.get(); }
  static ConnectionCore* core(const PendingConnReq& r) noexcept { return r.core_.get(); }
  static expected<ConnReq> take_request(const char* call, ListenerState& listener, const KeptConfig& kept) {
    auto core = accept_request(call, listener, kept.config, kept.srq, Wait::none());
    if (!core) return fail(core.error());
    return ConnReq(std::move(*core), true);
  }
};


/// Makes a connection's completion channels non-blocking (once): a loop reads them only
/// after epoll said readable, but never blocks should another reader have taken the event.
/// A connection without channels (ConnConfig::completion_channel false) has none to change.
inline expected<void> completion_fds_nonblocking(ConnectionCore& core) noexcept {
  if (core.completion_fds_nonblocking) return {};
  for (ibv_comp_channel* channel : {core.comp_channel.get(), core.rcq_channel.get()}) {
    if (channel == nullptr) continue;
    const Provider& p = provider();
    errno = 0;
    const int flags = p.fcntl(channel->fd, F_GETFL, 0);
    if (flags < 0) return fail(provider_error("fcntl", errno, "F_GETFL on a completion channel"));
    errno = 0;
    if (!(flags & O_NONBLOCK) && p.fcntl(channel->fd, F_SETFL, flags | O_NONBLOCK) != 0)
      return fail(provider_error("fcntl", errno, "F_SETFL O_NONBLOCK on a completion channel"));
  }
  core.completion_fds_nonblocking = true;
  return {};
}

/// co_await loop.next_conn_req(endpoint): the next connection request.
class NextConnReqAwaiter final : public Awaiter<NextConnReqAwaiter, expected<ConnReq>> {
 public:
  NextConnReqAwaiter(LoopCore* core, Endpoint& endpoint, const ConnConfig& config,
                     std::chrono::milliseconds timeout) noexcept
      : Awaiter(core, "EventLoop::next_conn_req", timeout),
        listener_(LoopAccess::listener(endpoint)),
        source_(&LoopAccess::link(endpoint)),
        config_ok_(check_config(call(), config)),
        config_(config) {}

  bool attempt() noexcept {
    if (listener_ == nullptr) return finish(invalid(call(), "the endpoint is empty (moved from or shut down)"));
    if (!config_ok_) return finish(config_ok_.error());
    auto request = no_throw(call(), [&] { return LoopAccess::take_request(call(), *listener_, config_); });
    if (!request && request.error() == errc::no_event) return false;
    result_.emplace(std::move(request));
    return true;
  }
  expected<void> watch() noexcept { return watch_fd(listener_->channel->fd, source_); }
  void fail_with(const Error& e) noexcept { result_.emplace(fail(e)); }
  expected<ConnReq> take() noexcept { return std::move(*result_); }

 private:
  ListenerState* listener_;
  SourceLink* source_;  // the Endpoint handle's (moves with it)
  expected<void> config_ok_;
  KeptConfig config_;
  std::optional<expected<ConnReq>> result_;
};

/// co_await loop.next_event(conn): the connection's next event.
class NextEventAwaiter final : public Awaiter<NextEventAwaiter, expected<ConnEvent>> {
 public:
  NextEventAwaiter(LoopCore* core, Conn& conn, std::chrono::milliseconds timeout) noexcept
      : Awaiter(core, "EventLoop::next_event", timeout), conn_(LoopAccess::core(conn)) {}

  bool attempt() noexcept {
    if (conn_ == nullptr) return finish(invalid(call(), "the Conn is empty (moved from or closed)"));
    auto event = next_conn_event(call(), *conn_, Deadline(Wait::none()));
    if (!event && event.error() == errc::no_event) return false;
    result_ = event;
    return true;
  }
  expected<void> watch() noexcept { return watch_fd(conn_->channel->fd, &conn_->watchers); }
  void fail_with(const Error& e) noexcept { result_ = fail(e); }
  expected<ConnEvent> take() noexcept { return result_; }
  // The connection was found lost by its completions: no fd says so.
  void source_signalled() noexcept override {
    if (loop != nullptr) loop->post_signal(*this);
  }

 private:
  ConnectionCore* conn_;
  expected<ConnEvent> result_ = fail(Error());
};

/// co_await loop.resolve(std::move(pending)): the ready outgoing request.
class ResolveAwaiter final : public Awaiter<ResolveAwaiter, expected<ConnReq>> {
 public:
  ResolveAwaiter(LoopCore* core, PendingConnReq&& pending, std::chrono::milliseconds timeout) noexcept
      : Awaiter(core, "EventLoop::resolve", timeout), pending_(std::move(pending)) {}
  // Out of the epoll set before pending_ closes the fd it waits on.
  ~ResolveAwaiter() { detach(); }

  bool attempt() noexcept {
    if (!pending_) return finish(invalid(call(), "the request is empty (moved from or consumed)"));
    // A failed step releases the request's channel inside try_wait: out of epoll first.
    const bool watching = slot != no_slot;
    if (watching) core()->unwatch(*this);
    auto request = std::move(pending_).try_wait();
    if (!request && request.error() == errc::no_event && pending_) {
      if (watching)
        if (auto ok = watch(); !ok) return finish(ok.error());
      return false;
    }
    result_.emplace(std::move(request));
    return true;
  }
  expected<void> watch() noexcept { return watch_fd(LoopAccess::core(pending_)->channel->fd, nullptr); }
  void fail_with(const Error& e) noexcept { result_.emplace(fail(e)); }
  expected<ConnReq> take() noexcept { return std::move(*result_); }

 private:
  PendingConnReq pending_;
  std::optional<expected<ConnReq>> result_;
};

/// co_await loop.connect(peer, addr, port, ...): resolution, connect, and the wait for
/// ESTABLISHED, in one await.
class ConnectAwaiter final : public Awaiter<ConnectAwaiter, expected<Conn>> {
 public:
  ConnectAwaiter(LoopCore* core, const Peer& peer, std::string_view addr, std::string_view port,
                 const ConnConfig& config, std::span<const std::byte> private_data,
                 std::chrono::milliseconds timeout) noexcept
      : Awaiter(core, "EventLoop::connect", timeout), peer_(&peer), addr_(addr), port_(port), config_(config) {
    if (private_data.size() > max_connect_private_data) {
      too_long_ = private_data.size();
    } else {
      std::copy(private_data.begin(), private_data.end(), data_.begin());
      data_size_ = private_data.size();
    }
  }

  // Out of the epoll set before the request or connection it owns closes the fd.
  ~ConnectAwaiter() { detach(); }

  bool attempt() noexcept {
    if (stage_ == Stage::start) {
      if (too_long_ != 0)
        return finish(invalid(call(), "connect private data is {} bytes, more than the {} RDMA_PS_TCP allows",
                              too_long_, max_connect_private_data));
      auto pending = ConnReq::start(*peer_, addr_, port_, config_);
      if (!pending) return finish(pending.error());
      pending_.emplace(std::move(*pending));
      stage_ = Stage::resolving;
    }
    if (stage_ == Stage::resolving) {
      // A failed step releases the request's channel inside try_wait: out of epoll first.
      const bool watching = slot != no_slot;
      if (watching) core()->unwatch(*this);
      auto request = std::move(*pending_).try_wait();
      if (!request && request.error() == errc::no_event && *pending_) {
        if (watching)
          if (auto ok = watch(); !ok) return finish(ok.error());
        return false;
      }
      pending_.reset();
      if (!request) return finish(request.error());
      auto conn = std::move(*request).connect(std::span<const std::byte>(data_.data(), data_size_));
      if (!conn) return finish(conn.error());
      conn_.emplace(std::move(*conn));
      stage_ = Stage::establishing;
      // Waiting (not in await_ready): now on the connection's channel.
      if (watching)
        if (auto ok = watch(); !ok) return finish(ok.error());
    }
    auto event = next_conn_event(call(), *LoopAccess::core(*conn_), Deadline(Wait::none()));
    if (!event && event.error() == errc::no_event) return false;
    if (!event) return finish(event.error());
    switch (*event) {
      case ConnEvent::established: stage_ = Stage::done; return true;
      case ConnEvent::rejected: return finish(Error(errc::provider, ECONNREFUSED, "rdma_connect", "the peer rejected the request"));
      case ConnEvent::unreachable: return finish(Error(errc::provider, EHOSTUNREACH, "rdma_connect", "the peer is unreachable"));
      default:
        return finish(make_error(errc::provider, ECONNRESET, "rdma_connect", "the connection ended before it was established ({})",
                                 to_string(*event)));
    }
  }
  expected<void> watch() noexcept {
    if (stage_ == Stage::resolving) return watch_fd(LoopAccess::core(*pending_)->channel->fd, nullptr);
    return watch_fd(LoopAccess::core(*conn_)->channel->fd, nullptr);
  }
  void fail_with(const Error& e) noexcept {
    error_ = e;
    stage_ = Stage::failed;
  }
  expected<Conn> take() noexcept {
    if (stage_ != Stage::done) return fail(error_);
    return std::move(*conn_);
  }

 private:
  enum class Stage { start, resolving, establishing, done, failed };
  const Peer* peer_;
  std::string_view addr_;  // used in the first attempt only (await_ready, within the co_await)
  std::string_view port_;
  ConnConfig config_;
  std::array<std::byte, max_connect_private_data> data_{};
  std::size_t data_size_ = 0;
  std::size_t too_long_ = 0;
  Stage stage_ = Stage::start;
  std::optional<PendingConnReq> pending_;
  std::optional<Conn> conn_;
  Error error_;
};

/// co_await loop.completions(conn, out): the next completions of a connection's queue.
class CompletionAwaiter final : public Awaiter<CompletionAwaiter, expected<std::span<ibv_wc>>> {
 public:
  CompletionAwaiter(LoopCore* core, Conn& conn, std::span<ibv_wc> out, bool receive,
                    std::chrono::milliseconds timeout) noexcept
      : Awaiter(core, "EventLoop::completions", timeout), conn_(LoopAccess::core(conn)), out_(out), receive_(receive) {}

  bool attempt() noexcept {
    if (conn_ == nullptr) return finish(invalid(call(), "the Conn is empty (moved from or closed)"));
    if (out_.empty() || out_.size() > 0x7fffffffu)
      return finish(invalid(call(), "room for {} completions: give 1 to 2^31-1", out_.size()));
    if (!conn_->config.completion_channel) return finish(no_completion_channel(call()));
    if (receive_ && conn_->config.shared_completion_channel)
      return finish(invalid(call(), "CqKind::receive on a shared completion channel: both queues' "
                                    "completions come with CqKind::main"));
    ChannelQueues queues(*conn_, receive_);
    if (queues.channel() == nullptr)
      return finish(invalid(call(), "the connection has no receive completion queue of its own"));
    if (auto ok = completion_fds_nonblocking(*conn_); !ok) return finish(ok.error());
    // A queue an earlier await could not re-arm raises no event: re-arm it before waiting.
    if (auto armed = queues.rearm(); !armed) return finish(armed.error());
    if (polled(queues)) return true;
    // Empty: take the channel's pending events, re-arm, and look again.
    if (auto taken = queues.take_events(); !taken) return finish(taken.error());
    if (auto armed = queues.rearm(); !armed) return finish(armed.error());
    return polled(queues);
  }
  expected<void> watch() noexcept { return watch_fd(ChannelQueues(*conn_, receive_).channel()->fd, &conn_->watchers); }
  void fail_with(const Error& e) noexcept { result_ = fail(e); }
  expected<std::span<ibv_wc>> take() noexcept { return result_; }

 private:
  // True when it stored completions or an error.
  bool polled(ChannelQueues& queues) noexcept {
    auto n = queues.poll(out_);
    if (!n) return finish(n.error());
    if (*n == 0) return false;
    result_ = out_.first(*n);
    return true;
  }

  ConnectionCore* conn_;
  std::span<ibv_wc> out_;
  bool receive_;
  expected<std::span<ibv_wc>> result_ = fail(Error());
};

/// co_await loop.sleep_for(d): resumes after `d` (or with an error when the loop stops).
class SleepAwaiter final : public Awaiter<SleepAwaiter, expected<void>> {
 public:
  SleepAwaiter(LoopCore* core, std::chrono::milliseconds duration) noexcept
      : Awaiter(core, "EventLoop::sleep_for", duration < std::chrono::milliseconds(0) ? std::chrono::milliseconds(0) : duration) {}
  bool attempt() noexcept { return false; }
  expected<void> watch() noexcept { return {}; }
  void timed_out() noexcept override {
    result_ = {};
    cancel();
  }
  void fail_with(const Error& e) noexcept { result_ = fail(e); }
  expected<void> take() noexcept { return result_; }

 private:
  expected<void> result_;
};

/// A handler registration, owned by its Registration: deleted by it, or by the loop after
/// the dispatch in which its own handler released it.
struct HandlerWaiter : Waiter {
  bool dispatching = false;
  bool orphaned = false;

  virtual ~HandlerWaiter() = default;
  /// Calls the handler(s) for `events`; exceptions leave through here.
  virtual void handle(std::uint32_t events) = 0;

  /// Still able to call its handler: registered in a loop, its source alive.
  virtual bool active() const noexcept { return slot != no_slot; }

  void ready(std::uint32_t events) final {
    dispatching = true;
    struct Done {
      HandlerWaiter* w;
      ~Done() {
        w->dispatching = false;
        if (w->orphaned) delete w;
      }
    } done{this};
    handle(events);
  }
  /// The Registration lets go.
  void release() noexcept {
    if (loop != nullptr) loop->remove(*this);
    if (link != nullptr) link->detach(*this);
    if (dispatching) orphaned = true;
    else delete this;
  }
  /// Released by its own handler, or its source or loop is gone: stop handling.
  bool done() const noexcept { return orphaned || slot == no_slot; }
  void source_gone() noexcept override {
    if (loop != nullptr) loop->remove(*this);
  }
  void loop_gone() noexcept override { loop = nullptr; }
};

}  // namespace detail

/// A handler registration (EventLoop::serve, watch, resolve, watch_completions, watch_fd).
/// Destroying it, or reset(), unregisters the handler: it is not called again, also when
/// that happens inside the handler itself. A registration outlives its loop and its source
/// safely: it just becomes inactive.
/// Thread safety: on the loop's thread only.
class Registration {
 public:
  Registration() = default;
  Registration(Registration&& other) noexcept : waiter_(std::exchange(other.waiter_, nullptr)) {}
  Registration& operator=(Registration&& other) noexcept {
    if (this != &other) {
      reset();
      waiter_ = std::exchange(other.waiter_, nullptr);
    }
    return *this;
  }
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
  static expected<EventLoop> create() noexcept {
    return detail::no_throw("EventLoop::create", [&]() -> expected<EventLoop> {
      auto core = std::make_unique<detail::LoopCore>();
      if (auto ok = core->open(); !ok) return detail::fail(ok.error());
      return EventLoop(std::move(core));
    });
  }

  EventLoop(EventLoop&&) noexcept = default;
  /// Assigning over a loop destroys it first (see ~EventLoop).
  EventLoop& operator=(EventLoop&& other) noexcept {
    if (this != &other) {
      release_core();
      core_ = std::move(other.core_);
    }
    return *this;
  }
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
  expected<void> run() noexcept { return run_until("EventLoop::run", detail::Deadline(detail::Wait::forever())); }
  /// As run(), returning also when `duration` has passed (without cancelling anything).
  expected<void> run_for(std::chrono::milliseconds duration) noexcept {
    return run_until("EventLoop::run_for", detail::Deadline(detail::Wait::bounded(duration)));
  }
  /// Waits up to `timeout` (negative: without limit; zero: not at all) for something to
  /// do, does what is ready, and returns how many handlers and coroutine steps ran. A
  /// pending stop() is handled as by run() (and returns 0).
  /// Errors: as run().
  expected<std::size_t> run_once(std::chrono::milliseconds timeout = std::chrono::milliseconds(-1)) noexcept {
    constexpr const char* call = "EventLoop::run_once";
    if (auto ok = check_running(call); !ok) return detail::fail(ok.error());
    const detail::Deadline deadline(timeout.count() < 0 ? detail::Wait::forever() : detail::Wait::bounded(timeout));
    bool destroyed = false;  // by a handler: *this may be gone
    return detail::run_round(core_.get(), deadline, destroyed);
  }

  /// Makes run() / run_for() return (run_once: the next one) and cancels the awaiting
  /// coroutines, as described at run(). Thread-safe, async-signal-unsafe.
  void stop() noexcept {
    if (!core_) return;
    core_->stop_requested.store(true);
    core_->wake();
  }
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
                               const ConnConfig& config = {}) noexcept {
    constexpr const char* call = "EventLoop::serve";
    if (!core_) return detail::fail(detail::moved_from(call));
    if (!endpoint) return detail::fail(detail::invalid(call, "the endpoint is empty (moved from or shut down)"));
    if (auto ok = detail::check_config(call, config); !ok) return detail::fail(ok.error());
    detail::ListenerState* listener = detail::LoopAccess::listener(endpoint);
    auto own = std::static_pointer_cast<ConnReqHandler>(listener->handler);
    if (own && handler)
      return detail::fail(detail::invalid(call, "the shared listener has its own handler (listen_shared); pass none"));
    if (!own && !handler) return detail::fail(detail::invalid(call, "no handler: pass one"));
    return detail::no_throw(call, [&]() -> expected<Registration> {
      auto w = std::make_unique<ServeWaiter>(config);
      w->listener = listener;
      w->shared_handler = std::move(own);
      w->handler = std::move(handler);
      if (auto ok = core_->add(*w, listener->channel->fd, EPOLLIN); !ok) return detail::fail(ok.error());
      detail::LoopAccess::link(endpoint).attach(*w);
      return Registration(w.release());
    });
  }

  /// Calls `handler` for each event of `conn` (as Conn::next_event reports them; an error
  /// reading the channel is passed on too). ConnEvent::lost found by a completion (a
  /// retry-exceeded status read by this loop or by Cq::get in a handler) comes from the
  /// loop after the dispatch that read it.
  /// Errors: inval (empty loop or Conn); provider (epoll_ctl: EEXIST if this loop already
  /// watches the Conn); nomem.
  expected<Registration> watch(Conn& conn, std::function<void(expected<ConnEvent> event)> handler) noexcept {
    constexpr const char* call = "EventLoop::watch";
    if (!core_) return detail::fail(detail::moved_from(call));
    detail::ConnectionCore* core = detail::LoopAccess::core(conn);
    if (core == nullptr) return detail::fail(detail::invalid(call, "the Conn is empty (moved from or closed)"));
    if (!handler) return detail::fail(detail::invalid(call, "the handler is empty"));
    return detail::no_throw(call, [&]() -> expected<Registration> {
      auto w = std::make_unique<ConnWaiter>();
      w->core = core;
      w->handler = std::move(handler);
      if (auto ok = core_->add(*w, core->channel->fd, EPOLLIN); !ok) return detail::fail(ok.error());
      core->watchers.attach(*w);
      return Registration(w.release());
    });
  }

  /// Takes over `pending` and calls `handler` once, when its resolution is over, with the
  /// ready ConnReq or the error (as PendingConnReq::try_wait). Resolution is bounded by
  /// rdma_cm (ConnConfig::timeout per step). The registration ends after the call;
  /// destroying it earlier abandons the request (released).
  /// Errors: inval (empty loop or request; empty handler); provider (epoll_ctl); nomem.
  expected<Registration> resolve(PendingConnReq&& pending,
                                 std::function<void(expected<ConnReq> request)> handler) noexcept {
    constexpr const char* call = "EventLoop::resolve";
    if (!core_) return detail::fail(detail::moved_from(call));
    if (!pending) return detail::fail(detail::invalid(call, "the request is empty (moved from or consumed)"));
    if (!handler) return detail::fail(detail::invalid(call, "the handler is empty"));
    return detail::no_throw(call, [&]() -> expected<Registration> {
      auto w = std::make_unique<ResolveWaiter>(std::move(pending));
      w->handler = std::move(handler);
      const int fd = detail::LoopAccess::core(w->pending)->channel->fd;
      if (auto ok = core_->add(*w, fd, EPOLLIN); !ok) {
        pending = std::move(w->pending);  // loses nothing
        return detail::fail(ok.error());
      }
      // A failed step releases the request inside try_wait: its channel must leave the
      // epoll set before it is destroyed.
      detail::LoopAccess::core(w->pending)->watchers.attach(*w);
      return Registration(w.release());
    });
  }

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
      CqKind which = CqKind::main) noexcept {
    constexpr const char* call = "EventLoop::watch_completions";
    if (!core_) return detail::fail(detail::moved_from(call));
    detail::ConnectionCore* core = detail::LoopAccess::core(conn);
    if (core == nullptr) return detail::fail(detail::invalid(call, "the Conn is empty (moved from or closed)"));
    if (!handler) return detail::fail(detail::invalid(call, "the handler is empty"));
    if (!core->config.completion_channel) return detail::fail(detail::no_completion_channel(call));
    ibv_comp_channel* channel = which == CqKind::main ? core->comp_channel.get() : core->rcq_channel.get();
    if (channel == nullptr)
      return detail::fail(detail::invalid(call, "the connection has no receive completion channel of its own "
                                                "(rcq_size 0, or shared_completion_channel: watch CqKind::main)"));
    if (auto ok = nonblocking(channel->fd); !ok) return detail::fail(ok.error());
    return detail::no_throw(call, [&]() -> expected<Registration> {
      auto w = std::make_unique<CompletionWaiter>();
      w->core = core;
      w->receive = which == CqKind::receive;
      w->handler = std::move(handler);
      if (auto ok = core_->add(*w, channel->fd, EPOLLIN); !ok) return detail::fail(ok.error());
      core->watchers.attach(*w);
      return Registration(w.release());
    });
  }

  /// Calls `handler` with epoll's event bits whenever `fd` (the user's: a socket, a pipe,
  /// a timerfd...) is ready for `events` (EPOLLIN, EPOLLOUT...; level-triggered). Unregister
  /// (destroy the Registration) before closing the fd.
  /// Errors: inval (empty loop, negative fd, empty handler); provider (epoll_ctl: EBADF,
  /// EPERM for a regular file, EEXIST when this loop already watches the fd); nomem.
  expected<Registration> watch_fd(int fd, std::uint32_t events,
                                  std::function<void(std::uint32_t events)> handler) noexcept {
    constexpr const char* call = "EventLoop::watch_fd";
    if (!core_) return detail::fail(detail::moved_from(call));
    if (fd < 0) return detail::fail(detail::invalid(call, "fd {} is negative", fd));
    if (!handler) return detail::fail(detail::invalid(call, "the handler is empty"));
    return detail::no_throw(call, [&]() -> expected<Registration> {
      auto w = std::make_unique<FdWaiter>();
      w->handler = std::move(handler);
      if (auto ok = core_->add(*w, fd, events); !ok) return detail::fail(ok.error());
      return Registration(w.release());
    });
  }

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
  /// ConnReq::connect otherwise. `addr`, `port` are read before the first suspension;
  /// `private_data` is copied.
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
  /// Resumes after `duration` (success), or when the loop stops (no_event).
  detail::SleepAwaiter sleep_for(std::chrono::milliseconds duration) noexcept { return {core_.get(), duration}; }

  /// The loop's internals, for task.hpp.
  detail::LoopCore* core() const noexcept { return core_.get(); }

 private:
  explicit EventLoop(std::unique_ptr<detail::LoopCore> core) noexcept : core_(std::move(core)) {}

  // Requests handled per wake-up of one listener, so one busy source cannot starve the
  // others (the fd stays readable: the rest come in the next round).
  static constexpr int per_round = 16;
  // Completions per watch_completions batch.
  static constexpr std::size_t batch_size = 16;

  struct ServeWaiter final : detail::HandlerWaiter {
    explicit ServeWaiter(const ConnConfig& cfg) noexcept : config(cfg) {}
    detail::ListenerState* listener = nullptr;
    detail::KeptConfig config;
    std::shared_ptr<ConnReqHandler> shared_handler;
    ConnReqHandler handler;
    bool active() const noexcept override { return slot != no_slot && link != nullptr; }
    void handle(std::uint32_t) override {
      for (int i = 0; i < per_round && !done(); ++i) {
        // Out of memory building the request is the handler's nomem, not "a handler threw".
        auto request = detail::no_throw("EventLoop::serve", [&] {
          return detail::LoopAccess::take_request("EventLoop::serve", *listener, config);
        });
        if (!request && request.error() == errc::no_event) return;  // another loop took it
        // The handler may release this registration: the waiter (and so the handler)
        // lives until the dispatch is over (HandlerWaiter::ready).
        if (shared_handler) (*shared_handler)(std::move(request));
        else handler(std::move(request));
      }
    }
  };

  struct ConnWaiter final : detail::HandlerWaiter {
    detail::ConnectionCore* core = nullptr;
    std::function<void(expected<ConnEvent>)> handler;
    bool active() const noexcept override { return slot != no_slot && link != nullptr; }
    // The connection was found lost by its completions: no fd says so.
    void source_signalled() noexcept override {
      if (loop != nullptr) loop->post_signal(*this);
    }
    void handle(std::uint32_t) override {
      for (int i = 0; i < per_round && !done(); ++i) {
        auto event = detail::next_conn_event("EventLoop::watch", *core, detail::Deadline(detail::Wait::none()));
        if (!event && event.error() == errc::no_event) return;
        handler(std::move(event));
      }
    }
  };

  struct ResolveWaiter final : detail::HandlerWaiter {
    explicit ResolveWaiter(PendingConnReq&& p) noexcept : pending(std::move(p)) {}
    PendingConnReq pending;
    std::function<void(expected<ConnReq>)> handler;
    void handle(std::uint32_t) override {
      auto request = std::move(pending).try_wait();
      if (!request && request.error() == errc::no_event && pending) return;  // in progress
      // A failed step released the request, whose watchers (this) have left the loop then.
      if (loop != nullptr) loop->remove(*this);
      if (link != nullptr) link->detach(*this);  // the ConnReq's now
      auto keep = std::move(handler);
      keep(std::move(request));
    }
  };

  struct CompletionWaiter final : detail::HandlerWaiter {
    detail::ConnectionCore* core = nullptr;  // valid while active (its Conn tells it first)
    bool receive = false;
    std::function<void(expected<std::span<const ibv_wc>>)> handler;
    bool active() const noexcept override { return slot != no_slot && link != nullptr; }

    // Takes the channel's events, re-arms, and polls the queue(s) empty: the channel raises
    // no new event for what is already queued, so a drain cut short (the round's budget, the
    // handler throwing, ibv_poll_cq failing, a queue left unarmed) makes the waiter due
    // again in the next round without one (post_next_round). EIO from ibv_get_cq_event (the
    // device is gone: the channel delivers nothing more) ends the registration.
    void handle(std::uint32_t) override {
      struct DueAgain {
        CompletionWaiter* w;
        bool drained = false;
        ~DueAgain() {
          if (!drained && !w->done() && w->loop != nullptr) w->loop->post_next_round(*w);
        }
      } due{this};
      detail::ChannelQueues queues(*core, receive);
      if (auto taken = queues.take_events(); !taken) {
        if (taken.error().sys_errno() == EIO) {
          if (loop != nullptr) loop->remove(*this);
          due.drained = true;
        }
        handler(detail::fail(taken.error()));
        if (done()) return;
      }
      if (auto armed = queues.rearm(); !armed) {
        handler(detail::fail(armed.error()));
        if (done()) return;
      }
      ibv_wc wc[batch_size];
      for (int round = 0; round < per_round; ++round) {
        auto n = queues.poll(wc);
        if (!n) {
          handler(detail::fail(n.error()));
          return;
        }
        if (*n == 0) {
          due.drained = !queues.rearm_pending();
          return;
        }
        handler(std::span<const ibv_wc>(wc, *n));
        if (done()) return;
      }
    }
  };

  struct FdWaiter final : detail::HandlerWaiter {
    std::function<void(std::uint32_t)> handler;
    void handle(std::uint32_t events) override {
      handler(events);
    }
  };

  expected<void> check_running(const char* call) const noexcept {
    if (!core_) return detail::fail(detail::moved_from(call));
    if (core_->dispatch_depth > 0)
      return detail::fail(detail::invalid(call, "called from a handler or coroutine of this loop"));
    return {};
  }

  // Destroys the core, or, inside one of its dispatches, leaves that to the run call.
  void release_core() noexcept {
    if (core_ && core_->dispatch_depth > 0) {
      core_->doomed = true;
      (void)core_.release();
    }
    core_.reset();
  }

  expected<void> nonblocking(int fd) noexcept {
    const detail::Provider& p = detail::provider();
    errno = 0;
    const int flags = p.fcntl(fd, F_GETFL, 0);
    if (flags < 0) return detail::fail(detail::provider_error("fcntl", errno, "F_GETFL on the completion channel"));
    if (flags & O_NONBLOCK) return {};
    errno = 0;
    if (p.fcntl(fd, F_SETFL, flags | O_NONBLOCK) != 0)
      return detail::fail(detail::provider_error("fcntl", errno, "F_SETFL O_NONBLOCK on the completion channel"));
    return {};
  }

  expected<void> run_until(const char* call, const detail::Deadline& deadline) noexcept {
    if (auto ok = check_running(call); !ok) return ok;
    detail::LoopCore* core = core_.get();  // a handler may destroy *this: only `core` from here
    for (;;) {
      if (core->stop_requested.exchange(false)) {
        core->cancel_awaiters();
        if (core->doomed) return detail::LoopCore::destroy_doomed(core);
        return core->take_failure();
      }
      if (deadline.passed()) return core->take_failure();
      auto ran = core->run_once(deadline);
      if (core->doomed) return detail::LoopCore::destroy_doomed(core);
      if (!ran) return detail::fail(ran.error());
      if (auto failed = core->take_failure(); !failed) return failed;
    }
  }

  std::unique_ptr<detail::LoopCore> core_;
};

RPMAPP_END_NAMESPACE
