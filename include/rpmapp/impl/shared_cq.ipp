// rpmapp::SharedCq's definitions: creation, release and the shared state's teardown.
#pragma once

#include <rpmapp/shared_cq.hpp>

#include <cerrno>
#include <memory>
#include <utility>

RPMAPP_BEGIN_NAMESPACE

RPMAPP_DECL detail::SharedCqState::~SharedCqState() {
  if (auto released = release(teardown); !released) [[unlikely]]
    log(teardown.level, teardown.where, released.error());
}

RPMAPP_DECL expected<void> detail::SharedCqState::release(Teardown by) noexcept {
  FirstError first{by};
  if (cq) first.value_call(seam->destroy_cq(cq.release()), "ibv_destroy_cq");
  if (channel)
    first.value_call(seam->destroy_comp_channel(channel.release()), "ibv_destroy_comp_channel");
  return first.result();
}

RPMAPP_DECL expected<SharedCq> SharedCq::create(const Peer& peer, const SharedCqConfig& config) noexcept {
  constexpr const char* call = "SharedCq::create";
  if (!peer) return detail::fail(detail::moved_from(call));
  if (config.size == 0 || config.size > 0x7fffffffu)
    return detail::fail(detail::invalid(call, "size {} must be 1 to 2^31-1", config.size));
  ibv_context* context = peer.state()->context;
  if (config.size > peer.state()->max_cqe)
    return detail::fail(detail::invalid(call, "size {} is more than the {} entries per completion queue (max_cqe) "
                                              "that {} allows",
                                        config.size, peer.state()->max_cqe, detail::device_name(context)));
  if (config.completion_vector < 0 ||
      (config.completion_vector > 0 && config.completion_vector >= context->num_comp_vectors))
    return detail::fail(detail::invalid(call, "completion_vector {} is not in 0..{} (the device's vectors)",
                                        config.completion_vector, context->num_comp_vectors - 1));
  return detail::no_throw(call, [&]() -> expected<SharedCq> {
    auto state = std::make_shared<detail::SharedCqState>();
    state->teardown = {call, LogLevel::notice};  // until the SharedCq is made
    state->peer = peer.state();
    if (config.completion_channel)
      if (auto ok = detail::make_comp_channel(state->channel, context); !ok) return detail::fail(ok.error());
    if (auto ok = detail::make_cq(state->cq, context, config.size, state->channel.get(), config.completion_vector); !ok)
      return detail::fail(ok.error());
    if (auto room = state->routes.reserve(static_cast<std::size_t>(state->cq->cqe)); !room)
      return detail::fail(room.error());
    state->teardown = {"SharedCq (last reference)", LogLevel::warning};
    return SharedCq(std::move(state));
  });
}

RPMAPP_DECL SharedCq& SharedCq::operator=(SharedCq&& other) noexcept {
  if (this != &other) {
    release_logged("SharedCq::operator=");
    state_ = std::move(other.state_);
  }
  return *this;
}

RPMAPP_DECL expected<Cq> SharedCq::cq() const noexcept {
  if (!state_) return detail::fail(detail::moved_from("SharedCq::cq"));
  return Cq(state_->cq.get(), state_->channel.get(), &state_->routes);
}

RPMAPP_DECL expected<std::size_t> SharedCq::connections() const noexcept {
  if (!state_) return detail::fail(detail::moved_from("SharedCq::connections"));
  return state_->routes.size();
}

RPMAPP_DECL expected<void> SharedCq::close() && noexcept {
  if (!state_) return detail::fail(detail::moved_from("SharedCq::close"));
  return detail::close_last_reference(std::move(state_), "SharedCq::close");
}

RPMAPP_DECL void SharedCq::release_logged(const char* where) noexcept {
  detail::release_last_reference_logged(std::move(state_), where);
}

RPMAPP_END_NAMESPACE
