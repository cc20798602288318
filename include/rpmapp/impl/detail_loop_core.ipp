// rpmapp/detail/loop_core.hpp's definitions: the event loop's epoll set, deadlines, posted work and rounds.
#pragma once

#include <rpmapp/detail/loop_core.hpp>
#include <rpmapp/log.hpp>

#include <algorithm>
#include <new>
#include <utility>

RPMAPP_BEGIN_NAMESPACE
namespace detail {

RPMAPP_DECL Waiter::clock::time_point deadline_after(std::chrono::milliseconds timeout) noexcept {
  const auto now = Waiter::clock::now();
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(Waiter::clock::time_point::max() - now);
  return timeout >= left ? Waiter::clock::time_point::max() : now + timeout;
}

/// The loop's reader of a shared event channel: one epoll entry for the channel however
/// many connections on it the loop waits for. Owned by the loop; it goes with its last user.
struct EventPump final : Waiter {
  explicit EventPump(std::shared_ptr<EventRoutes> r) noexcept : routes(std::move(r)) {}
  std::shared_ptr<EventRoutes> routes;  // keeps the channel open while in the epoll set
  long users = 0;
  // Routing wakes the waiters of the inboxes it fills (posted: they run after this).
  // After a failed read every waiter of this channel looks again (a rare walk).
  void ready(std::uint32_t) noexcept override {
    if (!routes->pump_events(LoopCore::batch, "EventLoop (shared event channel)")) loop->signal_routed(this);
  }
};

RPMAPP_DECL void LoopCore::signal_routed(const Waiter* pump) noexcept {
  for (Waiter* w = routed; w != nullptr; w = w->routed_next)
    if (w->pump == pump) post_signal(*w);
}

RPMAPP_DECL void Waiter::events_routed() noexcept {
  if (loop != nullptr) loop->post_signal(*this);
}

RPMAPP_DECL expected<void> LoopCore::add_routed(const char* call, Waiter& w, const std::shared_ptr<EventRoutes>& routes,
                                                EventInbox& inbox) noexcept {
  if (void* by = routes->driven_by.load(); by != nullptr && by != this)
    return fail(invalid(call, "the connection's shared event channel is driven by another event loop"));
  auto* pump = static_cast<EventPump*>(routes->pump);
  if (pump == nullptr) {
    pump = new (std::nothrow) EventPump(routes);
    if (pump == nullptr) return fail(Error(errc::nomem, ENOMEM, "EventLoop", "memory allocation failed"));
    if (auto ok = add(*pump, routes->channel->fd, EPOLLIN); !ok) {
      delete pump;
      return ok;
    }
    routes->pump = pump;
    routes->driven_by = this;
  }
  {
    std::lock_guard lock(routes->mutex);
    if (inbox.waiter != nullptr) {
      if (pump->users == 0) {
        unwatch(*pump);
        routes->pump = nullptr;
        routes->driven_by = nullptr;
        delete pump;
      }
      return fail(provider_error("epoll_ctl", EEXIST, "the connection's events are already watched by this loop"));
    }
    inbox.waiter = &w;
    if (inbox.count > 0) post_signal(w);  // routed before the wait began
  }
  ++pump->users;
  w.inbox = &inbox;
  w.pump = pump;
  w.loop = this;
  w.routed_prev = nullptr;
  w.routed_next = routed;
  if (routed != nullptr) routed->routed_prev = &w;
  routed = &w;
  return {};
}

RPMAPP_DECL expected<void> LoopCore::open() noexcept {
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

RPMAPP_DECL LoopCore::~LoopCore() {
  while (owned != nullptr) {
    OwnedTask* t = owned;
    disown(*t);
    t->destroy_owned();
  }
  // First: their removal releases the pumps, which sit in the epoll set.
  while (Waiter* w = routed) {
    remove(*w);
    w->loop = nullptr;
    w->loop_gone();
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
  while (TimedWaiter* w = timers) {
    clear_deadline(*w);
    w->loop = nullptr;
    w->loop_gone();
  }
  orphans.clear();  // waits for their threads, which may still wake the loop
  const Provider& p = *seam;
  // The epoll fd first: the eventfd is in its set.
  if (epfd >= 0 && p.close(epfd) != 0) log(LogLevel::warning, "~EventLoop", provider_error("close", errno, "the loop's epoll fd"));
  if (wakefd >= 0 && p.close(wakefd) != 0) log(LogLevel::warning, "~EventLoop", provider_error("close", errno, "the loop's eventfd"));
}

RPMAPP_DECL expected<void> LoopCore::add(Waiter& w, int fd, std::uint32_t events) noexcept {
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
  slots[index].fd = fd;
  w.loop = this;
  w.slot = index;
  return {};
}

RPMAPP_DECL void LoopCore::remove(Waiter& w) noexcept {
  unwatch(w);
  clear_deadline(w);
  unpost(w);
  w.loop = nullptr;
}

RPMAPP_DECL void LoopCore::unwatch(Waiter& w) noexcept {
  if (w.inbox != nullptr) {
    auto* pump = static_cast<EventPump*>(w.pump);
    {
      std::lock_guard lock(pump->routes->mutex);
      w.inbox->waiter = nullptr;
    }
    w.inbox = nullptr;
    w.pump = nullptr;
    (w.routed_prev != nullptr ? w.routed_prev->routed_next : routed) = w.routed_next;
    if (w.routed_next != nullptr) w.routed_next->routed_prev = w.routed_prev;
    w.routed_prev = w.routed_next = nullptr;
    if (--pump->users == 0) {
      unwatch(*pump);
      pump->routes->pump = nullptr;
      pump->routes->driven_by = nullptr;
      delete pump;
    }
  }
  if (w.slot != Waiter::no_slot) {
    Slot& s = slots[w.slot];
    errno = 0;
    if (seam->epoll_ctl(epfd, EPOLL_CTL_DEL, s.fd, nullptr) != 0)
      log(LogLevel::warning, "EventLoop", provider_error("epoll_ctl", errno, "removing a watched fd"));
    s.waiter = nullptr;
    s.fd = -1;
    ++s.generation;
    free_slots.push_back(w.slot);  // reserved: never throws
    w.slot = Waiter::no_slot;
  }
}

RPMAPP_DECL void LoopCore::set_deadline(TimedWaiter& w, Waiter::clock::time_point when) noexcept {
  clear_deadline(w);
  w.loop = this;
  w.timed = true;
  w.deadline = when;
  w.timer_next = timers;
  if (timers != nullptr) timers->timer_prev = &w;
  timers = &w;
}

RPMAPP_DECL void LoopCore::clear_deadline(Waiter& waiter) noexcept {
  if (!waiter.timed) return;
  auto& w = static_cast<TimedWaiter&>(waiter);  // only set_deadline sets `timed`
  if (w.timer_prev != nullptr) w.timer_prev->timer_next = w.timer_next;
  else timers = w.timer_next;
  if (w.timer_next != nullptr) w.timer_next->timer_prev = w.timer_prev;
  w.timer_prev = w.timer_next = nullptr;
  w.timed = false;
}

RPMAPP_DECL void LoopCore::post(Waiter& w) noexcept {
  w.signalled = false;  // what the waiter posts itself for wins over a signal
  if (w.posted) return;
  append(w, posted_head, posted_tail);
}

RPMAPP_DECL void LoopCore::post_signal(Waiter& w) noexcept {
  if (w.posted) return;
  post(w);
  w.signalled = true;
}

RPMAPP_DECL void LoopCore::post_next_round(Waiter& w) noexcept {
  if (w.posted) return;
  append(w, next_head, next_tail);
  w.signalled = true;
}

RPMAPP_DECL void LoopCore::unpost(Waiter& w) noexcept {
  if (!w.posted) return;
  if (!unlink(w, posted_head, posted_tail)) unlink(w, next_head, next_tail);
  w.posted = false;
  w.signalled = false;
  w.post_next = nullptr;
}

RPMAPP_DECL void LoopCore::own(OwnedTask& t) noexcept {
  t.owned_prev = nullptr;
  t.owned_next = owned;
  if (owned != nullptr) owned->owned_prev = &t;
  owned = &t;
}

RPMAPP_DECL void LoopCore::disown(OwnedTask& t) noexcept {
  if (t.owned_prev != nullptr) t.owned_prev->owned_next = t.owned_next;
  else if (owned == &t) owned = t.owned_next;
  if (t.owned_next != nullptr) t.owned_next->owned_prev = t.owned_prev;
  t.owned_prev = t.owned_next = nullptr;
}

RPMAPP_DECL void LoopCore::note_exception(std::exception_ptr e) noexcept {
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

RPMAPP_DECL expected<std::size_t> LoopCore::run_once(const Deadline& deadline) noexcept {
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
  if (!orphans.empty()) reap_orphans();
  return ran;
}

RPMAPP_DECL void LoopCore::adopt(std::unique_ptr<Orphan> orphan) noexcept {
  Orphan& o = *orphan;
  try {
    orphans.push_back(std::move(orphan));
  } catch (const std::bad_alloc&) {
    return;  // `orphan` is destroyed on the way out: it waits for its thread
  }
  o.adopted_by(*this);
}

RPMAPP_DECL void LoopCore::reap_orphans() noexcept {
  std::erase_if(orphans, [](const std::unique_ptr<Orphan>& o) { return o->finished(); });
}

RPMAPP_DECL void LoopCore::cancel_awaiters() noexcept {
  stopping = true;
  for (std::size_t i = 0; i < slots.size(); ++i)
    if (Waiter* w = slots[i].waiter) w->loop_stopping();
  for (TimedWaiter* w = timers; w != nullptr;) {
    TimedWaiter* next = w->timer_next;
    w->loop_stopping();
    w = next;
  }
  run_posted();
  stopping = false;
}

RPMAPP_DECL expected<void> LoopCore::take_failure() noexcept {
  if (!failed) return {};
  failed = false;
  return fail(failure);
}

RPMAPP_DECL expected<void> LoopCore::destroy_doomed(LoopCore* core) noexcept {
  auto result = core->take_failure();
  delete core;
  return result;
}

RPMAPP_DECL void LoopCore::wake() noexcept {
  const std::uint64_t one = 1;
  // EAGAIN: the counter is full, so the loop is already due to wake.
  if (seam->write(wakefd, &one, sizeof one) < 0 && errno != EAGAIN)
    log(LogLevel::warning, "EventLoop::wake", provider_error("write", errno, "the loop's eventfd"));
}

RPMAPP_DECL Waiter::clock::time_point LoopCore::earliest() const noexcept {
  auto when = Waiter::clock::time_point::max();
  for (const TimedWaiter* w = timers; w != nullptr; w = w->timer_next) when = std::min(when, w->deadline);
  return when;
}

RPMAPP_DECL std::size_t LoopCore::expire() noexcept {
  if (timers == nullptr) return 0;
  const auto now = Waiter::clock::now();
  std::size_t ran = 0;
  for (TimedWaiter* w = timers; w != nullptr;) {
    TimedWaiter* next = w->timer_next;
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

RPMAPP_DECL std::size_t LoopCore::run_posted() noexcept {
  std::size_t ran = 0;
  while (Waiter* w = posted_head) {
    posted_head = w->post_next;
    if (posted_head == nullptr) posted_tail = nullptr;
    w->posted = false;
    w->post_next = nullptr;
    ++dispatch_depth;  // a coroutine resumed here is inside the loop too (no nested run)
    const bool signalled = w->signalled;
    w->signalled = false;
    if (signalled) {
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

RPMAPP_DECL void LoopCore::drain_wake() noexcept {
  std::uint64_t count = 0;
  if (seam->read(wakefd, &count, sizeof count) < 0 && errno != EAGAIN)
    log(LogLevel::warning, "EventLoop::run", provider_error("read", errno, "the loop's eventfd"));
}

RPMAPP_DECL void LoopCore::append(Waiter& w, Waiter*& head, Waiter*& tail) noexcept {
  w.loop = this;
  w.posted = true;
  w.post_next = nullptr;
  (tail != nullptr ? tail->post_next : head) = &w;
  tail = &w;
}

RPMAPP_DECL bool LoopCore::unlink(Waiter& w, Waiter*& head, Waiter*& tail) noexcept {
  Waiter* prev = nullptr;
  for (Waiter* at = head; at != nullptr; prev = at, at = at->post_next)
    if (at == &w) {
      (prev != nullptr ? prev->post_next : head) = w.post_next;
      if (tail == &w) tail = prev;
      return true;
    }
  return false;
}

RPMAPP_DECL expected<std::size_t>
run_round(LoopCore* core, const Deadline& deadline, bool& destroyed) noexcept {
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
