// Definitions of rpmapp/conn_req.hpp: accepting, rejecting and resolving connection requests.
#pragma once

#include <rpmapp/conn_req.hpp>

#include <cerrno>
#include <utility>

RPMAPP_BEGIN_NAMESPACE

RPMAPP_DECL ConnReq& ConnReq::operator=(ConnReq&& other) noexcept {
  if (this != &other) {
    if (core_) core_->teardown = {"ConnReq::operator=", LogLevel::warning};
    core_ = std::move(other.core_);
    incoming_ = other.incoming_;
  }
  return *this;
}

RPMAPP_DECL expected<std::unique_ptr<detail::ConnectionCore>> ConnReq::take_for_connect(
    const char* call, std::span<const std::byte> private_data) && noexcept {
  if (!core_) return detail::fail(detail::moved_from(call));
  if (auto ok = detail::check_private_data(
          call, private_data, *core_->peer,
          incoming_ ? detail::PrivateDataUse::accept : detail::PrivateDataUse::connect);
      !ok)
    return detail::fail(ok.error());
  auto core = std::move(core_);
  core->teardown = {call, LogLevel::notice};  // released here if the call fails
  // rdma_cm would refuse with a bare EINVAL (the id is in its removal state)
  if (auto present = detail::check_device(call, core->id->verbs); !present) return detail::fail(present.error());
  return core;
}

RPMAPP_DECL expected<Conn> ConnReq::connect(std::span<const std::byte> private_data) && noexcept {
  constexpr const char* call = connect_call;
  const bool incoming = incoming_;
  auto taken = std::move(*this).take_for_connect(call, private_data);
  if (!taken) return detail::fail(taken.error());
  auto core = std::move(*taken);
  rdma_conn_param param = detail::conn_param(private_data, core->config);
  errno = 0;
  if (incoming) {
    core->before_established.store(core->peer->iwarp, std::memory_order_release);
    if (detail::provider().accept(core->id.get(), &param) != 0)
      return detail::fail(detail::provider_error_in(call, "rdma_accept", errno));
    core->reject_unanswered = false;
  } else if (detail::provider().connect(core->id.get(), &param) != 0) {
    return detail::fail(detail::provider_error_in(call, "rdma_connect", errno));
  }
  return Conn(std::move(core));
}

RPMAPP_DECL expected<void> ConnReq::reject(std::span<const std::byte> private_data) && noexcept {
  constexpr const char* call = "ConnReq::reject";
  if (!core_) return detail::fail(detail::moved_from(call));
  if (!incoming_) return detail::fail(detail::invalid(call, "only an incoming request can be rejected"));
  if (auto ok = detail::check_private_data(call, private_data, *core_->peer, detail::PrivateDataUse::reject);
      !ok)
    return detail::fail(ok.error());
  auto core = std::move(core_);
  detail::FirstError first{{call, LogLevel::warning}};
  errno = 0;
  first.errno_call(detail::provider().reject(core->id.get(), private_data.data(),
                                             static_cast<std::uint8_t>(private_data.size())),
                   "rdma_reject");
  core->reject_unanswered = false;
  if (auto closed = detail::close_core(*core, first.by); !closed) first.note(closed.error());
  return detail::named(call, first.result());
}

RPMAPP_DECL expected<void> ConnReq::close() && noexcept {
  if (!core_) return detail::fail(detail::moved_from("ConnReq::close"));
  auto core = std::move(core_);
  return detail::named("ConnReq::close", detail::close_core(*core, {"ConnReq::close", LogLevel::warning}));
}

RPMAPP_DECL expected<PendingConnReq> ConnReq::start_as(const char* call, const Peer& peer,
                                                       std::string_view addr, std::string_view port,
                                                       const ConnConfig& config) noexcept {
  if (!peer) return detail::fail(detail::moved_from(call));
  detail::SocketAddress where;
  if (auto ok = detail::check_numeric_address(call, addr, &where); !ok)
    return detail::fail(ok.error());
  auto number = detail::parse_port(call, port);
  if (!number) return detail::fail(number.error());
  if (*number == 0) return detail::fail(detail::invalid(call, "cannot connect to port 0"));
  where.set_port(*number);
  if (auto ok = detail::check_config(call, config); !ok) return detail::fail(ok.error());
  if (auto present = detail::check_device(call, peer.state()->context); !present)
    return detail::fail(present.error());
  return detail::no_throw(call, [&]() -> expected<PendingConnReq> {
    const detail::Provider& p = detail::provider();
    auto core = std::make_unique<detail::ConnectionCore>();
    core->teardown = {call, LogLevel::notice};  // until a PendingConnReq owns it
    core->peer = peer.state();
    if (config.own_protection_domain) {
      auto own = detail::own_domain(call, *core->peer);
      if (!own) return detail::fail(own.error());
      core->peer = std::move(*own);
    }
    core->config = detail::settings_of(config);
    if (auto ok = detail::attach_shared_queues(call, *core, config, detail::shared_queues_of(config)); !ok)
      return detail::fail(ok.error());
    if (auto ok = detail::open_event_channel(*core); !ok) return detail::fail(ok.error());
    rdma_cm_id* id = nullptr;
    errno = 0;
    if (p.create_id(detail::event_channel_of(*core), &id, nullptr, RDMA_PS_TCP) != 0)
      return detail::fail(detail::provider_error("rdma_create_id", errno));
    core->id.reset(id);
    if (core->events)
      core->events->add(id, core->inbox);
    errno = 0;
    if (p.resolve_addr(id, nullptr, where.get(), static_cast<int>(config.timeout.count())) != 0)
      return detail::fail(detail::provider_error("rdma_resolve_addr", errno));
    return PendingConnReq(std::move(core), config);
  });
}

RPMAPP_DECL expected<ConnReq> ConnReq::to(const Peer& peer, std::string_view addr,
                                          std::string_view port, const ConnConfig& config) noexcept {
  auto pending = start_as("ConnReq::to", peer, addr, port, config);
  if (!pending) return detail::fail(pending.error());
  return detail::named("ConnReq::to", std::move(*pending).wait());
}

RPMAPP_DECL PendingConnReq& PendingConnReq::operator=(PendingConnReq&& other) noexcept {
  if (this != &other) {
    if (core_) core_->teardown = {"PendingConnReq::operator=", LogLevel::warning};
    core_ = std::move(other.core_);
    config_ = other.config_;
    stage_ = other.stage_;
  }
  return *this;
}

RPMAPP_DECL expected<ConnReq> PendingConnReq::wait() && noexcept {
  constexpr const char* call = "PendingConnReq::wait";
  if (!core_) return detail::fail(detail::moved_from(call));
  const auto bound = 2 * config_.timeout + std::chrono::milliseconds(1000);
  auto result = std::move(*this).advance(call, detail::Wait::bounded(bound));
  if (!result && result.error() == errc::no_event && core_) {
    drop(call);
    return detail::fail(detail::make_error(errc::provider, ETIMEDOUT, resolving_call(),
                                           "no resolution event within {} ms", bound.count())
                            .name_operation(call));
  }
  return result;
}

RPMAPP_DECL expected<ConnReq> PendingConnReq::advance_events(const char* call,
                                                             detail::Wait wait) noexcept {
  if (!core_) return detail::fail(detail::moved_from(call));
  const detail::Deadline deadline(wait);  // one bound for all the events handled
  for (;;) {
    auto event = detail::next_event_of(call, *core_, deadline);
    if (!event) {
      if (event.error() != errc::no_event) drop(call);
      return detail::fail(event.error());
    }
    auto step = handle(call, **event);
    if (auto acked = detail::ack(*event); !acked) {
      if (step) step = detail::fail(acked.error());
      else detail::log(LogLevel::notice, call, acked.error());  // the step's failure is returned
    }
    if (!step) {
      drop(call);
      return detail::fail(step.error());
    }
    if (*step) return ConnReq(std::move(core_), false);
  }
}

RPMAPP_DECL expected<bool> PendingConnReq::handle(const char* call,
                                                  const rdma_cm_event& event) noexcept {
  const detail::Provider& p = detail::provider();
  const auto type = event.event;
  if (stage_ == Stage::address && type == RDMA_CM_EVENT_ADDR_RESOLVED) {
    errno = 0;
    if (p.resolve_route(core_->id.get(), static_cast<int>(config_.timeout.count())) != 0)
      return detail::fail(detail::provider_error("rdma_resolve_route", errno));
    stage_ = Stage::route;
    return false;
  }
  if (stage_ == Stage::route && type == RDMA_CM_EVENT_ROUTE_RESOLVED) {
    // By pointer, as rdma_create_qp checks the protection domain's context.
    if (core_->id->verbs != core_->peer->context)
      return detail::fail(detail::context_mismatch(call, "the address is reached through",
                                                   core_->id->verbs, core_->peer->context));
    if (auto made = detail::create_queues(*core_, config_); !made)
      return detail::fail(made.error());
    return true;
  }
  int e = event.status < 0 ? -event.status : (event.status > 0 ? event.status : EPROTO);
  // The Peer's device went during resolution: rdma_cm ends it with ADDR_ERROR (EPERM,
  // measured on rxe) or DEVICE_REMOVAL. Say so, as every later call on the device does.
  if (type == RDMA_CM_EVENT_DEVICE_REMOVAL || detail::device_removed(core_->peer->context)) {
    detail::log_event(LogLevel::info, call, type, "resolution ended: the Peer's device was removed");
    return detail::fail(detail::removed_device_error(resolving_call(), core_->peer->context));
  }
  return detail::fail(detail::make_error(errc::provider, e, resolving_call(), "event {}",
                                         detail::event_name(type)));
}

RPMAPP_DECL expected<bool> ConnReq::is_incoming() const noexcept {
  if (!core_) return detail::fail(detail::moved_from("ConnReq::is_incoming"));
  return incoming_;
}

RPMAPP_DECL expected<std::span<const std::byte>> ConnReq::private_data() const noexcept {
  if (!core_) return detail::fail(detail::moved_from("ConnReq::private_data"));
  return core_->private_data.view();
}

RPMAPP_DECL expected<std::size_t>
ConnReq::copy_private_data(std::span<std::byte> out) const noexcept {
  if (!core_) return detail::fail(detail::moved_from("ConnReq::copy_private_data"));
  return detail::copy_out("ConnReq::copy_private_data", core_->private_data.view(), out);
}

RPMAPP_DECL expected<std::string> ConnReq::peer_address() const noexcept {
  if (!core_) return detail::fail(detail::moved_from("ConnReq::peer_address"));
  return detail::no_throw("ConnReq::peer_address", [&]() -> expected<std::string> {
    return detail::peer_address_of(core_->id.get());
  });
}

RPMAPP_DECL expected<std::uint16_t> ConnReq::peer_port() const noexcept {
  if (!core_) return detail::fail(detail::moved_from("ConnReq::peer_port"));
  return detail::port_of(rdma_get_peer_addr(core_->id.get()));
}

RPMAPP_DECL expected<std::string_view> ConnReq::device() const noexcept {
  if (!core_) return detail::fail(detail::moved_from("ConnReq::device"));
  return core_->device();
}

RPMAPP_DECL expected<Peer> ConnReq::peer() const noexcept {
  if (!core_) return detail::fail(detail::moved_from("ConnReq::peer"));
  return Peer::of(core_->peer);
}

RPMAPP_DECL expected<std::uint32_t> ConnReq::qp_num() const noexcept {
  if (!core_) return detail::fail(detail::moved_from("ConnReq::qp_num"));
  return core_->id->qp->qp_num;
}

RPMAPP_DECL expected<ConnId> ConnReq::id() const noexcept {
  if (!core_) return detail::fail(detail::moved_from("ConnReq::id"));
  return core_->path.conn;
}

RPMAPP_DECL expected<int> PendingConnReq::fd() const noexcept {
  if (!core_) return detail::fail(detail::moved_from("PendingConnReq::fd"));
  return detail::event_fd("PendingConnReq::fd", *core_);
}

RPMAPP_DECL expected<ConnReq> PendingConnReq::try_wait() && noexcept {
  return advance("PendingConnReq::try_wait", detail::Wait::none());
}

RPMAPP_DECL expected<ConnReq>
PendingConnReq::wait_for(std::chrono::milliseconds timeout) && noexcept {
  return advance("PendingConnReq::wait_for", detail::Wait::bounded(timeout));
}

RPMAPP_DECL expected<ConnReq> PendingConnReq::advance(const char* call,
                                                      detail::Wait wait) noexcept {
  return detail::named(call, advance_events(call, wait));
}

RPMAPP_END_NAMESPACE
