// rpmapp/event_loop.hpp's definitions: Registration, and EventLoop's creation, running and handler registration.
#pragma once

#include <rpmapp/event_loop.hpp>

RPMAPP_BEGIN_NAMESPACE

RPMAPP_DECL Registration& Registration::operator=(Registration&& other) noexcept {
  if (this != &other) {
    reset();
    waiter_ = std::exchange(other.waiter_, nullptr);
  }
  return *this;
}

RPMAPP_DECL expected<EventLoop> EventLoop::create() noexcept {
  return detail::no_throw("EventLoop::create", [&]() -> expected<EventLoop> {
    auto core = std::make_unique<detail::LoopCore>();
    if (auto ok = core->open(); !ok) return detail::fail(ok.error());
    return EventLoop(std::move(core));
  });
}

RPMAPP_DECL EventLoop& EventLoop::operator=(EventLoop&& other) noexcept {
  if (this != &other) {
    release_core();
    core_ = std::move(other.core_);
  }
  return *this;
}

RPMAPP_DECL expected<std::size_t> EventLoop::run_once(std::chrono::milliseconds timeout) noexcept {
  constexpr const char* call = "EventLoop::run_once";
  if (auto ok = check_running(call); !ok) return detail::fail(ok.error());
  const detail::Deadline deadline(timeout.count() < 0 ? detail::Wait::forever() : detail::Wait::bounded(timeout));
  bool destroyed = false;  // by a handler: *this may be gone
  return detail::named(call, detail::run_round(core_.get(), deadline, destroyed));
}

RPMAPP_DECL void EventLoop::stop() noexcept {
  if (!core_) return;
  core_->stop_requested.store(true);
  core_->wake();
}

RPMAPP_DECL expected<Registration> EventLoop::serve(Endpoint& endpoint, ConnReqHandler handler,
                                                 const ConnConfig& config) noexcept {
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
    auto w = std::make_unique<detail::ServeWaiter>(config);
    w->listener = listener;
    w->shared_handler = std::move(own);
    w->handler = std::move(handler);
    if (auto ok = core_->add(*w, listener->channel->fd, EPOLLIN); !ok) return detail::fail(ok.error());
    detail::LoopAccess::link(endpoint).attach(*w);
    return Registration(w.release());
  });
}

RPMAPP_DECL expected<Registration> EventLoop::watch(
    Conn& conn, std::function<void(expected<ConnEvent> event)> handler) noexcept {
  constexpr const char* call = "EventLoop::watch";
  if (!core_) return detail::fail(detail::moved_from(call));
  detail::ConnectionCore* core = detail::LoopAccess::core(conn);
  if (core == nullptr) return detail::fail(detail::invalid(call, "the Conn is empty (moved from or closed)"));
  if (!handler) return detail::fail(detail::invalid(call, "the handler is empty"));
  return detail::no_throw(call, [&]() -> expected<Registration> {
    auto w = std::make_unique<detail::ConnWaiter>();
    w->core = core;
    w->handler = std::move(handler);
    if (auto ok = detail::watch_conn_events(call, *core_, *w, *core); !ok) return detail::fail(ok.error());
    core->watchers.attach(*w);
    return Registration(w.release());
  });
}

RPMAPP_DECL expected<Registration> EventLoop::resolve(PendingConnReq&& pending,
                                                   std::function<void(expected<ConnReq> request)> handler) noexcept {
  constexpr const char* call = "EventLoop::resolve";
  if (!core_) return detail::fail(detail::moved_from(call));
  if (!pending) return detail::fail(detail::invalid(call, "the request is empty (moved from or consumed)"));
  if (!handler) return detail::fail(detail::invalid(call, "the handler is empty"));
  return detail::no_throw(call, [&]() -> expected<Registration> {
    auto w = std::make_unique<detail::ResolveWaiter>(std::move(pending));
    w->handler = std::move(handler);
    if (auto ok = detail::watch_conn_events(call, *core_, *w, *detail::LoopAccess::core(w->pending)); !ok) {
      pending = std::move(w->pending);  // loses nothing
      return detail::fail(ok.error());
    }
    // A failed step releases the request inside try_wait: its channel must leave the
    // epoll set before it is destroyed.
    detail::LoopAccess::core(w->pending)->watchers.attach(*w);
    return Registration(w.release());
  });
}

RPMAPP_DECL expected<Registration> EventLoop::watch_completions(
    Conn& conn, std::function<void(expected<std::span<const ibv_wc>> batch)> handler, CqKind which) noexcept {
  constexpr const char* call = "EventLoop::watch_completions";
  if (!core_) return detail::fail(detail::moved_from(call));
  detail::ConnectionCore* core = detail::LoopAccess::core(conn);
  if (core == nullptr) return detail::fail(detail::invalid(call, "the Conn is empty (moved from or closed)"));
  if (!handler) return detail::fail(detail::invalid(call, "the handler is empty"));
  if (core->shared_cq) return detail::fail(detail::on_shared_cq(call));
  if (!core->config.completion_channel) return detail::fail(detail::no_completion_channel(call));
  ibv_comp_channel* channel = which == CqKind::main ? core->comp_channel.get() : core->rcq_channel.get();
  if (channel == nullptr)
    return detail::fail(detail::invalid(call, "the connection has no receive completion channel of its own "
                                              "(rcq_size 0, or shared_completion_channel: watch CqKind::main)"));
  if (auto ok = detail::completion_fds_nonblocking(*core); !ok) return detail::fail(ok.error().name_operation(call));
  return detail::no_throw(call, [&]() -> expected<Registration> {
    auto w = std::make_unique<detail::CompletionWaiter>();
    w->core = core;
    w->receive = which == CqKind::receive;
    w->handler = std::move(handler);
    if (auto ok = core_->add(*w, channel->fd, EPOLLIN); !ok) return detail::fail(ok.error());
    core->watchers.attach(*w);
    return Registration(w.release());
  });
}

RPMAPP_DECL expected<Registration> EventLoop::watch_completions(
    const SharedCq& shared,
    std::function<void(expected<std::span<const ibv_wc>>, std::span<const ConnId>)> handler) noexcept {
  constexpr const char* call = "EventLoop::watch_completions";
  if (!core_) return detail::fail(detail::moved_from(call));
  if (!shared) return detail::fail(detail::invalid(call, "the SharedCq is empty (moved from or closed)"));
  if (!handler) return detail::fail(detail::invalid(call, "the handler is empty"));
  detail::SharedCqState& state = *shared.state();
  if (!state.channel)
    return detail::fail(detail::invalid(call, "the SharedCq has no completion channel "
                                              "(SharedCqConfig::completion_channel is false): poll it with Cq::get"));
  if (auto ok = detail::completion_fd_nonblocking(state); !ok) return detail::fail(ok.error().name_operation(call));
  return detail::no_throw(call, [&]() -> expected<Registration> {
    auto w = std::make_unique<detail::SharedCompletionWaiter>();
    w->shared = shared.state();
    w->handler = std::move(handler);
    if (auto ok = core_->add(*w, state.channel->fd, EPOLLIN); !ok) return detail::fail(ok.error());
    return Registration(w.release());
  });
}

RPMAPP_DECL expected<Registration> EventLoop::watch_fd(int fd, std::uint32_t events,
                                                    std::function<void(std::uint32_t events)> handler) noexcept {
  constexpr const char* call = "EventLoop::watch_fd";
  if (!core_) return detail::fail(detail::moved_from(call));
  if (fd < 0) return detail::fail(detail::invalid(call, "fd {} is negative", fd));
  if (!handler) return detail::fail(detail::invalid(call, "the handler is empty"));
  return detail::no_throw(call, [&]() -> expected<Registration> {
    auto w = std::make_unique<detail::FdWaiter>();
    w->handler = std::move(handler);
    if (auto ok = core_->add(*w, fd, events); !ok) return detail::fail(ok.error());
    return Registration(w.release());
  });
}

RPMAPP_DECL expected<void> EventLoop::check_running(const char* call) const noexcept {
  if (!core_) return detail::fail(detail::moved_from(call));
  if (core_->dispatch_depth > 0)
    return detail::fail(detail::invalid(call, "called from a handler or coroutine of this loop"));
  return {};
}

RPMAPP_DECL void EventLoop::release_core() noexcept {
  if (core_ && core_->dispatch_depth > 0) {
    core_->doomed = true;
    (void)core_.release();
  }
  core_.reset();
}

RPMAPP_DECL expected<void> EventLoop::run_rounds(const char* call,
                                                 const detail::Deadline& deadline) noexcept {
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

RPMAPP_DECL expected<void> EventLoop::run() noexcept {
  return run_until("EventLoop::run", detail::Deadline(detail::Wait::forever()));
}

RPMAPP_DECL expected<void> EventLoop::run_for(std::chrono::milliseconds duration) noexcept {
  return run_until("EventLoop::run_for", detail::Deadline(detail::Wait::bounded(duration)));
}

RPMAPP_DECL expected<void> EventLoop::run_until(const char* call,
                                                const detail::Deadline& deadline) noexcept {
  return detail::named(call, run_rounds(call, deadline));
}

RPMAPP_END_NAMESPACE
