// Definitions of rpmapp/endpoint.hpp: listening, releasing a handle and taking requests.
#pragma once

#include <rpmapp/endpoint.hpp>

#include <utility>

RPMAPP_BEGIN_NAMESPACE

RPMAPP_DECL expected<Endpoint> Endpoint::listen(std::span<const Peer> peers, std::string_view addr,
                                                std::string_view port,
                                                const ListenOptions& options) noexcept {
  return detail::no_throw("Endpoint::listen", [&]() -> expected<Endpoint> {
    auto state = detail::start_listening("Endpoint::listen", peers, addr, port, options);
    if (!state) return detail::fail(state.error());
    return Endpoint(std::move(*state));
  });
}

RPMAPP_DECL Endpoint& Endpoint::operator=(Endpoint&& other) noexcept {
  if (this != &other) {
    release_logged("Endpoint::operator=");
    state_ = std::move(other.state_);
    watchers_ = std::move(other.watchers_);
  }
  return *this;
}

RPMAPP_DECL expected<Endpoint> Endpoint::share(const Peer& peer, std::string_view addr,
                                               std::string_view port, std::shared_ptr<void> handler,
                                               const ListenOptions& options) noexcept {
  constexpr const char* call = "Endpoint::listen_shared";
  return detail::no_throw(call, [&]() -> expected<Endpoint> {
    auto state = detail::listen_shared(call, peer, addr, port, options, std::move(handler));
    if (!state) return detail::fail(state.error());
    return Endpoint(std::move(*state));
  });
}

RPMAPP_DECL expected<void> Endpoint::release(detail::Teardown by) noexcept {
  watchers_.notify();  // event loops let go of the channel's fd while it is open
  if (!state_) return {};
  return detail::release_listener(std::move(state_), by);
}

RPMAPP_DECL void Endpoint::release_logged(const char* where) noexcept {
  const detail::Teardown by{where, LogLevel::warning};
  if (auto released = release(by); !released) [[unlikely]]
    detail::log(by.level, by.where, released.error());
}

RPMAPP_DECL expected<ConnReq> Endpoint::next(const char* call, const ConnConfig& config,
                                             detail::Wait wait) noexcept {
  if (!state_) return detail::fail(detail::moved_from(call));
  if (auto ok = detail::check_config(call, config); !ok) return detail::fail(ok.error());
  return detail::no_throw(call, [&]() -> expected<ConnReq> {
    auto core = detail::accept_request(call, *state_, config, detail::shared_queues_of(config), wait);
    if (!core) return detail::fail(core.error());
    return ConnReq(std::move(*core), true);
  });
}

RPMAPP_DECL expected<std::shared_ptr<ConnReqHandler>> Endpoint::handler() const noexcept {
  if (!state_) return detail::fail(detail::moved_from("Endpoint::handler"));
  return std::static_pointer_cast<ConnReqHandler>(state_->handler);
}

RPMAPP_DECL expected<ConnReq> Endpoint::next_conn_req(const ConnConfig& config) noexcept {
  return next("Endpoint::next_conn_req", config, detail::Wait::forever());
}

RPMAPP_DECL expected<ConnReq> Endpoint::try_next_conn_req(const ConnConfig& config) noexcept {
  return next("Endpoint::try_next_conn_req", config, detail::Wait::none());
}

RPMAPP_DECL expected<ConnReq> Endpoint::next_conn_req_for(std::chrono::milliseconds timeout,
                                                          const ConnConfig& config) noexcept {
  return next("Endpoint::next_conn_req_for", config, detail::Wait::bounded(timeout));
}

RPMAPP_DECL expected<int> Endpoint::fd() const noexcept {
  if (!state_) return detail::fail(detail::moved_from("Endpoint::fd"));
  return state_->channel->fd;
}

RPMAPP_DECL expected<std::uint16_t> Endpoint::port() const noexcept {
  if (!state_) return detail::fail(detail::moved_from("Endpoint::port"));
  return state_->port;
}

RPMAPP_DECL expected<std::string> Endpoint::local_address() const noexcept {
  if (!state_) return detail::fail(detail::moved_from("Endpoint::local_address"));
  return detail::no_throw("Endpoint::local_address", [&]() -> expected<std::string> {
    return detail::address_of(rdma_get_local_addr(state_->id.get()));
  });
}

RPMAPP_DECL expected<std::uint64_t> Endpoint::service_id() const noexcept {
  if (!state_) return detail::fail(detail::moved_from("Endpoint::service_id"));
  return detail::tcp_service_id(state_->port);
}

RPMAPP_DECL expected<std::string_view> Endpoint::device() const noexcept {
  if (!state_) return detail::fail(detail::moved_from("Endpoint::device"));
  return std::string_view(state_->device);
}

RPMAPP_DECL expected<long> Endpoint::share_count() const noexcept {
  if (!state_) return detail::fail(detail::moved_from("Endpoint::share_count"));
  return detail::handle_count(*state_);
}

RPMAPP_DECL expected<void> Endpoint::shutdown() && noexcept {
  if (!state_) return detail::fail(detail::moved_from("Endpoint::shutdown"));
  return detail::named("Endpoint::shutdown", release({"Endpoint::shutdown", LogLevel::warning}));
}

RPMAPP_END_NAMESPACE
