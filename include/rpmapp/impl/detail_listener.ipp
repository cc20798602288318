// Definitions of rpmapp/detail/listener.hpp: starting, stopping, sharing listeners; accepting.
#pragma once

#include <rpmapp/detail/listener.hpp>

#include <algorithm>
#include <cerrno>
#include <utility>

#include <sys/socket.h>

RPMAPP_BEGIN_NAMESPACE
namespace detail {

RPMAPP_DECL ListenerKey listener_key(std::string_view addr, std::uint16_t port) {
  const std::string_view node = listen_node(addr);
  std::string text = canonical_address(node);
  if (text.empty()) text = node;
  return {text.find(':') != std::string::npos ? AF_INET6 : AF_INET, std::move(text), port};
}

RPMAPP_DECL ListenerState::~ListenerState() {
  if (wildcard_listed) {
    auto& all = wildcard_listeners();
    std::lock_guard lock(all.mutex);
    std::erase(all.listeners, this);
  }
  if (!id && !channel) return;  // stopped by its last Endpoint handle (the usual case)
  if (auto stopped = stop(teardown); !stopped) [[unlikely]]
    log(teardown.level, teardown.where, stopped.error());
}

RPMAPP_DECL expected<void> ListenerState::stop(Teardown by) noexcept {
  const Provider& p = *seam;
  FirstError first{by};
  if (id) {
    const Deadline now(Wait::none());
    for (int empty_read = 0;;) {
      CmReadFailure failed;
      CmEvent event(poll_cm_event(channel.get(), now, p, empty_read, failed), CmEventAcker{{&p}});
      if (failed.call != nullptr) first.note(provider_error(failed.call, failed.sys_errno));
      if (!event) break;
      const rdma_cm_event_type type = event->event;
      rdma_cm_id* request = type == RDMA_CM_EVENT_CONNECT_REQUEST ? event->id : nullptr;
      if (request != nullptr) {
        log_event(LogLevel::info, by.where, type,
                  "a pending request, rejected: the listener stops");
        errno = 0;
        first.errno_call(p.reject(request, nullptr, 0), "rdma_reject");
      } else {
        log_event(LogLevel::notice, by.where, type,
                  "acknowledged and dropped: the listener stops");
      }
      if (auto acked = ack(event); !acked) first.note(acked.error());
      if (request != nullptr) {
        errno = 0;
        first.errno_call(p.destroy_id(request), "rdma_destroy_id");
      }
    }
    errno = 0;
    first.errno_call(p.destroy_id(id.release()), "rdma_destroy_id");
  }
  if (channel) p.destroy_event_channel(channel.release());
  std::lock_guard lock(peers_mutex);
  peers.clear();
  return first.result();
}

RPMAPP_DECL expected<std::shared_ptr<ListenerState>> start_listening(
    const char* call, std::span<const Peer> peers, std::string_view addr, std::string_view port,
    const ListenOptions& options) {
  if (peers.empty()) return fail(invalid(call, "no peer given"));
  for (std::size_t i = 0; i < peers.size(); ++i) {
    if (!peers[i]) return fail(invalid(call, "peer {} is empty (moved from or closed)", i));
    if (auto present = check_device(call, peers[i].state()->context); !present) return fail(present.error());
    for (std::size_t j = 0; j < i; ++j)
      if (device_name(peers[j].state()->context) == device_name(peers[i].state()->context))
        return fail(invalid(call, "peers {} and {} are both on device {}", j, i,
                            device_name(peers[i].state()->context)));
  }
  auto number = parse_port(call, port);
  if (!number) return fail(number.error());
  SocketAddress where;
  if (auto ok = check_numeric_address(call, listen_node(addr), &where); !ok)
    return fail(ok.error());
  where.set_port(*number);
  if (options.backlog < 0) return fail(invalid(call, "backlog {} is negative", options.backlog));

  const Provider& p = provider();
  auto state = std::make_shared<ListenerState>();
  state->teardown = {call, LogLevel::notice};  // until an Endpoint owns it
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
  errno = 0;
  int bound = p.bind_addr(id, where.get());
  if (bound != 0 && addr.empty() && errno == EAFNOSUPPORT) {
    where = SocketAddress::ipv4_any(*number);
    errno = 0;
    bound = p.bind_addr(id, where.get());
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
      auto n = detail::format_to_n(what, sizeof what, "address {} belongs to", addr);
      return fail(context_mismatch(call, {what, std::min(n.size, sizeof what)}, id->verbs,
                                   shown.state()->context));
    }
  } else {
    for (const Peer& peer : peers) state->peers.push_back(peer.state());
  }
  errno = 0;
  if (p.listen(id, options.backlog) != 0) return fail(provider_error("rdma_listen", errno));
  state->port = port_of(rdma_get_local_addr(id));
  if (state->device.empty()) {
    auto& all = wildcard_listeners();
    std::lock_guard lock(all.mutex);
    try {
      all.listeners.push_back(state.get());
    } catch (const std::bad_alloc&) {
      return fail(Error(errc::nomem, ENOMEM, call, "memory allocation failed"));
    }
    state->wildcard_listed = true;
    device_registry().removal_hook.store(&drop_removed_peers_everywhere, std::memory_order_release);
  }
  // From here its Endpoint handles stop it (the last one, explicitly).
  state->teardown = {"detail::ListenerState", LogLevel::warning};
  return state;
}

RPMAPP_DECL expected<void>
join_listener(const char* call, ListenerState& listener, const Peer& peer) {
  const std::shared_ptr<PeerState>& mine = peer.state();
  const std::string_view device = device_name(mine->context);
  std::lock_guard lock(listener.peers_mutex);
  if (listener.id->verbs != nullptr && listener.id->verbs != mine->context)
    return fail(invalid(call, "the listener on {} port {} is bound to device {}; the peer is on {}",
                        listener.key.address, listener.port, listener.device, device));
  for (const auto& served : listener.peers) {
    if (served == mine) return {};
    if (served->context == mine->context)
      return fail(invalid(call, "the listener on {} port {} serves device {} with another Peer "
                                "(another protection domain); pass that Peer",
                          listener.key.address, listener.port, device));
  }
  listener.peers.push_back(mine);
  return {};
}

RPMAPP_DECL expected<std::shared_ptr<ListenerState>>
listen_shared(const char* call, const Peer& peer,
                                                                  std::string_view addr,
                                                                  std::string_view port,
                                                                  const ListenOptions& options,
                                                                  std::shared_ptr<void> handler) {
  if (!peer) return fail(invalid(call, "the peer is empty (moved from or closed)"));
  auto number = parse_port(call, port);
  if (!number) return fail(number.error());
  if (!is_wildcard(addr))
    if (auto ok = check_numeric_address(call, addr); !ok) return fail(ok.error());
  if (options.backlog < 0) return fail(invalid(call, "backlog {} is negative", options.backlog));
  ListenerKey key = listener_key(addr, *number);
  auto& registry = listener_registry();
  // Held while listening too: two callers for one key must not both create a listener.
  std::lock_guard lock(registry.mutex);
  if (*number != 0) {
    auto found = registry.listeners.find(key);
    if (found != registry.listeners.end()) {
      if (auto existing = found->second.lock()) {
        // As ib_cm_insert_listen: one listener, one handler.
        if (existing->handler != handler)
          return fail(invalid(call, "the listener on {} port {} was created with {} handler; sharing "
                                    "a listener between different handlers is not supported",
                              existing->key.address, existing->port,
                              existing->handler ? "another" : "no"));
        if (auto joined = join_listener(call, *existing, peer); !joined)
          return fail(joined.error());
        ++existing->handles;
        return existing;
      }
    }
    // An IPv6 wildcard takes IPv4 requests too (unless net.ipv6.bindv6only), so the kernel
    // refuses it next to an IPv4 wildcard on the port, and the reverse, with EADDRNOTAVAIL.
    const bool v6 = key.family == AF_INET6;
    if (is_wildcard(key.address) &&
        registry.listeners.count({v6 ? AF_INET : AF_INET6, v6 ? "0.0.0.0" : "::", key.port}) != 0) {
      if (v6)
        return fail(invalid(call, "port {} is held by an IPv4-only wildcard listener (0.0.0.0) of "
                                  "this process; an IPv6 wildcard would take IPv4 requests too",
                            key.port));
      return fail(invalid(call, "port {} is held by an IPv6 wildcard listener (::) of this "
                                "process, which takes IPv4 requests too; share it with \"::\"",
                          key.port));
    }
  }
  auto state = start_listening(call, std::span<const Peer>(&peer, 1), addr, port, options);
  if (!state) return state;
  (*state)->shared = true;
  (*state)->handler = std::move(handler);
  // As bound (port 0 assigned; "" on a stack without IPv6 falls back to "0.0.0.0").
  key = listener_key(rdma_get_local_addr((*state)->id.get()));
  (*state)->key = key;
  registry.listeners[key] = *state;
  return state;
}

RPMAPP_DECL expected<void>
release_listener(std::shared_ptr<ListenerState> state, Teardown by) noexcept {
  if (!state->shared) return state->stop(by);  // plain listeners: one handle, no registry
  auto& registry = listener_registry();
  std::lock_guard lock(registry.mutex);
  if (--state->handles > 0) return {};
  auto found = registry.listeners.find(state->key);
  if (found != registry.listeners.end() && !found->second.owner_before(state) &&
      !state.owner_before(found->second))
    registry.listeners.erase(found);
  return state->stop(by);
}

RPMAPP_DECL long handle_count(const ListenerState& state) {
  if (!state.shared) return 1;
  std::lock_guard lock(listener_registry().mutex);
  return state.handles;
}

RPMAPP_DECL void drop_removed_peers(ListenerState& listener) noexcept {
  if (!any_device_removed()) [[likely]]
    return;  // the accept path takes no lock for it
  std::vector<std::shared_ptr<PeerState>> gone;  // released outside the lock
  {
    std::lock_guard lock(listener.peers_mutex);
    auto& peers = listener.peers;
    for (auto it = peers.begin(); it != peers.end();) {
      if (!device_removed((*it)->context)) {
        ++it;
        continue;
      }
      try {
        gone.push_back(std::move(*it));
      } catch (const std::bad_alloc&) {
        return;  // the next take drops it
      }
      it = peers.erase(it);
    }
  }
  for (const auto& peer : gone) {
    char text[160];
    const auto n = detail::format_to_n(text, sizeof text, "the listener lets go of its Peer on device {}: the device was removed",
                               device_name(peer->context));
    log(LogLevel::notice, "Endpoint", std::string_view(text, std::min(n.size, sizeof text)));
  }
}

RPMAPP_DECL void drop_removed_peers_everywhere(const ibv_context*) noexcept {
  auto& all = wildcard_listeners();
  std::lock_guard lock(all.mutex);
  for (ListenerState* listener : all.listeners) drop_removed_peers(*listener);
}

RPMAPP_DECL expected<std::unique_ptr<ConnectionCore>> accept_request(const char* call,
                                                                     ListenerState& listener,
                                                                     const ConnConfig& config,
                                                                     const SharedQueues& shared,
                                                                     Wait wait) {
  // the kernel destroyed the listening id with its device: no request comes any more
  if (listener.removed) return fail(removed_device_error("rdma_get_cm_event", listener.id->verbs));
  auto core = std::make_unique<ConnectionCore>();
  core->teardown = {call, LogLevel::notice};  // until a ConnReq owns it
  core->config = settings_of(config);
  const Deadline deadline(wait);
  auto event = next_cm_event(listener.channel.get(), deadline);
  // A bonding failover under the address (ADDR_CHANGE) leaves the listener serving
  // (measured on rxe): acknowledged, logged, and the wait goes on.
  while (event && (*event)->event == RDMA_CM_EVENT_ADDR_CHANGE) {
    if (auto acked = ack(*event); !acked) return fail(acked.error());
    log_event(LogLevel::notice, call, RDMA_CM_EVENT_ADDR_CHANGE,
              "the address's device changed its hardware address (a bonding failover): the "
              "listener goes on");
    event = next_cm_event(listener.channel.get(), deadline);
  }
  if (!event) return fail(event.error());
  event->get_deleter().by = {call, LogLevel::notice};  // acknowledged there on failure only
  // `event` is declared after `core`: on failure it is acknowledged before the request's
  // id is rejected and destroyed (rdma_destroy_id waits for its events' acknowledgement).
  const rdma_cm_event_type type = (*event)->event;
  if (type != RDMA_CM_EVENT_CONNECT_REQUEST) {
    if (auto acked = ack(*event); !acked) return fail(acked.error());
    if (type == RDMA_CM_EVENT_DEVICE_REMOVAL) {
      listener.removed = true;
      return fail(removed_device_error("rdma_get_cm_event", listener.id->verbs));
    }
    return fail(invalid(call, "unexpected event {} on a listening endpoint", event_name(type)));
  }
  core->id.reset((*event)->id);
  core->reject_unanswered = true;
  core->private_data.store(**event);
  const std::string_view device = device_name(core->id->verbs);
  const PeerState* same_name = nullptr;
  drop_removed_peers(listener);
  {
    std::lock_guard lock(listener.peers_mutex);  // a listen_shared caller may be joining
    for (const auto& peer : listener.peers) {
      if (peer->context == core->id->verbs) core->peer = peer;  // by pointer, as rdma_create_qp
      else if (device_name(peer->context) == device) same_name = peer.get();
    }
  }
  if (!core->peer && same_name != nullptr)
    return fail(context_mismatch(call, "a request arrived on", core->id->verbs,
                                 same_name->context));
  if (!core->peer)
    return fail(invalid(call, "a request arrived on device {}, for which the endpoint has no peer",
                        device));
  if (config.own_protection_domain) {
    auto own = own_domain(call, *core->peer);
    if (!own) return fail(own.error());
    core->peer = std::move(*own);
  }
  if (auto ok = attach_shared_queues(call, *core, config, shared); !ok) return fail(ok.error());
  if (auto made = create_queues(*core, config); !made) return fail(made.error());
  if (auto acked = ack(*event); !acked) return fail(acked.error());
  if (auto ok = open_event_channel(*core); !ok) return fail(ok.error());
  // Routed before the move: the id's next event may come at once.
  if (core->events)
    core->events->add(core->id.get(), core->inbox);
  errno = 0;
  if (provider().migrate_id(core->id.get(), event_channel_of(*core)) != 0)
    return fail(provider_error("rdma_migrate_id", errno));
  return core;
}

}  // namespace detail
RPMAPP_END_NAMESPACE
