// The handler registrations of an EventLoop (serve, watch, resolve, watch_completions,
// watch_fd): one Waiter per registration, owned by its Registration.
#pragma once

#include <rpmapp/conn.hpp>
#include <rpmapp/conn_req.hpp>
#include <rpmapp/cq.hpp>
#include <rpmapp/detail/channel_queues.hpp>
#include <rpmapp/detail/loop_awaiters.hpp>
#include <rpmapp/detail/loop_core.hpp>
#include <rpmapp/endpoint.hpp>
#include <rpmapp/error.hpp>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <utility>

RPMAPP_BEGIN_NAMESPACE
namespace detail {

// Requests (or events) handled per wake-up of one source, so one busy source cannot starve
// the others (the fd stays readable: the rest come in the next round).
inline constexpr int per_round = 16;
// Completions per watch_completions batch.
inline constexpr std::size_t completion_batch = 16;

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
    keep(detail::named("EventLoop::resolve", std::move(request)));
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
    static constexpr const char* call = "EventLoop::watch_completions";
    detail::ChannelQueues queues(*core, receive);
    if (auto taken = queues.take_events(); !taken) {
      if (taken.error().sys_errno() == EIO) {
        if (loop != nullptr) loop->remove(*this);
        due.drained = true;
      }
      handler(detail::fail(taken.error().name_operation(call)));
      if (done()) return;
    }
    if (auto armed = queues.rearm(); !armed) {
      handler(detail::fail(armed.error().name_operation(call)));
      if (done()) return;
    }
    ibv_wc wc[completion_batch];
    for (int round = 0; round < per_round; ++round) {
      auto n = queues.poll(wc);
      if (!n) {
        handler(detail::fail(n.error().name_operation(call)));
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

}  // namespace detail
RPMAPP_END_NAMESPACE
