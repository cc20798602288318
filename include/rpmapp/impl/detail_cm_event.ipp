// The definitions of rpmapp/detail/cm_event.hpp: reading and acknowledging rdma_cm events.
#pragma once

#include <rpmapp/detail/cm_event.hpp>
#include <rpmapp/detail/device_context.hpp>
#include <rpmapp/detail/format.hpp>

#include <fcntl.h>
#include <poll.h>

#include <cerrno>

RPMAPP_BEGIN_NAMESPACE
namespace detail {

RPMAPP_DECL expected<void> make_nonblocking(rdma_event_channel* channel) noexcept {
  const Provider& p = provider();
  errno = 0;
  if (p.fcntl(channel->fd, F_SETFL, O_NONBLOCK) != 0)
    return fail(provider_error("fcntl", errno, "F_SETFL O_NONBLOCK on the event channel"));
  return {};
}

RPMAPP_DECL rdma_cm_event* poll_cm_event(rdma_event_channel* channel, const Deadline& deadline,
                                         const Provider& p, int& empty_read,
                                         CmReadFailure& failed) noexcept {
  for (;;) {
    pollfd pfd{channel->fd, POLLIN, 0};
    errno = 0;
    const int n = deadline.immediate() ? 1 : p.poll(&pfd, 1, deadline.poll_timeout());
    if (n < 0) {
      const int e = errno;
      if (e == EINTR) continue;
      failed = {"poll", e};
      return nullptr;
    }
    if (n > 0) {
      rdma_cm_event* event = nullptr;
      errno = 0;
      if (p.get_cm_event(channel, &event) == 0) return event;
      const int e = errno;
      if (e == EINTR) continue;
      if (!is_empty_channel_errno(e)) {
        failed = {"rdma_get_cm_event", e};
        return nullptr;
      }
      empty_read = e;
    }
    return nullptr;
  }
}

RPMAPP_DECL expected<CmEvent> next_cm_event(rdma_event_channel* channel, const Deadline& deadline,
                                            const Provider& p) noexcept {
  int empty_read = 0;  // errno of the last read that found nothing
  CmReadFailure failed;
  for (;;) {
    if (rdma_cm_event* event = poll_cm_event(channel, deadline, p, empty_read, failed)) {
      // every later call on the device's objects fails clearly (check_device)
      if (event->event == RDMA_CM_EVENT_DEVICE_REMOVAL && event->id != nullptr)
        mark_device_removed(event->id->verbs);
      return CmEvent(event, CmEventAcker{{&p}});
    }
    if (failed.call != nullptr) return fail(provider_error(failed.call, failed.sys_errno));
    if (deadline.passed())
      return fail(Error(errc::no_event, empty_read, "rdma_get_cm_event",
                        empty_read != 0 ? "the channel has no event" : "no event in time"));
  }
}

RPMAPP_DECL expected<void> ack(CmEvent& event) noexcept {
  const Provider& p = event.get_deleter().provider();
  errno = 0;
  if (p.ack_cm_event(event.release()) != 0)
    return fail(provider_error("rdma_ack_cm_event", errno));
  return {};
}

RPMAPP_DECL const char* event_name(rdma_cm_event_type type) noexcept {
  // an int: rdma-core adds event types (65 has 20, 44 had 16), and a switch over the enum
  // would not build with -Werror=switch against a newer librdmacm
  switch (static_cast<int>(type)) {
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
    // events added after rdma-core 56 (65 has them: rdma_resolve_addrinfo and librdmacm's
    // own; rdma_cma.h's numbering), never reported on the ids rpmapp makes
    case RDMA_CM_EVENT_TIMEWAIT_EXIT + 1: return "ADDRINFO_RESOLVED";
    case RDMA_CM_EVENT_TIMEWAIT_EXIT + 2: return "ADDRINFO_ERROR";
    case RDMA_CM_EVENT_TIMEWAIT_EXIT + 3: return "USER";
    case RDMA_CM_EVENT_TIMEWAIT_EXIT + 4: return "INTERNAL";
  }
  return "UNKNOWN_EVENT";
}

RPMAPP_DECL void log_event(LogLevel level, const char* where, rdma_cm_event_type type,
                           std::string_view what) noexcept {
  if (!log_enabled(level)) return;
  char text[160];
  const auto n = detail::format_to_n(text, sizeof text, "{} event: {}", event_name(type), what).size;
  log(level, where, std::string_view(text, n < sizeof text ? n : sizeof text));
}

}  // namespace detail
RPMAPP_END_NAMESPACE
