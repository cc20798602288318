// rpmapp/detail/handler_waiters.hpp's definitions: the handler registrations' dispatch.
#pragma once

#include <rpmapp/detail/handler_waiters.hpp>
#include <rpmapp/detail/channel_queues.hpp>

RPMAPP_BEGIN_NAMESPACE
namespace detail {

RPMAPP_DECL void HandlerWaiter::ready(std::uint32_t events) {
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

RPMAPP_DECL void HandlerWaiter::release() noexcept {
  if (loop != nullptr) loop->remove(*this);
  if (link != nullptr) link->detach(*this);
  if (dispatching) orphaned = true;
  else delete this;
}

RPMAPP_DECL void ServeWaiter::handle(std::uint32_t) {
  for (int i = 0; i < per_round && !done(); ++i) {
    // Out of memory building the request is the handler's nomem, not "a handler threw".
    auto request = detail::no_throw("EventLoop::serve", [&] {
      return detail::LoopAccess::take_request("EventLoop::serve", *listener, config);
    });
    if (!request && request.error() == errc::no_event) return;  // another loop took it
    // A removed device's listener fails every take the same way: the handler hears it once.
    const bool removed = listener->removed;
    // The handler may release this registration: the waiter (and so the handler)
    // lives until the dispatch is over (HandlerWaiter::ready).
    if (shared_handler) (*shared_handler)(std::move(request));
    else handler(std::move(request));
    if (removed) return;
  }
}

RPMAPP_DECL void ConnWaiter::handle(std::uint32_t) {
  for (int i = 0; i < per_round && !done(); ++i) {
    // After DEVICE_REMOVAL (reported as lost) no event comes: the handler is not called again
    // with the error every later call gives.
    if (core->device_removed) return;
    auto event = detail::next_conn_event("EventLoop::watch", *core, detail::Deadline(detail::Wait::none()));
    if (!event && event.error() == errc::no_event) return;
    handler(std::move(event));
  }
}

RPMAPP_DECL void ResolveWaiter::handle(std::uint32_t) {
  auto request = std::move(pending).try_wait();
  if (!request && request.error() == errc::no_event && pending) return;  // in progress
  // A failed step released the request, whose watchers (this) have left the loop then.
  if (loop != nullptr) loop->remove(*this);
  if (link != nullptr) link->detach(*this);  // the ConnReq's now
  auto keep = std::move(handler);
  keep(detail::named("EventLoop::resolve", std::move(request)));
}

RPMAPP_DECL void CompletionWaiter::handle(std::uint32_t) {
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

}  // namespace detail
RPMAPP_END_NAMESPACE
