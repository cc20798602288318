// rpmapp::Peer: a protection domain on one RDMA device.
#pragma once

#include <rpmapp/detail/address.hpp>
#include <rpmapp/detail/cm_event.hpp>
#include <rpmapp/detail/device_context.hpp>
#include <rpmapp/detail/errors.hpp>
#include <rpmapp/detail/handles.hpp>
#include <rpmapp/error.hpp>

#include <chrono>
#include <memory>
#include <string>
#include <string_view>

RPMAPP_BEGIN_NAMESPACE

namespace detail {
/// Shared by a Peer and everything made from it, so that the protection domain outlives
/// every queue pair created on it. The device context is librdmacm's (never closed).
struct PeerState {
  const Provider* seam = current_provider;  // the provider that makes and releases it
  ibv_context* context = nullptr;
  ProtectionDomain pd;
};
}  // namespace detail

/// Which side of an address Peer::from_address looks for.
enum class AddressKind {
  local,   ///< the device that owns the address (bind)
  remote,  ///< the device that reaches the address (resolve)
};

/// A protection domain on one RDMA device (librpma's rpma_peer). Move-only handle; the
/// domain lives until the Peer and everything made from it (endpoints, requests,
/// connections) are gone, so destroying a Peer first is safe.
/// Thread safety: a Peer may be used from several threads at once (all its calls are
/// const); creating and destroying Peers is thread-safe.
class Peer {
 public:
  /// Allocates a protection domain on `context`, which must be one of librdmacm's own
  /// device contexts: an element of rdma_get_devices()'s list (those stay open for the
  /// process), or what Peer::from_address finds. librdmacm creates queue pairs on its own
  /// context of the device, so a context the caller opened with ibv_open_device, even of
  /// the same device, could never carry a connection.
  /// Errors:
  /// - inval: `context` is null; it is not one of librdmacm's contexts (the reason names
  ///   the device and how to get a usable context).
  /// - nomem: ibv_alloc_pd or rdma_get_devices failed with ENOMEM, or out of memory.
  /// - provider: rdma_get_devices or ibv_alloc_pd failed (errno in the Error).
  static expected<Peer> open(ibv_context* context) noexcept {
    constexpr const char* call = "Peer::open";
    if (context == nullptr) return detail::fail(detail::invalid(call, "device context is null"));
    if (auto owned = detail::check_cm_context(call, context); !owned)
      return detail::fail(owned.error());
    return detail::no_throw(call, [&]() -> expected<Peer> {
      auto state = std::make_shared<detail::PeerState>();
      errno = 0;
      state->pd.reset(detail::provider().alloc_pd(context));
      if (!state->pd) {
        int e = errno;
        if (e == 0) return detail::fail(Error(errc::unknown, 0, "ibv_alloc_pd", "no errno set"));
        return detail::fail(detail::provider_error("ibv_alloc_pd", e));
      }
      state->context = context;
      return Peer(std::move(state));
    });
  }

  /// Opens a Peer on the device that owns (`local`) or reaches (`remote`) the numeric
  /// address `addr`, as rpma_utils_get_ibv_context does. A remote lookup resolves the
  /// address and may block up to `timeout`.
  /// Errors:
  /// - inval: `addr` is not a numeric IPv4/IPv6 address, is link-local IPv6 without its
  ///   scope ("fe80::1%eth0"), or has a scope naming no interface or on another kind of
  ///   address; no RDMA device has it.
  /// - provider: rdma_create_id, rdma_getaddrinfo, rdma_bind_addr, rdma_resolve_addr,
  ///   rdma_get_devices or ibv_alloc_pd failed (errno and call in the Error).
  /// - nomem: out of memory.
  static expected<Peer> from_address(std::string_view addr, AddressKind kind,
                                     std::chrono::milliseconds timeout =
                                         std::chrono::milliseconds(1000)) noexcept {
    constexpr const char* call = "Peer::from_address";
    if (auto ok = detail::check_numeric_address(call, addr); !ok) return detail::fail(ok.error());
    return detail::no_throw(call, [&]() -> expected<Peer> {
      rdma_cm_id* raw = nullptr;
      errno = 0;
      if (detail::provider().create_id(nullptr, &raw, nullptr, RDMA_PS_TCP) != 0)
        return detail::fail(detail::provider_error("rdma_create_id", errno));
      detail::CmId id(raw);
      auto info = detail::get_addr_info(std::string(addr), {}, kind == AddressKind::local);
      if (!info) return detail::fail(info.error());
      errno = 0;
      if (kind == AddressKind::local) {
        if (detail::provider().bind_addr(id.get(), (*info)->ai_src_addr) != 0)
          return detail::fail(detail::provider_error("rdma_bind_addr", errno));
      } else if (detail::provider().resolve_addr(id.get(), nullptr, (*info)->ai_dst_addr,
                                                 detail::Wait::bounded(timeout).ms) != 0) {
        return detail::fail(detail::provider_error("rdma_resolve_addr", errno));
      }
      if (id->verbs == nullptr)
        return detail::fail(detail::invalid(call, "no RDMA device has address {}", addr));
      return open(id->verbs);
    });
  }

  Peer(Peer&&) noexcept = default;
  Peer& operator=(Peer&&) noexcept = default;
  ~Peer() = default;

  /// False when moved from or closed.
  explicit operator bool() const noexcept { return state_ != nullptr; }

  /// The device context. Errors: inval when empty.
  expected<ibv_context*> context() const noexcept {
    if (!state_) return detail::fail(detail::moved_from("Peer::context"));
    return state_->context;
  }
  /// The protection domain. Errors: inval when empty.
  expected<ibv_pd*> pd() const noexcept {
    if (!state_) return detail::fail(detail::moved_from("Peer::pd"));
    return state_->pd.get();
  }
  /// The device's name, e.g. "rxe0". Errors: inval when empty.
  expected<std::string> device_name() const noexcept {
    if (!state_) return detail::fail(detail::moved_from("Peer::device_name"));
    return detail::no_throw("Peer::device_name", [&]() -> expected<std::string> {
      return std::string(detail::device_name(state_->context));
    });
  }

  /// Releases this handle. When nothing else uses the protection domain it is deallocated
  /// now and a failure is reported; otherwise it goes when its last user goes.
  /// The Peer is empty afterwards, whatever the result.
  /// Errors: inval when empty; provider: ibv_dealloc_pd failed.
  expected<void> close() && noexcept {
    if (!state_) return detail::fail(detail::moved_from("Peer::close"));
    auto state = std::move(state_);
    if (state.use_count() == 1) {
      // libibverbs' destroy calls return the errno value instead of setting errno
      if (int rc = state->seam->dealloc_pd(state->pd.release()); rc != 0)
        return detail::fail(detail::provider_error("ibv_dealloc_pd", rc));
    }
    return {};
  }

  /// Internal: the shared state, for the types made from a Peer.
  const std::shared_ptr<detail::PeerState>& state() const noexcept { return state_; }

 private:
  explicit Peer(std::shared_ptr<detail::PeerState> state) noexcept : state_(std::move(state)) {}
  std::shared_ptr<detail::PeerState> state_;
};

RPMAPP_END_NAMESPACE
