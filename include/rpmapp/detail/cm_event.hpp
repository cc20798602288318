// Taking the next event from an rdma_cm event channel: blocking, non-blocking or bounded.
#pragma once

#include <rpmapp/detail/errors.hpp>
#include <rpmapp/detail/handles.hpp>

#include <chrono>

RPMAPP_BEGIN_NAMESPACE
namespace detail {

/// How long a call waits for an event: forever (-1), not at all (0), or a bound in ms.
struct Wait {
  int ms;
  static constexpr Wait forever() noexcept { return {-1}; }
  static constexpr Wait none() noexcept { return {0}; }
  static Wait bounded(std::chrono::milliseconds t) noexcept {
    auto ms = t.count();
    return {ms <= 0 ? 0 : ms > 0x7fffffff ? 0x7fffffff : static_cast<int>(ms)};
  }
};

inline bool is_empty_channel_errno(int e) noexcept {
  return e == EAGAIN || e == EWOULDBLOCK || e == ENODATA;
}

/// Polls `channel`'s fd once: 1 when an event is pending, 0 when none came within
/// `timeout_ms`, -1 with errno on failure.
inline int poll_channel(rdma_event_channel* channel, int timeout_ms) noexcept {
  pollfd pfd{channel->fd, POLLIN, 0};
  errno = 0;
  const int n = provider().poll(&pfd, 1, timeout_ms);
  return n > 0 ? 1 : n;
}

/// Waits until `channel` is readable. no_event when nothing arrived in time.
inline expected<void> wait_readable(rdma_event_channel* channel, Wait wait) noexcept {
  using clock = std::chrono::steady_clock;
  const auto deadline = clock::now() + std::chrono::milliseconds(wait.ms);
  int timeout = wait.ms;
  for (;;) {
    const int n = poll_channel(channel, timeout);
    if (n > 0) return {};
    if (n == 0)
      return fail(make_error(errc::no_event, 0, "rdma_get_cm_event",
                             "no event within {} ms", wait.ms));
    if (errno != EINTR) return fail(provider_error("poll", errno));
    if (wait.ms >= 0) {
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - clock::now());
      timeout = left.count() > 0 ? static_cast<int>(left.count()) : 0;
    }
  }
}

/// The next event of `channel` (to be acknowledged by the caller through CmEvent).
/// Errors: no_event (empty non-blocking channel, or timeout), provider.
inline expected<CmEvent> next_cm_event(rdma_event_channel* channel, Wait wait) noexcept {
  if (wait.ms >= 0) {
    auto ready = wait_readable(channel, wait);
    if (!ready) return fail(ready.error());
  }
  rdma_cm_event* event = nullptr;
  errno = 0;
  if (provider().get_cm_event(channel, &event) != 0) {
    int e = errno;
    if (is_empty_channel_errno(e))
      return fail(Error(errc::no_event, e, "rdma_get_cm_event", "the channel has no event"));
    return fail(provider_error("rdma_get_cm_event", e));
  }
  return CmEvent(event);
}

/// Acknowledges an event explicitly, reporting a failure.
inline expected<void> ack(CmEvent& event) noexcept {
  errno = 0;
  if (provider().ack_cm_event(event.release()) != 0)
    return fail(provider_error("rdma_ack_cm_event", errno));
  return {};
}

inline const char* event_name(rdma_cm_event_type type) noexcept {
  switch (type) {
    case RDMA_CM_EVENT_ADDR_RESOLVED: return "ADDR_RESOLVED";
    case RDMA_CM_EVENT_ADDR_ERROR: return "ADDR_ERROR";
    case RDMA_CM_EVENT_ROUTE_RESOLVED: return "ROUTE_RESOLVED";
    case RDMA_CM_EVENT_ROUTE_ERROR: return "ROUTE_ERROR";
    case RDMA_CM_EVENT_CONNECT_REQUEST: return "CONNECT_REQUEST";
    case RDMA_CM_EVENT_CONNECT_RESPONSE: return "CONNECT_RESPONSE";
    case RDMA_CM_EVENT_CONNECT_ERROR: return "CONNECT_ERROR";
    case RDMA_CM_EVENT_UNREACHABLE: return "UNREACHABLE";
    case RDMA_CM_EVENT_REJECTED: return "REJECTED";
    case RDMA_CM_EVENT_ESTABLISHED: return "ESTABLISHED";
    case RDMA_CM_EVENT_DISCONNECTED: return "DISCONNECTED";
    case RDMA_CM_EVENT_DEVICE_REMOVAL: return "DEVICE_REMOVAL";
    case RDMA_CM_EVENT_MULTICAST_JOIN: return "MULTICAST_JOIN";
    case RDMA_CM_EVENT_MULTICAST_ERROR: return "MULTICAST_ERROR";
    case RDMA_CM_EVENT_ADDR_CHANGE: return "ADDR_CHANGE";
    case RDMA_CM_EVENT_TIMEWAIT_EXIT: return "TIMEWAIT_EXIT";
  }
  return "UNKNOWN_EVENT";
}

}  // namespace detail
RPMAPP_END_NAMESPACE
