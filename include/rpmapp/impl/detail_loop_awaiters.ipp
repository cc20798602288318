// rpmapp/detail/loop_awaiters.hpp's definitions: LoopAccess and the connection-management awaiters' attempts.
#pragma once

#include <rpmapp/detail/loop_awaiters.hpp>

#include <algorithm>

RPMAPP_BEGIN_NAMESPACE
namespace detail {

RPMAPP_DECL expected<ConnReq> LoopAccess::take_request(const char* call, ListenerState& listener,
                                                       const KeptConfig& kept) {
  auto core = accept_request(call, listener, kept.config, kept.shared, Wait::none());
  if (!core) return fail(core.error());
  return ConnReq(std::move(*core), true);
}

RPMAPP_DECL bool NextConnReqAwaiter::attempt() noexcept {
  if (listener_ == nullptr) return finish(invalid(call(), "the endpoint is empty (moved from or shut down)"));
  if (!config_ok_) return finish(config_ok_.error());
  auto request = no_throw(call(), [&] { return LoopAccess::take_request(call(), *listener_, config_); });
  if (!request && request.error() == errc::no_event) return false;
  result_.emplace(std::move(request));
  return true;
}

RPMAPP_DECL bool NextEventAwaiter::attempt() noexcept {
  if (conn_ == nullptr) return finish(invalid(call(), "the Conn is empty (moved from or closed)"));
  auto event = next_conn_event(call(), *conn_, Deadline(Wait::none()));
  if (!event && event.error() == errc::no_event) return false;
  result_ = event;
  return true;
}

RPMAPP_DECL bool ResolveAwaiter::attempt() noexcept {
  if (!pending_) return finish(invalid(call(), "the request is empty (moved from or consumed)"));
  // A failed step releases the request's channel inside try_wait: out of epoll first.
  const bool watching = this->watching();
  if (watching) core()->unwatch(*this);
  auto request = std::move(pending_).try_wait();
  if (!request && request.error() == errc::no_event && pending_) {
    if (watching)
      if (auto ok = watch(); !ok) return finish(ok.error());
    return false;
  }
  result_.emplace(std::move(request));
  return true;
}

RPMAPP_DECL ConnectAwaiter::ConnectAwaiter(LoopCore*
core, const Peer& peer, std::string_view addr, std::string_view port,
                                           const ConnConfig& config, std::span<const std::byte> private_data,
                                           std::chrono::milliseconds timeout) noexcept
    : Awaiter(core, "EventLoop::connect", timeout), peer_(&peer), addr_(addr), port_(port), config_(config) {
  // An empty Peer fails in ConnReq::start; a Peer's transport allows at most data_'s size.
  if (!peer) return;
  if (auto ok = check_private_data(call(), private_data, *peer.state(), PrivateDataUse::connect); !ok) {
    refused_.emplace(ok.error());
    return;
  }
  std::copy(private_data.begin(), private_data.end(), data_.begin());
  data_size_ = private_data.size();
}

RPMAPP_DECL bool ConnectAwaiter::attempt() noexcept {
  if (stage_ == Stage::start) {
    if (refused_) return finish(*refused_);
    auto pending = ConnReq::start(*peer_, addr_, port_, config_);
    if (!pending) return finish(pending.error());
    pending_.emplace(std::move(*pending));
    stage_ = Stage::resolving;
  }
  if (stage_ == Stage::resolving) {
    // A failed step releases the request's channel inside try_wait: out of epoll first.
    const bool watching = this->watching();
    if (watching) core()->unwatch(*this);
    auto request = std::move(*pending_).try_wait();
    if (!request && request.error() == errc::no_event && *pending_) {
      if (watching)
        if (auto ok = watch(); !ok) return finish(ok.error());
      return false;
    }
    pending_.reset();
    if (!request) return finish(request.error());
    const std::span<const std::byte> data(data_.data(), data_size_);
    if (!LoopAccess::core(*request)->peer->iwarp) return connected(std::move(*request).connect(data), watching);
    auto taken = LoopAccess::take_for_connect(std::move(*request), data);
    if (!taken) return finish(taken.error());
    auto background = BackgroundConnect::start(std::move(*taken), data, LoopAccess::connect_call);
    if (!background) return finish(background.error());
    background_ = std::move(*background);
    stage_ = Stage::connecting;
    if (watching)
      if (auto ok = watch(); !ok) return finish(ok.error());
  }
  if (stage_ == Stage::connecting) {
    if (!background_->finished()) return false;
    // Out of epoll before the fd closes with background_.
    const bool watching = this->watching();
    if (watching) core()->unwatch(*this);
    auto taken = background_->take();
    background_.reset();
    if (!taken) return finish(taken.error());
    return connected(LoopAccess::conn(std::move(*taken)), watching);
  }
  return established();
}

RPMAPP_DECL bool ConnectAwaiter::connected(expected<Conn> conn, bool watching) noexcept {
  if (!conn) return finish(conn.error());
  conn_.emplace(std::move(*conn));
  stage_ = Stage::establishing;
  // Waiting (not in await_ready): now on the connection's channel.
  if (watching)
    if (auto ok = watch(); !ok) return finish(ok.error());
  return established();
}

RPMAPP_DECL bool ConnectAwaiter::established() noexcept {
  auto event = next_conn_event(call(), *LoopAccess::core(*conn_), Deadline(Wait::none()));
  if (!event && event.error() == errc::no_event) return false;
  if (!event) return finish(event.error());
  switch (*event) {
    case ConnEvent::established: stage_ = Stage::done; return true;
    case ConnEvent::rejected: return finish(Error(errc::provider, ECONNREFUSED, "rdma_connect", "the peer rejected the request"));
    case ConnEvent::unreachable: return finish(Error(errc::provider, EHOSTUNREACH, "rdma_connect", "the peer is unreachable"));
    default:
      return finish(make_error(errc::provider, ECONNRESET, "rdma_connect", "the connection ended before it was established ({})",
                               to_string(*event)));
  }
}

}  // namespace detail
RPMAPP_END_NAMESPACE
