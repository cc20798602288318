// Which device contexts a Peer may use: librdmacm's own (rdma_get_devices), compared by
// pointer, because rdma_create_qp accepts only a protection domain on the cm_id's context.
#pragma once

#include <rpmapp/detail/provider.hpp>
#include <rpmapp/error.hpp>

#include <string_view>

RPMAPP_BEGIN_NAMESPACE
namespace detail {

/// Checks that `context` is one of librdmacm's own device contexts (rdma_get_devices).
/// librdmacm gives every cm_id its own context of the device, and rdma_create_qp refuses
/// a protection domain on any other context (EINVAL), even one of the same device.
expected<void> check_cm_context(const char* call, ibv_context* context) noexcept;

/// The inval for a cm_id whose device context `cm` is not the Peer's `peer`: `what`
/// names the id ("address X belongs to"). Contexts are compared by pointer: a queue pair
/// can only be created with a protection domain on the cm_id's own context.
Error context_mismatch(const char* call, std::string_view what, const ibv_context* cm,
                       const ibv_context* peer) noexcept;

}  // namespace detail
RPMAPP_END_NAMESPACE

#if !defined(RPMAPP_SEPARATE_COMPILATION)
#  include <rpmapp/impl/detail_device_context.ipp>
#endif
