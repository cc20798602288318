// rpmapp::Conn: an established (or establishing) connection.
#pragma once

#include <rpmapp/detail/cm_event.hpp>
#include <rpmapp/detail/address.hpp>
#include <rpmapp/detail/connection.hpp>
#include <rpmapp/error.hpp>

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>

RPMAPP_BEGIN_NAMESPACE

/// What Conn::next_event reports (librpma's enum rpma_conn_event).
enum class ConnEvent {
  established,  ///< the connection is up (RDMA_CM_EVENT_ESTABLISHED)
  closed,       ///< the peer or we disconnected: reported once per connection, for the
                ///< first of DISCONNECTED and TIMEWAIT_EXIT (the other is acknowledged and
                ///< not reported)
  lost,         ///< the connection failed or its device went away (CONNECT_ERROR, DEVICE_REMOVAL)
  rejected,     ///< the peer rejected the request; private_data() has its reject data
  unreachable,  ///< the peer did not answer (UNREACHABLE). On an established connection
                ///< this can be transient (seen on rxe while a link was down): not always fatal.
};

constexpr std::string_view to_string(ConnEvent event) noexcept {
  switch (event) {
    case ConnEvent::established: return "established";
    case ConnEvent::closed: return "closed";
    case ConnEvent::lost: return "lost";
    case ConnEvent::rejected: return "rejected";
    case ConnEvent::unreachable: return "unreachable";
  }
  return "undefined";
}

class ConnReq;

/// A connection, made by ConnReq::connect. It owns its cm_id (on its own event channel),
/// its queue pair and completion queues, and keeps its Peer's protection domain alive.
/// It stays valid after the Endpoint it came from is gone.
/// Thread safety: one thread at a time per Conn; different Conns are independent.
class Conn {
 public:
  Conn(Conn&&) noexcept = default;
  Conn& operator=(Conn&&) noexcept = default;
  /// Releases everything, like close(), ignoring errors.
  ~Conn() = default;

  explicit operator bool() const noexcept { return core_ != nullptr; }

  /// Waits for the next connection event. ConnEvent::closed comes once per connection:
  /// rdma_cm reports the end of a connection twice (DISCONNECTED, then TIMEWAIT_EXIT when
  /// the queue pair leaves the CM's time-wait), so the first is reported (whichever it is)
  /// and the second is acknowledged, not reported, and the call goes on waiting. After
  /// closed nothing more is reported: next_event() would wait forever. A signal does not
  /// interrupt a wait; it is retried.
  /// Errors:
  /// - inval: the Conn is empty.
  /// - no_event: only from try_next_event and next_event_for: nothing in time.
  /// - provider: poll, rdma_get_cm_event or rdma_ack_cm_event failed.
  /// - unknown: an event that has no ConnEvent (it is acknowledged; the reason names it).
  /// - nomem: out of memory storing the peer's private data.
  expected<ConnEvent> next_event() noexcept { return next("Conn::next_event", detail::Wait::forever()); }
  /// As next_event, but returns no_event at once when nothing is pending (also when all
  /// that was pending was the second end-of-connection event, acknowledged and dropped).
  expected<ConnEvent> try_next_event() noexcept { return next("Conn::try_next_event", detail::Wait::none()); }
  /// As next_event, but returns no_event when nothing to report arrived within `timeout`
  /// (a zero or negative timeout is try_next_event).
  expected<ConnEvent> next_event_for(std::chrono::milliseconds timeout) noexcept {
    return next("Conn::next_event_for", detail::Wait::bounded(timeout));
  }

  /// The fd of the connection's event channel, for poll/epoll (readable = an event is
  /// pending).
  /// It is always non-blocking (O_NONBLOCK): rpmapp reads it only after poll and loops on
  /// an empty read, so a blocking call waits whatever the fd's flags. Never clear
  /// O_NONBLOCK: librdmacm may consume an event itself between your poll and the read,
  /// and a blocking read would then hang until some later event.
  /// Errors: inval when empty.
  expected<int> fd() const noexcept {
    if (!core_) return detail::fail(detail::moved_from("Conn::fd"));
    return core_->channel->fd;
  }

  /// The peer's private data: on the accepting side the request's, on the connecting side
  /// the accept's (after established) or the reject's (after rejected). rdma_cm pads it to
  /// the protocol's size with zeros (56 bytes on a request, 196 on an accept, 148 on a reject):
  /// carry your own length if it matters. Valid until the next call on this Conn.
  /// Errors: inval when empty.
  expected<std::span<const std::byte>> private_data() const noexcept {
    if (!core_) return detail::fail(detail::moved_from("Conn::private_data"));
    return std::span<const std::byte>(core_->private_data);
  }
  /// Copies private_data() into `out` and returns its size. Errors: inval when empty or
  /// when `out` is too small (nothing is written then).
  expected<std::size_t> copy_private_data(std::span<std::byte> out) const noexcept {
    if (!core_) return detail::fail(detail::moved_from("Conn::copy_private_data"));
    return detail::copy_out("Conn::copy_private_data", core_->private_data, out);
  }

  /// The queue pair number. Errors: inval when empty.
  expected<std::uint32_t> qp_num() const noexcept {
    if (!core_) return detail::fail(detail::moved_from("Conn::qp_num"));
    return core_->id->qp->qp_num;
  }
  /// The queue pair, for the data path. Errors: inval when empty.
  expected<ibv_qp*> qp() const noexcept {
    if (!core_) return detail::fail(detail::moved_from("Conn::qp"));
    return core_->id->qp;
  }
  /// The completion queue (and the receive one, null unless ConnConfig::rcq_size > 0).
  /// Errors: inval when empty.
  expected<ibv_cq*> cq() const noexcept {
    if (!core_) return detail::fail(detail::moved_from("Conn::cq"));
    return core_->cq.get();
  }
  expected<ibv_cq*> rcq() const noexcept {
    if (!core_) return detail::fail(detail::moved_from("Conn::rcq"));
    return core_->rcq.get();
  }
  /// The other side's numeric address; a link-local IPv6 one with its scope
  /// ("fe80::1%eth0"), so it can be passed to ConnReq::to. Errors: inval when empty; nomem.
  expected<std::string> peer_address() const noexcept {
    if (!core_) return detail::fail(detail::moved_from("Conn::peer_address"));
    return detail::no_throw("Conn::peer_address", [&]() -> expected<std::string> {
      return detail::peer_address_of(core_->id.get());
    });
  }
  /// The other side's port. Errors: inval when empty.
  expected<std::uint16_t> peer_port() const noexcept {
    if (!core_) return detail::fail(detail::moved_from("Conn::peer_port"));
    return detail::port_of(rdma_get_peer_addr(core_->id.get()));
  }
  /// The RDMA device the connection runs on, e.g. "rxe0"; the view is valid while the
  /// Conn lives. Errors: inval when empty.
  expected<std::string_view> device() const noexcept {
    if (!core_) return detail::fail(detail::moved_from("Conn::device"));
    return std::string_view(core_->device);
  }

  /// Starts disconnecting. The peer sees ConnEvent::closed; this side sees closed once the
  /// peer has also called disconnect() (or destroyed its connection), or after the CM's
  /// timeout: call disconnect() on both sides, as with librpma.
  /// Errors: inval when empty; provider: rdma_disconnect failed.
  expected<void> disconnect() noexcept {
    if (!core_) return detail::fail(detail::moved_from("Conn::disconnect"));
    errno = 0;
    if (detail::provider().disconnect(core_->id.get()) != 0)
      return detail::fail(detail::provider_error("rdma_disconnect", errno));
    return {};
  }

  /// Releases the queue pair, completion queues, cm_id and event channel (consumes the
  /// Conn: it is empty afterwards, whatever the result) and returns the first failure.
  /// Errors: inval when empty; provider: ibv_destroy_cq, ibv_destroy_comp_channel or
  /// rdma_destroy_id failed (the rest is still released).
  expected<void> close() && noexcept {
    if (!core_) return detail::fail(detail::moved_from("Conn::close"));
    auto core = std::move(core_);
    return detail::close_core(*core);
  }

 private:
  friend class ConnReq;
  explicit Conn(std::unique_ptr<detail::ConnectionCore> core) noexcept : core_(std::move(core)) {}

  expected<ConnEvent> next(const char* call, detail::Wait wait) noexcept {
    if (!core_) return detail::fail(detail::moved_from(call));
    // One deadline for every event taken: a swallowed second end-of-connection event
    // does not extend the caller's bound.
    const detail::Deadline deadline(wait);
    for (;;) {
      auto event = next_once(call, deadline);
      if (!event) return detail::fail(event.error());
      if (*event) return **event;
    }
  }

  // Takes and acknowledges one event: its ConnEvent, or nullopt for one not reported.
  expected<std::optional<ConnEvent>> next_once(const char* call,
                                               const detail::Deadline& deadline) noexcept {
    return detail::no_throw(call, [&]() -> expected<std::optional<ConnEvent>> {
      auto event = detail::next_cm_event(core_->channel.get(), deadline);
      if (!event) return detail::fail(event.error());
      const rdma_cm_event_type type = (*event)->event;
      // Copy before the acknowledgement releases the event; publish after it succeeded.
      std::vector<std::byte> data;
      const bool carries_data = type == RDMA_CM_EVENT_REJECTED ||
                                (type == RDMA_CM_EVENT_ESTABLISHED && core_->private_data.empty());
      if (carries_data) detail::store_private_data(data, **event);
      if (auto acked = detail::ack(*event); !acked) return detail::fail(acked.error());
      if (carries_data && !data.empty()) core_->private_data.swap(data);
      switch (type) {
        case RDMA_CM_EVENT_ESTABLISHED: return ConnEvent::established;
        case RDMA_CM_EVENT_CONNECT_ERROR:
        case RDMA_CM_EVENT_DEVICE_REMOVAL: return ConnEvent::lost;
        case RDMA_CM_EVENT_DISCONNECTED:
        case RDMA_CM_EVENT_TIMEWAIT_EXIT:
          if (closed_) return std::nullopt;
          closed_ = true;
          return ConnEvent::closed;
        case RDMA_CM_EVENT_REJECTED: return ConnEvent::rejected;
        case RDMA_CM_EVENT_UNREACHABLE: return ConnEvent::unreachable;
        default:
          return detail::fail(detail::make_error(errc::unknown, 0, call,
                                                 "unexpected event {} on a connection",
                                                 detail::event_name(type)));
      }
    });
  }

  std::unique_ptr<detail::ConnectionCore> core_;
  bool closed_ = false;  // closed was reported
};

RPMAPP_END_NAMESPACE
