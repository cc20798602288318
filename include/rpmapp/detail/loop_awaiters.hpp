// What a coroutine co_awaits on an EventLoop, one class per awaitable (next_conn_req,
// next_event, resolve, connect, completions, sleep_for), on the common part in awaiters.hpp;
// and the sources' internals the loop works with (LoopAccess).
#pragma once

#include <rpmapp/config.hpp>
#include <rpmapp/conn.hpp>
#include <rpmapp/conn_req.hpp>
#include <rpmapp/cq.hpp>
#include <rpmapp/detail/awaiters.hpp>
#include <rpmapp/detail/background_connect.hpp>
#include <rpmapp/detail/channel_queues.hpp>
#include <rpmapp/detail/loop_core.hpp>
#include <rpmapp/endpoint.hpp>
#include <rpmapp/error.hpp>
#include <rpmapp/shared_cq.hpp>

#include <array>
#include <chrono>
#include <cstddef>
#include <memory>
#include <optional>
#include <span>
#include <string_view>
#include <utility>

RPMAPP_BEGIN_NAMESPACE
namespace detail {

/// A ConnConfig kept for every later request of a listener (EventLoop::serve, co_await
/// next_conn_req): its Srq's, SharedCq's and SharedEventChannel's state held, not the pointers (the handles
/// may move or go).
struct KeptConfig {
  explicit KeptConfig(const ConnConfig& cfg) noexcept : config(cfg), shared(shared_queues_of(cfg)) {
    config.srq = nullptr;
    config.shared_cq = nullptr;
    config.shared_event_channel = nullptr;
  }
  ConnConfig config;
  SharedQueues shared;
};

/// The sources' internals the loop works with.
struct LoopAccess {
  static ListenerState* listener(const Endpoint& e) noexcept { return e.state_.get(); }
  static SourceLink& link(Endpoint& e) noexcept { return e.watchers_; }
  static ConnectionCore* core(const Conn& c) noexcept { return c.core_.get(); }
  static ConnectionCore* core(const PendingConnReq& r) noexcept { return r.core_.get(); }
  static ConnectionCore* core(const ConnReq& r) noexcept { return r.core_.get(); }
  static expected<ConnReq> take_request(const char* call, ListenerState& listener, const KeptConfig& kept);
  static constexpr const char* connect_call = ConnReq::connect_call;
  static expected<std::unique_ptr<ConnectionCore>> take_for_connect(ConnReq&& r,
                                                                    std::span<const std::byte> data) noexcept {
    return std::move(r).take_for_connect(connect_call, data);
  }
  static Conn conn(std::unique_ptr<ConnectionCore> core) noexcept { return Conn(std::move(core)); }
};

/// Makes `w` wait in `loop` for the events of `core`'s id: its own channel's fd, or its
/// inbox on a shared event channel. Errors: as LoopCore::add and add_routed.
inline expected<void> watch_conn_events(const char* call, LoopCore& loop, Waiter& w, ConnectionCore& core) noexcept {
  if (core.events) return loop.add_routed(call, w, core.events, core.inbox);
  return loop.add(w, core.channel->fd, EPOLLIN);
}

/// Makes a connection's completion channels non-blocking (once): a loop reads them only
/// after epoll said readable, but never blocks should another reader have taken the event.
/// A connection without channels (ConnConfig::completion_channel false) has none to change.
inline expected<void> channel_nonblocking(ibv_comp_channel* channel) noexcept {
  const Provider& p = provider();
  errno = 0;
  const int flags = p.fcntl(channel->fd, F_GETFL, 0);
  if (flags < 0) return fail(provider_error("fcntl", errno, "F_GETFL on a completion channel"));
  errno = 0;
  if (!(flags & O_NONBLOCK) && p.fcntl(channel->fd, F_SETFL, flags | O_NONBLOCK) != 0)
    return fail(provider_error("fcntl", errno, "F_SETFL O_NONBLOCK on a completion channel"));
  return {};
}
inline expected<void> completion_fds_nonblocking(ConnectionCore& core) noexcept {
  if (core.completion_fds_nonblocking) return {};
  for (ibv_comp_channel* channel : {core.comp_channel.get(), core.rcq_channel.get()})
    if (channel != nullptr)
      if (auto ok = channel_nonblocking(channel); !ok) return ok;
  core.completion_fds_nonblocking = true;
  return {};
}
/// The same for a SharedCq's channel (it has one: the caller checked).
inline expected<void> completion_fd_nonblocking(SharedCqState& shared) noexcept {
  if (shared.fd_nonblocking) return {};
  if (auto ok = channel_nonblocking(shared.channel.get()); !ok) return ok;
  shared.fd_nonblocking = true;
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

  bool attempt() noexcept;
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

  bool attempt() noexcept;
  expected<void> watch() noexcept {
    if (auto ok = watch_conn_events(call(), *core(), *this, *conn_); !ok) return ok;
    conn_->watchers.attach(*this);
    return {};
  }
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

  bool attempt() noexcept;
  expected<void> watch() noexcept { return watch_conn_events(call(), *core(), *this, *LoopAccess::core(pending_)); }
  void fail_with(const Error& e) noexcept { result_.emplace(fail(e)); }
  expected<ConnReq> take() noexcept { return std::move(*result_); }

 private:
  PendingConnReq pending_;
  std::optional<expected<ConnReq>> result_;
};

/// co_await loop.connect(peer, addr, port, ...): resolution, connect, and the wait for
/// ESTABLISHED, in one await. On iWARP rdma_connect blocks (siw's TCP connect): it is made
/// on a thread of its own (BackgroundConnect) while the loop runs on.
class ConnectAwaiter final : public Awaiter<ConnectAwaiter, expected<Conn>> {
 public:
  ConnectAwaiter(LoopCore* core, const Peer& peer, std::string_view addr, std::string_view port,
                 const ConnConfig& config, std::span<const std::byte> private_data,
                 std::chrono::milliseconds timeout) noexcept;

  // Out of the epoll set before the request or connection it owns closes the fd; an
  // rdma_connect still in progress is left to the loop (or waited for, without one).
  ~ConnectAwaiter() {
    detach();
    if (background_ && !background_->finished() && core() != nullptr) core()->adopt(std::move(background_));
  }

  bool attempt() noexcept;
  expected<void> watch() noexcept {
    if (stage_ == Stage::resolving) return watch_conn_events(call(), *core(), *this, *LoopAccess::core(*pending_));
    if (stage_ == Stage::connecting) return watch_fd(background_->fd(), nullptr);
    return watch_conn_events(call(), *core(), *this, *LoopAccess::core(*conn_));
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
  // The connection, once rdma_connect returned: waits for ESTABLISHED from here.
  bool connected(expected<Conn> conn, bool watching) noexcept;
  // The connection's next event: true once it is ESTABLISHED or failed.
  bool established() noexcept;

  enum class Stage { start, resolving, connecting, establishing, done, failed };
  const Peer* peer_;
  std::string_view addr_;  // used in the first attempt only (await_ready, within the co_await)
  std::string_view port_;
  ConnConfig config_;
  static_assert(max_iwarp_private_data >= max_connect_private_data);
  std::array<std::byte, max_iwarp_private_data> data_{};  // the largest of any transport
  std::size_t data_size_ = 0;
  std::optional<Error> refused_;  // the private data is longer than the Peer's transport allows
  Stage stage_ = Stage::start;
  std::optional<PendingConnReq> pending_;
  std::unique_ptr<BackgroundConnect> background_;  // connecting: iWARP's rdma_connect
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
    if (conn_->shared_cq) return finish(on_shared_cq(call()));
    if (!conn_->config.completion_channel) return finish(no_completion_channel(call()));
    if (receive_ && conn_->config.shared_completion_channel)
      return finish(invalid(call(), "CqKind::receive on a shared completion channel: both queues' "
                                    "completions come with CqKind::main"));
    ChannelQueues queues(*conn_, receive_);
    if (queues.channel() == nullptr)
      return finish(invalid(call(), "the connection has no receive completion queue of its own"));
    if (auto ok = completion_fds_nonblocking(*conn_); !ok) return finish(ok.error());
    if (polled(queues)) return true;
    // Empty: take the channel's pending events, re-arm their queues (and any an earlier
    // await could not re-arm: it raises no event until then), and look again.
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

/// co_await loop.completions(shared, out, conns): the next completions of a SharedCq, tagged.
/// Holds the queue while it waits (the SharedCq handle may go).
class SharedCompletionAwaiter final : public Awaiter<SharedCompletionAwaiter, expected<std::span<ibv_wc>>> {
 public:
  SharedCompletionAwaiter(LoopCore* core, std::shared_ptr<SharedCqState> shared, std::span<ibv_wc> out,
                          std::span<ConnId> conns, std::chrono::milliseconds timeout) noexcept
      : Awaiter(core, "EventLoop::completions", timeout), shared_(std::move(shared)), out_(out), conns_(conns) {}

  bool attempt() noexcept {
    if (!shared_) return finish(invalid(call(), "the SharedCq is empty (moved from or closed)"));
    if (out_.empty() || out_.size() > 0x7fffffffu || conns_.size() < out_.size())
      return finish(invalid(call(), "room for {} completions and {} tags: give 1 to 2^31-1, and a tag for each",
                            out_.size(), conns_.size()));
    if (!shared_->channel)
      return finish(invalid(call(), "the SharedCq has no completion channel (SharedCqConfig::completion_channel "
                                    "is false): poll it with Cq::get"));
    if (auto ok = completion_fd_nonblocking(*shared_); !ok) return finish(ok.error());
    ChannelQueues queues(*shared_);
    if (polled(queues)) return true;
    if (auto taken = queues.take_events(); !taken) return finish(taken.error());
    if (auto armed = queues.rearm(); !armed) return finish(armed.error());
    return polled(queues);
  }
  expected<void> watch() noexcept { return watch_fd(shared_->channel->fd, nullptr); }
  void fail_with(const Error& e) noexcept { result_ = fail(e); }
  expected<std::span<ibv_wc>> take() noexcept { return result_; }

 private:
  bool polled(ChannelQueues& queues) noexcept {
    auto n = queues.poll(out_, conns_.data());
    if (!n) return finish(n.error());
    if (*n == 0) return false;
    result_ = out_.first(*n);
    return true;
  }

  std::shared_ptr<SharedCqState> shared_;
  std::span<ibv_wc> out_;
  std::span<ConnId> conns_;
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

}  // namespace detail
RPMAPP_END_NAMESPACE

#if !defined(RPMAPP_SEPARATE_COMPILATION)
#  include <rpmapp/impl/detail_loop_awaiters.ipp>
#endif
