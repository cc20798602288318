// rpmapp::SharedEventChannel's definitions.
#pragma once

#include <rpmapp/shared_event_channel.hpp>

#include <cerrno>
#include <utility>

RPMAPP_BEGIN_NAMESPACE

RPMAPP_DECL expected<SharedEventChannel> SharedEventChannel::create() noexcept {
  constexpr const char* call = "SharedEventChannel::create";
  return detail::no_throw(call, [&]() -> expected<SharedEventChannel> {
    auto state = std::make_shared<detail::EventRoutes>();
    errno = 0;
    state->channel.reset(state->seam->create_event_channel());
    if (!state->channel) return detail::fail(detail::provider_error("rdma_create_event_channel", errno));
    if (auto ok = detail::make_nonblocking(state->channel.get()); !ok) return detail::fail(ok.error());
    return SharedEventChannel(std::move(state));
  });
}

RPMAPP_DECL expected<int> SharedEventChannel::fd() const noexcept {
  if (!state_) return detail::fail(detail::moved_from("SharedEventChannel::fd"));
  return state_->channel->fd;
}

RPMAPP_DECL expected<std::size_t> SharedEventChannel::connections() const noexcept {
  if (!state_) return detail::fail(detail::moved_from("SharedEventChannel::connections"));
  return state_->size();
}

RPMAPP_DECL expected<void> SharedEventChannel::close() && noexcept {
  if (!state_) return detail::fail(detail::moved_from("SharedEventChannel::close"));
  state_.reset();
  return {};
}

RPMAPP_END_NAMESPACE
