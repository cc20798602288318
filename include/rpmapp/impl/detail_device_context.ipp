// Definitions of rpmapp/detail/device_context.hpp: checking a Peer's device contexts.
#pragma once

#include <rpmapp/detail/device_context.hpp>

#include <rpmapp/detail/address.hpp>
#include <rpmapp/detail/errors.hpp>
#include <rpmapp/log.hpp>

#include <algorithm>
#include <cerrno>
#include <new>

RPMAPP_BEGIN_NAMESPACE
namespace detail {

// Whether every device a Peer still uses is in libibverbs' list of present devices, so that
// librdmacm's sync closes no context under a Peer. A list that cannot be read is a no.
RPMAPP_DECL bool peers_devices_present(const Provider& p, const DeviceRegistry& registry) noexcept {
  int count = 0;
  ibv_device** present = p.get_device_list(&count);
  if (present == nullptr) return false;
  const bool all = std::all_of(registry.entries.begin(), registry.entries.end(), [&](const auto& entry) {
    return std::find(present, present + count, entry.context->device) != present + count;
  });
  p.free_device_list(present);
  return all;
}

RPMAPP_DECL bool librdmacm_sync_safe(const Provider& p) noexcept {
  auto& registry = device_registry();
  if (registry.removed.load(std::memory_order_relaxed) == 0) [[likely]]
    return true;
  std::lock_guard lock(registry.mutex);
  return peers_devices_present(p, registry);
}

RPMAPP_DECL expected<void> check_cm_context(const char* call, ibv_context* context) noexcept {
  const Provider& p = provider();
  // rdma_get_devices would close a removed device's context under its Peers: unchecked
  // then (a context not librdmacm's still fails, later, in rdma_create_qp)
  if (!librdmacm_sync_safe(p)) [[unlikely]] {
    log(LogLevel::debug, call, Error(errc::provider, ENODEV, "rdma_get_devices",
                                     "not called while a Peer's device is removed: the context is not checked"));
    return {};
  }
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

RPMAPP_DECL DeviceRegistry& device_registry() noexcept {
  static DeviceRegistry* const registry = new DeviceRegistry;  // never destroyed: Peers may outlive statics
  return *registry;
}

RPMAPP_DECL DeviceRegistry::Entry* find_device(DeviceRegistry& registry, const ibv_context* context) noexcept {
  for (auto& entry : registry.entries)
    if (entry.context == context) return &entry;
  return nullptr;
}

RPMAPP_DECL expected<void> use_device(const char* call, ibv_context* context) noexcept {
  auto& registry = device_registry();
  std::lock_guard lock(registry.mutex);
  if (auto* entry = find_device(registry, context)) {
    ++entry->peers;
    return {};
  }
  try {
    registry.entries.push_back({context, 1, false});
  } catch (const std::bad_alloc&) {
    return fail(Error(errc::nomem, ENOMEM, call, "memory allocation failed"));
  }
  return {};
}

RPMAPP_DECL void mark_device_removed(const ibv_context* context) noexcept {
  auto& registry = device_registry();
  {
    std::lock_guard lock(registry.mutex);
    auto* entry = find_device(registry, context);
    if (entry == nullptr || entry->removed) return;
    entry->removed = true;
    registry.removed.fetch_add(1, std::memory_order_relaxed);
  }
  if (auto hook = registry.removal_hook.load(std::memory_order_acquire)) hook(context);
}

RPMAPP_DECL bool any_device_removed() noexcept {
  return device_registry().removed.load(std::memory_order_relaxed) != 0;
}

RPMAPP_DECL bool device_removed(const ibv_context* context) noexcept {
  if (!any_device_removed()) [[likely]]
    return false;
  auto& registry = device_registry();
  std::lock_guard lock(registry.mutex);
  const auto* entry = find_device(registry, context);
  return entry != nullptr && entry->removed;
}

RPMAPP_DECL Error removed_device_error(const char* call, const ibv_context* context) noexcept {
  return make_error(errc::provider, ENODEV, call,
                    "device {} was removed (RDMA_CM_EVENT_DEVICE_REMOVAL): release every "
                    "connection, endpoint, region and Peer of it; open a new Peer once it is back",
                    device_name(context));
}

RPMAPP_DECL void release_device(const Provider& p, ibv_context* context) noexcept {
  auto& registry = device_registry();
  std::lock_guard lock(registry.mutex);
  auto* entry = find_device(registry, context);
  if (entry == nullptr || --entry->peers > 0) return;
  if (entry->removed) {
    registry.removed.fetch_sub(1, std::memory_order_relaxed);
    registry.sync_due = true;
  }
  registry.entries.erase(registry.entries.begin() + (entry - registry.entries.data()));
  if (!registry.sync_due || !peers_devices_present(p, registry)) return;
  // librdmacm closes the removed device's context here (when no cm_id holds it); a sync
  // that failed is tried again by the next last Peer
  if (ibv_context** list = p.get_devices(nullptr)) {
    p.free_devices(list);
    registry.sync_due = false;
  }
}

}  // namespace detail
RPMAPP_END_NAMESPACE
