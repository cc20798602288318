// Which device contexts a Peer may use: librdmacm's own (rdma_get_devices), compared by
// pointer, because rdma_create_qp accepts only a protection domain on the cm_id's context.
#pragma once

#include <rpmapp/detail/address.hpp>
#include <rpmapp/detail/errors.hpp>
#include <rpmapp/detail/provider.hpp>
#include <rpmapp/error.hpp>

#include <cerrno>
#include <string_view>

RPMAPP_BEGIN_NAMESPACE
namespace detail {

/// Checks that `context` is one of librdmacm's own device contexts (rdma_get_devices).
/// librdmacm gives every cm_id its own context of the device, and rdma_create_qp refuses
/// a protection domain on any other context (EINVAL), even one of the same device.
inline expected<void> check_cm_context(const char* call, ibv_context* context) noexcept {
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

/// The inval for a cm_id whose device context `cm` is not the Peer's `peer`: `what`
/// names the id ("address X belongs to"). Contexts are compared by pointer: a queue pair
/// can only be created with a protection domain on the cm_id's own context.
inline Error context_mismatch(const char* call, std::string_view what, const ibv_context* cm,
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
