// rpmapp::EventLoop: an epoll loop on the caller's thread that calls handlers for
// connection requests, connection events, outgoing requests, completions and plain fds
// (ib_cm's cm_handler, for user space), and drives coroutines (task.hpp).
#pragma once

#include <rpmapp/config.hpp>
#include <rpmapp/conn.hpp>
#include <rpmapp/conn_req.hpp>
#include <rpmapp/cq.hpp>
#include <rpmapp/detail/awaiters.hpp>
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

/// The sources' internals the loop works with.
struct LoopAccess {
  static ListenerState* listener(const Endpoint& e) noexcept { return e.state_.get(); }
  static SourceLink& link(Endpoint& e) noexcept { return e.watchers_; }
  static ConnectionCore* core(const Conn& c) noexcept { return c.core_.get(); }
  static ConnectionCore* core(const PendingConnReq& r) noexcept { return r.core_.get(); }
  static expected<ConnReq> take_request(ListenerState& listener, const ConnConfig& config) {
    auto core = accept_request("EventLoop::serve", listener, config, Wait::none());
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
        config_(config) {}

  bool attempt() noexcept {
    if (listener_ == nullptr) return finish(invalid(call(), "the endpoint is empty (moved from or shut down)"));
    if (auto ok = check_config(call(), config_); !ok) return finish(ok.error());
    auto request = no_throw(call(), [&] { return LoopAccess::take_request(*listener_, config_); });
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
  ConnConfig config_;
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
    if (channel() == nullptr)
      return finish(invalid(call(), "the connection has no receive completion queue of its own"));
    if (auto ok = completion_fds_nonblocking(*conn_); !ok) return finish(ok.error());
    if (poll_queues()) return true;
    // Empty: take the channel's pending event (if any), re-arm, and look again.
    const Provider& p = provider();
    ibv_cq* cq = nullptr;
    void* context = nullptr;
    errno = 0;
    if (p.get_cq_event(channel(), &cq, &context) != 0) {
      const int e = errno;
      if (is_empty_channel_errno(e) || e == EINTR) return false;
      return finish(provider_error("ibv_get_cq_event", e));
    }
    p.ack_cq_events(cq, 1);
    if (auto armed = rearm(cq); !armed) return finish(armed.error());
    return poll_queues();
  }
  expected<void> watch() noexcept { return watch_fd(channel()->fd, &conn_->watchers); }
  void fail_with(const Error& e) noexcept { result_ = fail(e); }
  expected<std::span<ibv_wc>> take() noexcept { return result_; }

 private:
  ibv_comp_channel* channel() const noexcept {
    if (!receive_) return conn_->comp_channel.get();
    return conn_->rcq ? conn_->receive_channel() : nullptr;
  }
  // Polls the watched queue(s): with a shared channel, the main CQ watches both.
  bool poll_queues() noexcept {
    ibv_cq* first = receive_ ? conn_->rcq.get() : conn_->cq.get();
    ibv_cq* second = !receive_ && conn_->config.shared_completion_channel ? conn_->rcq.get() : nullptr;
    for (ibv_cq* cq : {first, second}) {
      if (cq == nullptr) continue;
      const int n = provider().poll_cq(cq, static_cast<int>(out_.size()), out_.data());
      if (n < 0) return finish(provider_error("ibv_poll_cq", -n));
      if (n > 0) {
        result_ = out_.first(static_cast<std::size_t>(n));
        watch_path(&conn_->path, *result_);
        return true;
      }
    }
    return false;
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
/// first.
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
  EventLoop& operator=(EventLoop&&) noexcept = default;
  ~EventLoop() = default;

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
    if (core_->stop_requested.exchange(false)) {
      core_->cancel_awaiters();
      return std::size_t{0};
    }
    const detail::Deadline deadline(timeout.count() < 0 ? detail::Wait::forever() : detail::Wait::bounded(timeout));
    auto ran = core_->run_once(deadline);
    if (!ran) return ran;
    if (auto failed = take_failure(); !failed) return detail::fail(failed.error());
    return ran;
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
      auto w = std::make_unique<ServeWaiter>();
      w->listener = listener;
      w->config = config;
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

  /// Calls `handler` with the completions of `conn`'s queue `which`, in batches (a span
  /// valid during the call), as they arrive; an error (ibv_get_cq_event, ibv_req_notify_cq,
  /// ibv_poll_cq failing) is passed on. Check each completion's status (check(wc)). The
  /// queue is re-armed before it is polled, so no completion is missed; the completion
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
      w->channel = channel;
      w->path = &core->path;
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

  struct ServeWaiter final : detail::HandlerWaiter {
    detail::ListenerState* listener = nullptr;
    ConnConfig config;
    std::shared_ptr<ConnReqHandler> shared_handler;
    ConnReqHandler handler;
    bool active() const noexcept override { return slot != no_slot && link != nullptr; }
    void handle(std::uint32_t) override {
      for (int i = 0; i < per_round && !done(); ++i) {
        auto request = detail::LoopAccess::take_request(*listener, config);
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
      loop->remove(*this);
      if (link != nullptr) link->detach(*this);  // the ConnReq's now
      auto keep = std::move(handler);
      keep(std::move(request));
    }
  };

  struct CompletionWaiter final : detail::HandlerWaiter {
    ibv_comp_channel* channel = nullptr;
    detail::PathMonitor* path = nullptr;  // the connection's
    std::function<void(expected<std::span<const ibv_wc>>)> handler;
    bool active() const noexcept override { return slot != no_slot && link != nullptr; }
    void handle(std::uint32_t) override {
      const detail::Provider& p = detail::provider();
      ibv_cq* cq = nullptr;
      void* context = nullptr;
      errno = 0;
      if (p.get_cq_event(channel, &cq, &context) != 0) {
        const int e = errno;
        if (detail::is_empty_channel_errno(e) || e == EINTR) return;
        handler(detail::fail(detail::provider_error("ibv_get_cq_event", e)));
        return;
      }
      p.ack_cq_events(cq, 1);
      if (auto armed = detail::rearm(cq); !armed) {
        handler(detail::fail(armed.error()));
        if (done()) return;
      }
      ibv_wc wc[16];
      for (int round = 0; round < per_round && !done(); ++round) {
        const int n = p.poll_cq(cq, 16, wc);
        if (n == 0) return;
        if (n < 0) {
          handler(detail::fail(detail::provider_error("ibv_poll_cq", -n)));
          return;
        }
        const std::span<const ibv_wc> batch(wc, static_cast<std::size_t>(n));
        detail::watch_path(path, batch);
        handler(batch);
        if (n < 16) return;
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

  expected<void> take_failure() noexcept {
    if (!core_->failed) return {};
    core_->failed = false;
    return detail::fail(core_->failure);
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
    for (;;) {
      if (core_->stop_requested.exchange(false)) {
        core_->cancel_awaiters();
        return take_failure();
      }
      if (deadline.passed()) return take_failure();
      auto ran = core_->run_once(deadline);
      if (!ran) return detail::fail(ran.error());
      if (auto failed = take_failure(); !failed) return failed;
    }
  }

  std::unique_ptr<detail::LoopCore> core_;
};

RPMAPP_END_NAMESPACE
