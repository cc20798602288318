// The listening side: the listener's state, starting and stopping it, the registry of
// shared listeners, and turning a CONNECT_REQUEST event into a request's resources.
#pragma once

#include <rpmapp/config.hpp>
#include <rpmapp/detail/address.hpp>
#include <rpmapp/detail/cm_event.hpp>
#include <rpmapp/detail/connection.hpp>
#include <rpmapp/detail/errors.hpp>
#include <rpmapp/detail/handles.hpp>
#include <rpmapp/peer.hpp>

#include <compare>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <string_view>
#include <vector>

RPMAPP_BEGIN_NAMESPACE
namespace detail {

struct ListenerState;

/// A shared listener's key: the address as the kernel binds it. Family and canonical text
/// ("::0" and "::" are one key; "0.0.0.0" and "::" are two; the scope as an interface
/// name), and port.
struct ListenerKey {
  int family = 0;
  std::string address;
  std::uint16_t port = 0;
  auto operator<=>(const ListenerKey&) const = default;
};

/// Listeners made by listen_shared. `mutex` also guards each ListenerState's `handles`.
struct ListenerRegistry {
  std::mutex mutex;
  std::map<ListenerKey, std::weak_ptr<ListenerState>> listeners;
};

/// Never destroyed: an Endpoint held in a global is destroyed at exit, possibly after a
/// function-local static made later would be. The pointer keeps it reachable, so
/// LeakSanitizer does not report it.
inline ListenerRegistry& listener_registry() {
  static ListenerRegistry* const registry = new ListenerRegistry;
  return *registry;
}

/// The wildcard listeners alive: a device's removal reaches none of them (the kernel tells
/// a wildcard listener nothing of one device going), so mark_device_removed's hook has
/// each let go of its Peers of that device at once, not at its next request, which an
/// idle listener may never take while `rdma link delete` waits for those Peers.
struct WildcardListeners {
  std::mutex mutex;
  std::vector<ListenerState*> listeners;
};
/// Never destroyed, as listener_registry.
inline WildcardListeners& wildcard_listeners() {
  static WildcardListeners* const listeners = new WildcardListeners;
  return *listeners;
}

/// The node a listener binds for `addr` first: "" is the IPv6 (dual-stack) wildcard.
inline std::string_view listen_node(std::string_view addr) noexcept {
  return addr.empty() ? std::string_view("::") : addr;
}

/// The registry key a listen_shared call for a numeric `addr` and `port` looks up: as
/// canonical_address writes it, which is what address_of gives for the bound address.
ListenerKey listener_key(std::string_view addr, std::uint16_t port);

/// The key of a bound listener: its address as the kernel bound it.
inline ListenerKey listener_key(const sockaddr* bound) {
  return {bound->sa_family, address_of(bound), port_of(bound)};
}

/// Member order is teardown order, reversed: the listening id before its channel.
struct ListenerState {
  const Provider* seam = current_provider;  // the provider that makes and releases it
  /// The Peers serving requests, at most one per device. Guarded by `peers_mutex`: a
  /// listen_shared caller may join while handles take requests in other threads.
  std::vector<std::shared_ptr<PeerState>> peers;
  mutable std::mutex peers_mutex;
  EventChannel channel;
  CmId id;
  std::string device;  // "" for a wildcard listener
  std::uint16_t port = 0;
  bool shared = false;
  bool removed = false;  // its device was removed (DEVICE_REMOVAL): every later take fails
  bool wildcard_listed = false;  // in wildcard_listeners() until destroyed
  ListenerKey key;   // shared listeners only
  long handles = 1;  // Endpoint handles; for shared listeners guarded by the registry mutex
  /// A shared listener's connection request handler (a ConnReqHandler), fixed when it is
  /// created: listen_shared callers must pass the same one (compared by pointer).
  std::shared_ptr<void> handler;
  /// Who stops a listener no Endpoint stopped: the call starting it, on its failure paths.
  Teardown teardown{"detail::ListenerState", LogLevel::warning};

  ListenerState() = default;
  ListenerState(const ListenerState&) = delete;
  ListenerState& operator=(const ListenerState&) = delete;
  ~ListenerState();

  /// Rejects and acknowledges the requests already queued on the channel, then destroys
  /// the listening id and the channel. Never blocks: the queue is drained with
  /// non-blocking reads (another handle's thread may take a request meanwhile).
  /// Idempotent; reports the first failure (the later ones, each rejected request and
  /// each other event dropped are logged under `by.where`).
  expected<void> stop(Teardown by) noexcept;
};

/// Lets go of `listener`'s Peers whose device was reported removed (their protection
/// domains go with them, unless held elsewhere), so that the removal need not wait for the
/// listener: a wildcard listener spans devices and the kernel tells it nothing of one
/// going. Called for each wildcard listener when a device is marked removed
/// (drop_removed_peers_everywhere), and for each request taken, before its Peer is looked
/// up (a request read before the mark).
void drop_removed_peers(ListenerState& listener) noexcept;
/// DeviceRegistry's removal hook: drop_removed_peers on every wildcard listener.
void drop_removed_peers_everywhere(const ibv_context* removed) noexcept;

expected<std::shared_ptr<ListenerState>> start_listening(
    const char* call, std::span<const Peer> peers, std::string_view addr, std::string_view port,
    const ListenOptions& options);

/// A further listen_shared caller with `peer` on the existing shared `listener`: the same
/// Peer shares it; a Peer on a device the wildcard listener does not serve yet joins it
/// (that device's requests are served with it from then on); anything else is inval, as
/// its connections would be in another protection domain than its memory.
/// The caller holds the registry lock.
expected<void> join_listener(const char* call, ListenerState& listener, const Peer& peer);

expected<std::shared_ptr<ListenerState>> listen_shared(const char* call, const Peer& peer,
                                                      std::string_view addr,
                                                      std::string_view port,
                                                      const ListenOptions& options,
                                                      std::shared_ptr<void> handler = {});

/// Drops one handle of a listener; the last one stops it and reports the result.
/// Shared listeners: counting, removal from the registry and stop() are one step under the
/// registry lock, so no other handle can be counted as the last, and no listen_shared can
/// find the port still bound by an id about to be destroyed (EADDRINUSE) - whatever its
/// key: a wildcard and a specific address on one port conflict in the kernel too. This
/// holds other listen_shared calls for one teardown, which is bounded: the drain reads
/// non-blocking, rdma_destroy_id waits only for the kernel's handlers of this id.
expected<void> release_listener(std::shared_ptr<ListenerState> state, Teardown by) noexcept;

/// How many Endpoint handles `state` has.
long handle_count(const ListenerState& state);

/// Takes the next CONNECT_REQUEST of `listener` and builds the request's resources: its
/// cm_id (rejected if anything fails), queue pair on `shared` (config's shared queues,
/// shared_queues_of), and an event channel of its own.
expected<std::unique_ptr<ConnectionCore>> accept_request(const char* call,
                                                         ListenerState& listener,
                                                         const ConnConfig& config,
                                                         const SharedQueues& shared,
                                                         Wait wait);

}  // namespace detail
RPMAPP_END_NAMESPACE

#if !defined(RPMAPP_SEPARATE_COMPILATION)
#  include <rpmapp/impl/detail_listener.ipp>
#endif
