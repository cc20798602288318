// rpmapp/detail/event_routes.hpp's definitions: routing a shared channel's events.
#pragma once

#include <rpmapp/detail/device_context.hpp>
#include <rpmapp/detail/event_routes.hpp>

#include <cerrno>

RPMAPP_BEGIN_NAMESPACE
namespace detail {

RPMAPP_DECL void EventRoutes::add(rdma_cm_id* id, EventInbox& inbox) noexcept {
  std::lock_guard lock(mutex);  // a reader may be routing the channel's events
  id->context = &inbox;
  ++routed;
}

RPMAPP_DECL void EventRoutes::retire(rdma_cm_id* id, EventInbox& inbox, FirstError& first) noexcept {
  std::lock_guard lock(mutex);
  if (id != nullptr && id->context == &inbox) {
    id->context = nullptr;
    --routed;
  }
  for (; inbox.count > 0; --inbox.count) {
    rdma_cm_event* event = inbox.events[inbox.head];
    inbox.head = static_cast<std::uint8_t>((inbox.head + 1) % EventInbox::capacity);
    log_event(LogLevel::info, first.by.where, event->event, "not taken before the connection was released");
    errno = 0;
    first.errno_call(seam->ack_cm_event(event), "rdma_ack_cm_event");
  }
}

RPMAPP_DECL void EventRoutes::route(rdma_cm_event* event) noexcept {
  // every later call on the device's objects fails clearly (check_device), as next_cm_event
  if (event->event == RDMA_CM_EVENT_DEVICE_REMOVAL && event->id != nullptr)
    mark_device_removed(event->id->verbs);
  auto* inbox = event->id != nullptr ? static_cast<EventInbox*>(event->id->context) : nullptr;
  if (inbox == nullptr || inbox->count == EventInbox::capacity) [[unlikely]] {
    log_event(inbox == nullptr ? LogLevel::info : LogLevel::warning, "SharedEventChannel", event->event,
              inbox == nullptr ? "for a connection no longer on the channel: dropped"
                               : "the connection's inbox is full (its events are not being taken): dropped");
    errno = 0;
    log_errno_release({"SharedEventChannel", LogLevel::warning}, seam->ack_cm_event(event), "rdma_ack_cm_event");
    return;
  }
  inbox->events[(inbox->head + inbox->count) % EventInbox::capacity] = event;
  ++inbox->count;
  if (inbox->waiter != nullptr) inbox->waiter->events_routed();
}

RPMAPP_DECL expected<CmEvent> EventRoutes::next(const char* call, EventInbox& inbox, const Deadline& deadline) noexcept {
  const Provider& p = *seam;
  if (!deadline.immediate() && driven_by.load(std::memory_order_acquire) != nullptr)
    return fail(invalid(call, "the shared event channel is driven by an event loop: wait for "
                                             "its connections' events in that loop"));
  std::unique_lock lock(mutex);
  int empty_read = 0;
  for (;;) {
    if (inbox.count > 0) {
      rdma_cm_event* event = inbox.events[inbox.head];
      inbox.head = static_cast<std::uint8_t>((inbox.head + 1) % EventInbox::capacity);
      --inbox.count;
      return CmEvent(event, CmEventAcker{{&p}});
    }
    if (!reading) {
      reading = true;
      lock.unlock();
      CmReadFailure failed;
      rdma_cm_event* event = poll_cm_event(channel.get(), deadline, p, empty_read, failed);
      lock.lock();
      reading = false;
      reader_done.notify_all();
      if (event != nullptr) {
        route(event);
        continue;
      }
      if (inbox.count > 0) continue;
      if (failed.call != nullptr) return fail(provider_error(failed.call, failed.sys_errno));
      if (deadline.passed())
        return fail(Error(errc::no_event, empty_read, "rdma_get_cm_event",
                          empty_read != 0 ? "the channel has no event" : "no event in time"));
      continue;
    }
    // Another thread reads the channel: it routes this connection's events here.
    if (deadline.immediate() || deadline.passed())
      return fail(Error(errc::no_event, 0, "rdma_get_cm_event", "no event (another thread is reading the channel)"));
    if (deadline.forever()) reader_done.wait(lock);
    else reader_done.wait_until(lock, deadline.end());
  }
}

RPMAPP_DECL bool EventRoutes::pump_events(int max, const char* where) noexcept {
  const Provider& p = *seam;
  std::lock_guard lock(mutex);
  if (reading) return true;  // that reader routes them
  const Deadline now(Wait::none());
  for (int i = 0; i < max; ++i) {
    int empty_read = 0;
    CmReadFailure failed;
    rdma_cm_event* event = poll_cm_event(channel.get(), now, p, empty_read, failed);
    if (failed.call != nullptr) [[unlikely]] {
      log(LogLevel::warning, where, provider_error(failed.call, failed.sys_errno));
      return false;
    }
    if (event == nullptr) break;
    route(event);
  }
  return true;
}

RPMAPP_DECL std::size_t EventRoutes::size() const noexcept {
  std::lock_guard lock(mutex);
  return routed;
}

}  // namespace detail
RPMAPP_END_NAMESPACE
