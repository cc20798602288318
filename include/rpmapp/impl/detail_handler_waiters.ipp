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

/// One round of a completion channel for a handler (watch_completions): takes the
/// channel's events, re-arms, and polls the queue(s) empty, giving each batch to
/// `deliver(count)` and each failure to `report(error)`. The channel raises no new event for
/// what is already queued, so a drain cut short (the round's budget, the handler throwing,
/// ibv_poll_cq failing, a queue left unarmed) makes the waiter due again in the next round
/// without one (post_next_round). EIO from ibv_get_cq_event (the device is gone: the
/// channel delivers nothing more) ends the registration.
template <class Deliver, class Report>
void completion_round(HandlerWaiter& w, ChannelQueues& queues, std::span<ibv_wc> wc, ConnId* conns,
                      Deliver&& deliver, Report&& report) {
  struct DueAgain {
    HandlerWaiter* w;
    bool drained = false;
    ~DueAgain() {
      if (!drained && !w->done() && w->loop != nullptr) w->loop->post_next_round(*w);
    }
  } due{&w};
  static constexpr const char* call = "EventLoop::watch_completions";
  if (auto taken = queues.take_events(); !taken) {
    if (taken.error().sys_errno() == EIO) {
      if (w.loop != nullptr) w.loop->remove(w);
      due.drained = true;
    }
    report(taken.error().name_operation(call));
    if (w.done()) return;
  }
  if (auto armed = queues.rearm(); !armed) {
    report(armed.error().name_operation(call));
    if (w.done()) return;
  }
  for (int round = 0; round < per_round; ++round) {
    auto n = queues.poll(wc, conns);
    if (!n) {
      report(n.error().name_operation(call));
      return;
    }
    if (*n == 0) {
      due.drained = !queues.rearm_pending();
      return;
    }
    deliver(*n);
    if (w.done()) return;
  }
}

RPMAPP_DECL void CompletionWaiter::handle(std::uint32_t) {
  detail::ChannelQueues queues(*core, receive);
  ibv_wc wc[completion_batch];
  completion_round(
      *this, queues, wc, nullptr, [&](std::size_t n) { handler(std::span<const ibv_wc>(wc, n)); },
      [&](const Error& e) { handler(detail::fail(e)); });
}

RPMAPP_DECL void SharedCompletionWaiter::handle(std::uint32_t) {
  detail::ChannelQueues queues(*shared);
  ibv_wc wc[completion_batch];
  ConnId conns[completion_batch];
  completion_round(
      *this, queues, wc, conns,
      [&](std::size_t n) { handler(std::span<const ibv_wc>(wc, n), std::span<const ConnId>(conns, n)); },
      [&](const Error& e) { handler(detail::fail(e), {}); });
}

}  // namespace detail
RPMAPP_END_NAMESPACE
