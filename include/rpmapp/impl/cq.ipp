// rpmapp::Cq's definitions off the data path: its fd, and the errors of its failure paths.
#pragma once

#include <rpmapp/cq.hpp>

#include <cerrno>
#include <cstddef>

RPMAPP_BEGIN_NAMESPACE

RPMAPP_DECL Error detail::no_completion_channel(const char* call) noexcept {
  return invalid(call, "the connection has no completion channel (ConnConfig::completion_channel is false): "
                       "poll with Cq::get");
}

RPMAPP_DECL Error detail::on_shared_cq(const char* call) noexcept {
  return invalid(call, "the connection's completions go to a shared CQ (ConnConfig::shared_cq): wait on "
                       "SharedCq::cq(), whose completions are tagged with their connections");
}

RPMAPP_DECL Error detail::poll_error(int n, std::size_t room) noexcept {
  if (n < 0) return make_error(errc::provider, 0, "ibv_poll_cq", "returned {}", n);
  return make_error(errc::unknown, 0, "ibv_poll_cq", "returned {} completions for room for {}", n, room);
}

RPMAPP_DECL expected<void> detail::make_comp_channel(CompChannel& out, ibv_context* verbs) noexcept {
  errno = 0;
  out.reset(provider().create_comp_channel(verbs));
  if (!out) return fail(provider_error("ibv_create_comp_channel", errno));
  return {};
}

RPMAPP_DECL expected<void> detail::make_cq(CompletionQueue& out, ibv_context* verbs, std::uint32_t size,
                                   ibv_comp_channel* channel, int vector) noexcept {
  const Provider& p = provider();
  errno = 0;
  out.reset(p.create_cq(verbs, static_cast<int>(size), nullptr, channel, vector));
  if (!out) return fail(provider_error("ibv_create_cq", errno));
  if (channel == nullptr) return {};
  if (int rc = p.req_notify_cq(out.get(), 0); rc != 0)
    return fail(provider_error("ibv_req_notify_cq", rc));
  return {};
}

RPMAPP_DECL expected<int> Cq::fd() const noexcept {
  if (!cq_) return detail::fail(empty("Cq::fd"));
  if (!channel_) return detail::fail(detail::no_completion_channel("Cq::fd"));
  return channel_->fd;
}

RPMAPP_DECL expected<ibv_cq*> Cq::native() const noexcept {
  if (!cq_) return detail::fail(empty("Cq::native"));
  return cq_;
}

RPMAPP_DECL expected<bool> Cq::shared_channel() const noexcept {
  if (!cq_) return detail::fail(empty("Cq::shared_channel"));
  return shared_;
}

RPMAPP_END_NAMESPACE
