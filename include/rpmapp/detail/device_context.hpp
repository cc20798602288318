// Which device contexts a Peer may use: librdmacm's own (rdma_get_devices), compared by
// pointer, because rdma_create_qp accepts only a protection domain on the cm_id's context.
// And which of them the kernel removed: later calls on them fail clearly, and librdmacm is
// told to let go of a removed device once no Peer uses it, which the removal waits for.
#pragma once

#include <rpmapp/detail/errors.hpp>
#include <rpmapp/detail/provider.hpp>
#include <rpmapp/error.hpp>

#include <atomic>
#include <mutex>
#include <string_view>
#include <vector>

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

/// The device contexts the process's Peers (PeerState) use, with how many use each and
/// whether the kernel reported the device removed (RDMA_CM_EVENT_DEVICE_REMOVAL on any
/// cm_id of it). A device without disassociation (rxe; mlx5 has it) stays half-removed,
/// and `rdma link delete` waits, until every process closes its context; librdmacm closes
/// its own only when it next syncs its device list (rdma_get_devices) with nothing of the
/// device left, so the last Peer of a removed device makes it sync (release_device).
struct DeviceRegistry {
  /// Told, outside the lock, of each device when it is first marked removed (listener.hpp
  /// sets it: the wildcard listeners let go of their Peers of that device at once).
  using RemovalHook = void (*)(const ibv_context*) noexcept;
  struct Entry {
    ibv_context* context;
    long peers;
    bool removed;
  };
  std::mutex mutex;
  std::vector<Entry> entries;
  std::atomic<int> removed{0};  // entries marked removed: none, and no lookup is needed
  bool sync_due = false;        // a removed device's last Peer went; librdmacm not synced yet
  std::atomic<RemovalHook> removal_hook{nullptr};
};
DeviceRegistry& device_registry() noexcept;
/// The entry of `context`, or null (the registry's mutex held).
DeviceRegistry::Entry* find_device(DeviceRegistry& registry, const ibv_context* context) noexcept;
/// Whether every device in `registry` (its mutex held) is in ibv_get_device_list's list;
/// false when the list cannot be read.
bool peers_devices_present(const Provider& p, const DeviceRegistry& registry) noexcept;

/// A PeerState starts using `context`. Errors: nomem.
expected<void> use_device(const char* call, ibv_context* context) noexcept;
/// Marks `context`'s device removed (a DEVICE_REMOVAL event on a cm_id of it), when a
/// Peer uses it, and then calls the registry's removal hook; idempotent (the hook is
/// called once per device).
void mark_device_removed(const ibv_context* context) noexcept;
/// Whether `context`'s device was reported removed (a relaxed load unless any was).
bool device_removed(const ibv_context* context) noexcept;
/// Whether any device used by a Peer was ever reported removed (a relaxed load).
bool any_device_removed() noexcept;
/// The error of a call on a removed device: provider, ENODEV, naming the device and the
/// event, and what to do.
Error removed_device_error(const char* call, const ibv_context* context) noexcept;
/// device_removed as an expected: the error above, or success.
inline expected<void> check_device(const char* call, const ibv_context* context) noexcept {
  if (device_removed(context)) [[unlikely]]
    return fail(removed_device_error(call, context));
  return {};
}
/// Whether librdmacm may sync its device list now (rdma_get_devices): true unless a Peer
/// uses a device that was reported removed and some Peer's device is gone from
/// libibverbs' list, whose context the sync would close under that Peer.
bool librdmacm_sync_safe(const Provider& p) noexcept;
/// A PeerState on `context` is released (its objects are gone). The last one of a removed
/// device has librdmacm sync its device list (rdma_get_devices, rdma_free_devices through
/// `p`), which closes librdmacm's context of the device when no cm_id holds it, so the
/// kernel can finish the removal; unless another Peer still uses a device that is gone
/// from libibverbs' list (ibv_get_device_list), whose context that sync would close under
/// it: then a later last Peer syncs.
void release_device(const Provider& p, ibv_context* context) noexcept;

}  // namespace detail
RPMAPP_END_NAMESPACE

#if !defined(RPMAPP_SEPARATE_COMPILATION)
#  include <rpmapp/impl/detail_device_context.ipp>
#endif
