// One rdma_cm event channel shared by many connections (SharedEventChannel): each event
// read from it is routed by its cm_id to its connection's inbox, where the connection's
// own calls (Conn::next_event, PendingConnReq::wait...) and event loop waiters take it.
//
// Events wait in the inbox unacknowledged, as on a channel of the connection's own, and
// are acknowledged by whoever takes them. A connection leaving the channel (retire, before
// rdma_destroy_id) has its inbox acknowledged, so the destruction never waits for them;
// an event read for an id no longer routed is acknowledged and dropped. An inbox holds a
// fixed number of events: a connection has only a few in flight (resolution, established,
// disconnected, timewait exit, device removal), and routing must not allocate.
#pragma once

#include <rpmapp/detail/cm_event.hpp>
#include <rpmapp/detail/errors.hpp>
#include <rpmapp/detail/handles.hpp>
#include <rpmapp/detail/source_link.hpp>

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <mutex>

RPMAPP_BEGIN_NAMESPACE
namespace detail {

/// A connection's events read from a shared channel and not yet taken. Guarded by its
/// EventRoutes' mutex.
struct EventInbox {
  static constexpr std::size_t capacity = 8;
  rdma_cm_event* events[capacity] = {};
  std::uint8_t head = 0;
  std::uint8_t count = 0;
  /// The event loop waiter waiting for this inbox (one at most), told of each event.
  SourceWatcher* waiter = nullptr;
};

/// A shared event channel and its routes. The channel is destroyed with the last
/// reference (no connection is routed by then: each holds one).
struct EventRoutes {
  const Provider* seam = current_provider;  // the provider that made the channel
  EventChannel channel;
  mutable std::mutex mutex;
  /// Told when a reader of the channel stops reading (it may have routed an event).
  std::condition_variable reader_done;
  bool reading = false;  // a thread polls and reads the channel (the others wait)
  /// How many ids are routed. An id's route is its `context` (librdmacm leaves it to the
  /// application; rpmapp makes every id with none): its inbox while routed, else null. No
  /// table per connection, and routing reads no table.
  std::size_t routed = 0;
  /// The event loop that drives the channel (one at most), and its pump (a Waiter of that
  /// loop reading the channel for the connections its waiters wait on). Written on the
  /// loop's thread; `driven_by` is read by blocking waits on other threads (refused).
  std::atomic<void*> driven_by{nullptr};
  void* pump = nullptr;

  EventRoutes() = default;
  EventRoutes(const EventRoutes&) = delete;
  EventRoutes& operator=(const EventRoutes&) = delete;

  /// Routes `id`'s events to `inbox` from now on (sets id->context).
  void add(rdma_cm_id* id, EventInbox& inbox) noexcept;

  /// Stops routing `id`'s events (null: nothing) and acknowledges those in `inbox` (a
  /// failure goes to `first`). Call it before rdma_destroy_id.
  void retire(rdma_cm_id* id, EventInbox& inbox, FirstError& first) noexcept;

  /// The next event of `inbox`'s connection, waiting until `deadline`: taken from the
  /// inbox, or read from the channel (one thread reads at a time; the events it reads for
  /// other connections go to their inboxes, and their waiting threads are woken).
  /// Errors: no_event (nothing by the deadline), provider (poll, rdma_get_cm_event), inval
  /// (a wait, not a look, while an event loop drives the channel: reading it would wake the
  /// loop's waiters from this thread).
  /// `call` names the caller in the inval.
  expected<CmEvent> next(const char* call, EventInbox& inbox, const Deadline& deadline) noexcept;

  /// Reads up to `max` events without waiting and routes them (an event loop's pump);
  /// nothing when another thread is reading. A failed read is logged under `where` and
  /// returns false: the pump then tells every inbox's waiter (all its own) to look again,
  /// each reads the channel itself, and a failure it meets goes to its handler or
  /// coroutine, as on a channel of its own.
  bool pump_events(int max, const char* where) noexcept;

  /// How many connections' events are routed.
  std::size_t size() const noexcept;

 private:
  /// Routes `event` (read from the channel) to its inbox, or acknowledges and drops it.
  /// The mutex is held.
  void route(rdma_cm_event* event) noexcept;
};

}  // namespace detail
RPMAPP_END_NAMESPACE

#if !defined(RPMAPP_SEPARATE_COMPILATION)
#  include <rpmapp/impl/detail_event_routes.ipp>
#endif
