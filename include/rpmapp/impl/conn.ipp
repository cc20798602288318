// The definitions of rpmapp/conn.hpp: events, queries, disconnect, close (not the data path).
#pragma once

#include <rpmapp/conn.hpp>
#include <rpmapp/detail/address.hpp>

#include <cerrno>
#include <utility>
#include <vector>

RPMAPP_BEGIN_NAMESPACE

namespace detail {

RPMAPP_DECL expected<std::optional<ConnEvent>>
take_conn_event(const char* call, ConnectionCore& core,
                                                               const Deadline& deadline) noexcept {
  return no_throw(call, [&]() -> expected<std::optional<ConnEvent>> {
    auto event = next_event_of(call, core, deadline);
    if (!event) return fail(event.error());
    event->get_deleter().by = {call, LogLevel::notice};  // acknowledged there on failure only
    const rdma_cm_event_type type = (*event)->event;
    // Copy before the acknowledgement releases the event; publish after it succeeded.
    ReceivedPrivateData data;
    const bool carries_data = type == RDMA_CM_EVENT_REJECTED ||
                              (type == RDMA_CM_EVENT_ESTABLISHED && core.private_data.empty());
    if (carries_data) data.store(**event);
    if (auto acked = ack(*event); !acked) return fail(acked.error());
    if (carries_data && !data.empty()) core.private_data.swap(data);
    switch (type) {
      case RDMA_CM_EVENT_ESTABLISHED:
        core.before_established.store(false, std::memory_order_release);
        return ConnEvent::established;
      case RDMA_CM_EVENT_CONNECT_ERROR: return ConnEvent::lost;
      // The address's netdev took another hardware address (a bonding failover): rdma_cm
      // says to re-establish; on rxe the queue pair's sends then fail (measured).
      case RDMA_CM_EVENT_ADDR_CHANGE: return ConnEvent::lost;
      case RDMA_CM_EVENT_DEVICE_REMOVAL:
        core.device_removed = true;  // the kernel destroyed the id: no event comes any more
        return ConnEvent::lost;
      case RDMA_CM_EVENT_DISCONNECTED:
      case RDMA_CM_EVENT_TIMEWAIT_EXIT:
        if (core.closed_reported) {
          log_event(LogLevel::debug, call, type,
                    "the second end of the connection, acknowledged and not reported");
          return std::nullopt;
        }
        core.closed_reported = true;
        return ConnEvent::closed;
      case RDMA_CM_EVENT_REJECTED: return ConnEvent::rejected;
      case RDMA_CM_EVENT_UNREACHABLE: return ConnEvent::unreachable;
      default:
        return fail(make_error(errc::unknown, 0, call, "unexpected event {} on a connection",
                               event_name(type)));
    }
  });
}

RPMAPP_DECL expected<ConnEvent> next_conn_event(const char* call, ConnectionCore& core,
                                                const Deadline& deadline) noexcept {
  if (core.device_removed) [[unlikely]]
    return fail(removed_device_error("rdma_get_cm_event", core.peer ? core.peer->context : nullptr)
                    .name_operation(call));
  if (core.path.failed.load(std::memory_order_relaxed) && !core.lost_reported) {
    core.lost_reported = true;
    log(LogLevel::notice, call, Error(errc::provider, 0, "ibv_poll_cq",
                                      "a work request failed with retry exceeded: the peer stopped answering"));
    return ConnEvent::lost;
  }
  for (;;) {
    auto event = take_conn_event(call, core, deadline);
    if (!event) return fail(event.error());
    if (*event) return **event;
  }
}

}  // namespace detail

RPMAPP_DECL Conn& Conn::operator=(Conn&& other) noexcept {
  if (this != &other) {
    if (core_) core_->teardown = {"Conn::operator=", LogLevel::warning};
    core_ = std::move(other.core_);
  }
  return *this;
}

RPMAPP_DECL expected<int> Conn::fd() const noexcept {
  if (!core_) return detail::fail(detail::moved_from("Conn::fd"));
  return detail::event_fd("Conn::fd", *core_);
}

RPMAPP_DECL expected<std::span<const std::byte>> Conn::private_data() const noexcept {
  if (!core_) return detail::fail(detail::moved_from("Conn::private_data"));
  return core_->private_data.view();
}

RPMAPP_DECL expected<std::size_t> Conn::copy_private_data(std::span<std::byte> out) const noexcept {
  if (!core_) return detail::fail(detail::moved_from("Conn::copy_private_data"));
  return detail::copy_out("Conn::copy_private_data", core_->private_data.view(), out);
}

RPMAPP_DECL expected<std::uint32_t> Conn::qp_num() const noexcept {
  if (!core_) return detail::fail(detail::moved_from("Conn::qp_num"));
  return core_->id->qp->qp_num;
}

RPMAPP_DECL expected<ConnId> Conn::id() const noexcept {
  if (!core_) return detail::fail(detail::moved_from("Conn::id"));
  return core_->path.conn;
}

RPMAPP_DECL expected<Cq> Conn::cq() const noexcept {
  if (!core_) return detail::fail(detail::moved_from("Conn::cq"));
  if (core_->shared_cq) return Cq(core_->shared_cq->cq.get(), core_->shared_cq->channel.get(), &core_->shared_cq->routes);
  return Cq(core_->cq.get(), core_->comp_channel.get(), core_->config.shared_completion_channel, &core_->path,
            core_->path.conn);
}

RPMAPP_DECL expected<Cq> Conn::rcq() const noexcept {
  if (!core_) return detail::fail(detail::moved_from("Conn::rcq"));
  if (!core_->rcq && core_->srq && core_->srq->rcq)
    return Cq(core_->srq->rcq.get(), core_->srq->channel.get(), &core_->srq->routes);
  const bool shared = core_->config.shared_completion_channel && core_->rcq;
  return Cq(core_->rcq.get(), core_->receive_channel(), shared, &core_->path, core_->path.conn);
}

RPMAPP_DECL expected<int> Conn::completion_fd() const noexcept {
  if (!core_) return detail::fail(detail::moved_from("Conn::completion_fd"));
  if (core_->shared_cq) return detail::fail(detail::on_shared_cq("Conn::completion_fd"));
  if (!core_->config.completion_channel) return detail::fail(detail::no_completion_channel("Conn::completion_fd"));
  if (!core_->config.shared_completion_channel)
    return detail::fail(not_shared("Conn::completion_fd"));
  return core_->comp_channel->fd;
}

RPMAPP_DECL expected<void> Conn::apply_remote_peer_config(const PeerConfig& config) noexcept {
  if (!core_) return detail::fail(detail::moved_from("Conn::apply_remote_peer_config"));
  core_->direct_write_to_pmem = config.direct_write_to_pmem;
  return {};
}

RPMAPP_DECL expected<std::string> Conn::peer_address() const noexcept {
  if (!core_) return detail::fail(detail::moved_from("Conn::peer_address"));
  return detail::no_throw("Conn::peer_address", [&]() -> expected<std::string> {
    return detail::peer_address_of(core_->id.get());
  });
}

RPMAPP_DECL expected<std::uint16_t> Conn::peer_port() const noexcept {
  if (!core_) return detail::fail(detail::moved_from("Conn::peer_port"));
  return detail::port_of(rdma_get_peer_addr(core_->id.get()));
}

RPMAPP_DECL expected<std::string_view> Conn::device() const noexcept {
  if (!core_) return detail::fail(detail::moved_from("Conn::device"));
  return core_->device();
}

RPMAPP_DECL expected<Peer> Conn::peer() const noexcept {
  if (!core_) return detail::fail(detail::moved_from("Conn::peer"));
  return Peer::of(core_->peer);
}

RPMAPP_DECL expected<void> Conn::disconnect() noexcept {
  if (!core_) return detail::fail(detail::moved_from("Conn::disconnect"));
  // librdmacm moves an iWARP queue pair only to SQD (siw: closing), where work still queued
  // never completes; the error state first flushes it, as rdma_disconnect does on IB.
  if (ibv_qp* qp = core_->id->qp; qp != nullptr && core_->peer->iwarp) {
    ibv_qp_attr attr{};
    attr.qp_state = IBV_QPS_ERR;
    if (const int rc = detail::provider().modify_qp(qp, &attr, IBV_QP_STATE); rc != 0)
      return detail::fail(detail::provider_error_in("Conn::disconnect", "ibv_modify_qp", detail::verbs_errno(rc)));
  }
  errno = 0;
  if (detail::provider().disconnect(core_->id.get()) != 0)
    return detail::fail(detail::provider_error_in("Conn::disconnect", "rdma_disconnect", errno));
  return {};
}

RPMAPP_DECL expected<void> Conn::close() && noexcept {
  if (!core_) return detail::fail(detail::moved_from("Conn::close"));
  auto core = std::move(core_);
  auto closed = detail::close_core(*core, {"Conn::close", LogLevel::warning});
  detail::name_in(closed, "Conn::close");
  return closed;
}

RPMAPP_DECL Conn::Conn(std::unique_ptr<detail::ConnectionCore>
core) noexcept : core_(std::move(core)) {
  core_->teardown = {"Conn::~Conn", LogLevel::warning};
}

RPMAPP_DECL expected<ConnEvent> Conn::next_event() noexcept {
  return next("Conn::next_event", detail::Wait::forever());
}

RPMAPP_DECL expected<ConnEvent> Conn::try_next_event() noexcept {
  return next("Conn::try_next_event", detail::Wait::none());
}

RPMAPP_DECL expected<ConnEvent> Conn::next_event_for(std::chrono::milliseconds timeout) noexcept {
  return next("Conn::next_event_for", detail::Wait::bounded(timeout));
}

RPMAPP_DECL expected<ibv_qp*> Conn::qp() const noexcept {
  if (!core_) return detail::fail(detail::moved_from("Conn::qp"));
  return core_->id->qp;
}

RPMAPP_END_NAMESPACE
