// rpmapp::SharedEventChannel: one rdma_cm event channel (one fd) for many connections,
// their events routed to each by its cm_id.
#pragma once

#include <rpmapp/detail/errors.hpp>
#include <rpmapp/detail/event_routes.hpp>
#include <rpmapp/error.hpp>

#include <cstddef>
#include <memory>

RPMAPP_BEGIN_NAMESPACE

/// An rdma_cm event channel that the connections created with
/// ConnConfig::shared_event_channel pointing at it share, instead of each opening one of
/// its own: a server with thousands of connections then has one fd for all their events
/// instead of thousands (and no open, fcntl and close of /dev/infiniband/rdma_cm per
/// connection; an accepted request's id moves there with one rdma_migrate_id). Each event
/// read from the channel is routed by its cm_id to its connection, whose calls
/// (Conn::next_event, PendingConnReq::wait, ConnReq::to...) and event loop waiters
/// (EventLoop::watch, resolve, serve's requests, co_await next_event, connect) see exactly
/// its own events, as on a channel of its own. An event loop reads the channel once for
/// all the connections it waits on (one epoll entry per channel).
/// Move-only; the channel lives until the SharedEventChannel and every connection on it
/// are gone.
/// Thread safety: connections on the channel may be made, waited on and released on any
/// threads at once (one thread reads the channel at a time and routes what it reads for
/// the others). One event loop at a time drives it (EventLoop::watch on a connection of a
/// channel that another loop drives is inval); while one does, every connection on the
/// channel is that loop's: a wait on one of them elsewhere (Conn::next_event,
/// next_event_for, PendingConnReq::wait) is inval, and a look from another thread
/// (try_next_event, try_wait) is a data race, as it would read and route the loop's
/// connections' events from that thread.
class SharedEventChannel {
 public:
  /// Creates the channel (rdma_create_event_channel), non-blocking.
  /// Errors: provider (rdma_create_event_channel: EMFILE when out of fds, ENODEV without
  /// rdma_cm; fcntl); nomem.
  /// Thread safety: may be called concurrently.
  static expected<SharedEventChannel> create() noexcept;

  /// An empty SharedEventChannel, as a moved-from one (every call is inval).
  SharedEventChannel() noexcept = default;
  SharedEventChannel(SharedEventChannel&&) noexcept = default;
  /// Releases this handle as the destructor does, then takes `other`'s.
  SharedEventChannel& operator=(SharedEventChannel&& other) noexcept = default;
  /// Releases this handle; the channel is closed with the last connection on it.
  ~SharedEventChannel() = default;

  explicit operator bool() const noexcept { return state_ != nullptr; }

  /// The channel's fd, for poll/epoll: readable when an event of one of its connections
  /// is waiting to be read (call next_event on the connections, or let an EventLoop drive
  /// them). Errors: inval when empty.
  expected<int> fd() const noexcept;

  /// How many connections (and requests) are on the channel now. Errors: inval when empty.
  expected<std::size_t> connections() const noexcept;

  /// Releases this handle; the channel is closed now if no connection is on it, else with
  /// the last one. The SharedEventChannel is empty afterwards. Errors: inval when empty.
  expected<void> close() && noexcept;

  /// Internal: the shared state, for the connections on the channel.
  const std::shared_ptr<detail::EventRoutes>& state() const noexcept { return state_; }

 private:
  explicit SharedEventChannel(std::shared_ptr<detail::EventRoutes> state) noexcept : state_(std::move(state)) {}

  std::shared_ptr<detail::EventRoutes> state_;
};

RPMAPP_END_NAMESPACE

#if !defined(RPMAPP_SEPARATE_COMPILATION)
#  include <rpmapp/impl/shared_event_channel.ipp>
#endif
