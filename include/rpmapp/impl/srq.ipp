// rpmapp::Srq's definitions off the data path: creation, release and the shared state's teardown.
#pragma once

#include <rpmapp/srq.hpp>

#include <cerrno>
#include <memory>
#include <utility>

RPMAPP_BEGIN_NAMESPACE

RPMAPP_DECL detail::SrqState::~SrqState() {
  if (auto released = release(teardown); !released) [[unlikely]]
    log(teardown.level, teardown.where, released.error());
}

RPMAPP_DECL expected<void> detail::SrqState::release(Teardown by) noexcept {
  FirstError first{by};
  if (rcq) first.value_call(seam->destroy_cq(rcq.release()), "ibv_destroy_cq");
  if (channel)
    first.value_call(seam->destroy_comp_channel(channel.release()), "ibv_destroy_comp_channel");
  if (srq) first.value_call(seam->destroy_srq(srq.release()), "ibv_destroy_srq");
  return first.result();
}

RPMAPP_DECL expected<Srq> Srq::create(const Peer& peer, const SrqConfig& config) noexcept {
  constexpr const char* call = "Srq::create";
  if (!peer) return detail::fail(detail::moved_from(call));
  if (config.rq_size == 0) return detail::fail(detail::invalid(call, "rq_size must be at least 1"));
  if (config.rq_size > 0x7fffffffu || config.rcq_size > 0x7fffffffu)
    return detail::fail(detail::invalid(call, "rq_size and rcq_size must fit in an int"));
  const detail::PeerState& device = *peer.state();
  if (config.rq_size > device.max_srq_wr)
    return detail::fail(detail::invalid(call, "rq_size {} is more than the {} work requests per shared receive "
                                              "queue (max_srq_wr) that {} allows",
                                        config.rq_size, device.max_srq_wr, detail::device_name(device.context)));
  if (config.rcq_size > device.max_cqe)
    return detail::fail(detail::invalid(call, "rcq_size {} is more than the {} entries per completion queue "
                                              "(max_cqe) that {} allows",
                                        config.rcq_size, device.max_cqe, detail::device_name(device.context)));
  return detail::no_throw(call, [&]() -> expected<Srq> {
    const detail::Provider& p = detail::provider();
    auto state = std::make_shared<detail::SrqState>();
    state->teardown = {call, LogLevel::notice};  // until the Srq is made
    state->peer = peer.state();
    ibv_srq_init_attr attr{};
    attr.attr.max_wr = config.rq_size;
    attr.attr.max_sge = 1;
    errno = 0;
    state->srq.reset(p.create_srq(state->peer->pd.get(), &attr));
    if (!state->srq) return detail::fail(detail::provider_error("ibv_create_srq", errno));
    if (config.rcq_size > 0) {
      ibv_context* context = state->peer->context;
      if (auto ok = detail::make_comp_channel(state->channel, context); !ok) return detail::fail(ok.error());
      if (auto ok = detail::make_cq(state->rcq, context, config.rcq_size, state->channel.get(), 0); !ok)
        return detail::fail(ok.error());
      if (auto room = state->routes.reserve(static_cast<std::size_t>(state->rcq->cqe)); !room)
        return detail::fail(room.error());
    }
    state->teardown = {"Srq (last reference)", LogLevel::warning};
    return Srq(std::move(state));
  });
}

RPMAPP_DECL Srq& Srq::operator=(Srq&& other) noexcept {
  if (this != &other) {
    release_logged("Srq::operator=");
    state_ = std::move(other.state_);
  }
  return *this;
}

RPMAPP_DECL expected<void> Srq::close() && noexcept {
  if (!state_) return detail::fail(detail::moved_from("Srq::close"));
  return detail::close_last_reference(std::move(state_), "Srq::close");
}

RPMAPP_DECL void Srq::release_logged(const char* where) noexcept {
  detail::release_last_reference_logged(std::move(state_), where);
}

RPMAPP_DECL expected<Cq> Srq::rcq() const noexcept {
  if (!state_) return detail::fail(detail::moved_from("Srq::rcq"));
  return Cq(state_->rcq.get(), state_->channel.get(), &state_->routes);
}

RPMAPP_DECL expected<ibv_srq*> Srq::native() const noexcept {
  if (!state_) return detail::fail(detail::moved_from("Srq::native"));
  return state_->srq.get();
}

RPMAPP_END_NAMESPACE
