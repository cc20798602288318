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

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <utility>
#include <vector>

RPMAPP_BEGIN_NAMESPACE
namespace detail {

struct ListenerState;

/// Listeners made by listen_shared, by (device or "" for the wildcard, port).
struct ListenerRegistry {
  std::mutex mutex;
  std::map<std::pair<std::string, std::uint16_t>, std::weak_ptr<ListenerState>> listeners;
};

inline ListenerRegistry& listener_registry() {
  static ListenerRegistry registry;
  return registry;
}

/// Member order is teardown order, reversed: the listening id before its channel.
struct ListenerState {
  const Provider* seam = current_provider;  // the provider that makes and releases it
  std::vector<std::shared_ptr<PeerState>> peers;
  EventChannel channel;
  CmId id;
  std::string device;  // "" for a wildcard listener
  std::string address;  // the bound address, kept for shared listeners only
  std::uint16_t port = 0;
  bool shared = false;

  ListenerState() = default;
  ListenerState(const ListenerState&) = delete;
  ListenerState& operator=(const ListenerState&) = delete;
  ~ListenerState() { (void)stop(); }

  /// Rejects and acknowledges the requests already queued on the channel, then destroys
  /// the listening id and the channel. Never blocks: the queue is drained with
  /// non-blocking reads (another handle's thread may take a request meanwhile).
  /// Idempotent; reports the first failure.
  expected<void> stop() noexcept {
    const Provider& p = *seam;
    FirstError first;
    if (id) {
      for (;;) {
        auto event = next_cm_event(channel.get(), Wait::none(), p);
        if (!event) {
          if (event.error() != errc::no_event) first.note(event.error());
          break;
        }
        rdma_cm_id* request = (*event)->event == RDMA_CM_EVENT_CONNECT_REQUEST ? (*event)->id : nullptr;
        if (request != nullptr) {
          errno = 0;
          first.errno_call(p.reject(request, nullptr, 0), "rdma_reject");
        }
        if (auto acked = ack(*event); !acked) first.note(acked.error());
        if (request != nullptr) {
          errno = 0;
          first.errno_call(p.destroy_id(request), "rdma_destroy_id");
        }
      }
      errno = 0;
      first.errno_call(p.destroy_id(id.release()), "rdma_destroy_id");
    }
    if (channel) p.destroy_event_channel(channel.release());
    peers.clear();
    return first.result();
  }
};

inline expected<std::shared_ptr<ListenerState>> start_listening(
    const char* call, std::span<const Peer> peers, std::string_view addr, std::string_view port,
    const ListenOptions& options) {
  if (peers.empty()) return fail(invalid(call, "no peer given"));
  for (std::size_t i = 0; i < peers.size(); ++i) {
    if (!peers[i]) return fail(invalid(call, "peer {} is empty (moved from or closed)", i));
    for (std::size_t j = 0; j < i; ++j)
      if (device_name(peers[j].state()->context) == device_name(peers[i].state()->context))
        return fail(invalid(call, "peers {} and {} are both on device {}", j, i,
                            device_name(peers[i].state()->context)));
  }
  auto number = parse_port(call, port);
  if (!number) return fail(number.error());
  const bool wildcard = is_wildcard(addr);
  if (!wildcard)
    if (auto ok = check_numeric_address(call, addr); !ok) return fail(ok.error());
  if (options.backlog < 0) return fail(invalid(call, "backlog {} is negative", options.backlog));

  const Provider& p = provider();
  auto state = std::make_shared<ListenerState>();
  errno = 0;
  state->channel.reset(p.create_event_channel());
  if (!state->channel) return fail(provider_error("rdma_create_event_channel", errno));
  if (auto ok = make_nonblocking(state->channel.get()); !ok) return fail(ok.error());
  rdma_cm_id* id = nullptr;
  errno = 0;
  if (p.create_id(state->channel.get(), &id, nullptr, RDMA_PS_TCP) != 0)
    return fail(provider_error("rdma_create_id", errno));
  state->id.reset(id);
  // "" is every device and both families: the IPv6 wildcard, which rdma_cm makes
  // dual-stack unless net.ipv6.bindv6only is 1. Linux binds it even with IPv6 disabled;
  // should a stack refuse the family (EAFNOSUPPORT), "" binds the IPv4 wildcard instead
  // (a failed bind leaves the id unbound).
  auto info = get_addr_info(std::string(addr.empty() ? "::" : addr), std::string(port), true);
  if (!info) return fail(info.error());
  errno = 0;
  int bound = p.bind_addr(id, (*info)->ai_src_addr);
  if (bound != 0 && addr.empty() && errno == EAFNOSUPPORT) {
    info = get_addr_info("0.0.0.0", std::string(port), true);
    if (!info) return fail(info.error());
    errno = 0;
    bound = p.bind_addr(id, (*info)->ai_src_addr);
  }
  if (bound != 0) return fail(provider_error("rdma_bind_addr", errno));
  if (id->verbs != nullptr) {  // a specific address: one device, which must have a Peer
    state->device = std::string(device_name(id->verbs));
    // By pointer: requests carry librdmacm's context, the only one a queue pair accepts.
    const Peer* same_name = nullptr;
    for (const Peer& peer : peers) {
      if (peer.state()->context == id->verbs) state->peers.push_back(peer.state());
      else if (device_name(peer.state()->context) == state->device) same_name = &peer;
    }
    if (state->peers.empty()) {
      const Peer& shown = same_name != nullptr ? *same_name : peers[0];
      char what[96];
      auto n = fmt::format_to_n(what, sizeof what, "address {} belongs to", addr);
      return fail(context_mismatch(call, {what, std::min(n.size, sizeof what)}, id->verbs,
                                   shown.state()->context));
    }
  } else {
    for (const Peer& peer : peers) state->peers.push_back(peer.state());
  }
  errno = 0;
  if (p.listen(id, options.backlog) != 0) return fail(provider_error("rdma_listen", errno));
  state->port = port_of(rdma_get_local_addr(id));
  return state;
}

inline expected<std::shared_ptr<ListenerState>> listen_shared(const char* call, const Peer& peer,
                                                             std::string_view addr,
                                                             std::string_view port,
                                                             const ListenOptions& options) {
  if (!peer) return fail(invalid(call, "the peer is empty (moved from or closed)"));
  auto number = parse_port(call, port);
  if (!number) return fail(number.error());
  if (!is_wildcard(addr))
    if (auto ok = check_numeric_address(call, addr); !ok) return fail(ok.error());
  if (options.backlog < 0) return fail(invalid(call, "backlog {} is negative", options.backlog));
  const std::string device(is_wildcard(addr) ? "" : device_name(peer.state()->context));
  auto& registry = listener_registry();
  std::lock_guard lock(registry.mutex);
  if (*number != 0) {
    auto found = registry.listeners.find({device, *number});
    if (found != registry.listeners.end()) {
      if (auto existing = found->second.lock()) {
        if (!device.empty() && existing->address != canonical_address(addr))
          return fail(invalid(call, "port {} on device {} is already listened on at address {}",
                              *number, device, existing->address));
        return existing;
      }
    }
  }
  auto state = start_listening(call, std::span<const Peer>(&peer, 1), addr, port, options);
  if (!state) return state;
  (*state)->shared = true;
  (*state)->address = address_of(rdma_get_local_addr((*state)->id.get()));
  registry.listeners[{device, (*state)->port}] = *state;
  return state;
}

/// Drops one handle of a listener; the last one stops it and reports the result.
inline expected<void> release_listener(std::shared_ptr<ListenerState> state) noexcept {
  auto& registry = listener_registry();
  std::unique_lock lock(registry.mutex);
  if (state.use_count() > 1) return {};
  if (state->shared) {
    for (auto it = registry.listeners.begin(); it != registry.listeners.end(); ++it) {
      if (!it->second.owner_before(state) && !state.owner_before(it->second)) {
        registry.listeners.erase(it);
        break;
      }
    }
  }
  lock.unlock();
  return state->stop();
}

/// Takes the next CONNECT_REQUEST of `listener` and builds the request's resources: its
/// cm_id (rejected if anything fails), queue pair, and an event channel of its own.
inline expected<std::unique_ptr<ConnectionCore>> accept_request(const char* call,
                                                                ListenerState& listener,
                                                                const ConnConfig& config,
                                                                Wait wait) {
  auto core = std::make_unique<ConnectionCore>();
  core->config = config;
  auto event = next_cm_event(listener.channel.get(), wait);
  if (!event) return fail(event.error());
  // `event` is declared after `core`: on failure it is acknowledged before the request's
  // id is rejected and destroyed (rdma_destroy_id waits for its events' acknowledgement).
  const rdma_cm_event_type type = (*event)->event;
  if (type != RDMA_CM_EVENT_CONNECT_REQUEST) {
    if (auto acked = ack(*event); !acked) return fail(acked.error());
    return fail(invalid(call, "unexpected event {} on a listening endpoint", event_name(type)));
  }
  core->id = CmId((*event)->id, CmIdDeleter{true});
  store_private_data(core->private_data, **event);
  const std::string_view device = device_name(core->id->verbs);
  const PeerState* same_name = nullptr;
  for (const auto& peer : listener.peers) {
    if (peer->context == core->id->verbs) core->peer = peer;  // by pointer, as rdma_create_qp
    else if (device_name(peer->context) == device) same_name = peer.get();
  }
  if (!core->peer && same_name != nullptr)
    return fail(context_mismatch(call, "a request arrived on", core->id->verbs,
                                 same_name->context));
  if (!core->peer)
    return fail(invalid(call, "a request arrived on device {}, for which the endpoint has no peer",
                        device));
  core->device = std::string(device);
  if (auto made = create_queues(*core, config); !made) return fail(made.error());
  if (auto acked = ack(*event); !acked) return fail(acked.error());
  errno = 0;
  core->channel.reset(provider().create_event_channel());
  if (!core->channel) return fail(provider_error("rdma_create_event_channel", errno));
  if (auto ok = make_nonblocking(core->channel.get()); !ok) return fail(ok.error());
  errno = 0;
  if (provider().migrate_id(core->id.get(), core->channel.get()) != 0)
    return fail(provider_error("rdma_migrate_id", errno));
  return core;
}

}  // namespace detail
RPMAPP_END_NAMESPACE
