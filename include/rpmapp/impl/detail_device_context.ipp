// Definitions of rpmapp/detail/device_context.hpp: checking a Peer's device contexts.
#pragma once

#include <rpmapp/detail/device_context.hpp>

#include <rpmapp/detail/address.hpp>
#include <rpmapp/detail/errors.hpp>

#include <cerrno>

RPMAPP_BEGIN_NAMESPACE
namespace detail {

RPMAPP_DECL expected<void> check_cm_context(const char* call, ibv_context* context) noexcept {
  const Provider& p = provider();
  int count = 0;
  errno = 0;
  ibv_context** list = p.get_devices(&count);
  if (list == nullptr) {
    const int e = errno;
    if (e == 0) return fail(Error(errc::unknown, 0, "rdma_get_devices", "no errno set"));
    return fail(provider_error("rdma_get_devices", e));
  }
  const std::string_view name = device_name(context);
  bool owned = false;
  bool same_device = false;
  for (int i = 0; i < count && list[i] != nullptr; ++i) {
    if (list[i] == context) owned = true;
    else if (list[i]->device == context->device || device_name(list[i]) == name) same_device = true;
  }
  p.free_devices(list);
  if (owned) return {};
  if (same_device)
    return fail(invalid(call,
                        "the context of device {} is not librdmacm's (from ibv_open_device?); "
                        "take {}'s context from rdma_get_devices() or use Peer::from_address",
                        name, name));
  return fail(invalid(call,
                      "device {} is not one of librdmacm's devices (rdma_get_devices()); "
                      "use a context from rdma_get_devices() or Peer::from_address",
                      name));
}

RPMAPP_DECL Error context_mismatch(const char* call, std::string_view what, const ibv_context* cm,
                                   const ibv_context* peer) noexcept {
  const std::string_view cm_name = device_name(cm);
  const std::string_view peer_name = device_name(peer);
  if (cm_name != peer_name)
    return invalid(call, "{} device {}, but the peer is on {}", what, cm_name, peer_name);
  return invalid(call, "{} device {} (librdmacm's context), but the peer has another context of {}",
                 what, cm_name, peer_name);
}

}  // namespace detail
RPMAPP_END_NAMESPACE
