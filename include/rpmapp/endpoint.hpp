// rpmapp::Endpoint: a listening endpoint (librpma's rpma_ep).
#pragma once

#include <rpmapp/config.hpp>
#include <rpmapp/conn_req.hpp>
#include <rpmapp/detail/address.hpp>
#include <rpmapp/detail/cm_event.hpp>
#include <rpmapp/detail/connection.hpp>
#include <rpmapp/detail/listener.hpp>
#include <rpmapp/detail/source_link.hpp>
#include <rpmapp/error.hpp>
#include <rpmapp/peer.hpp>

#include <chrono>
#include <functional>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>

RPMAPP_BEGIN_NAMESPACE

/// A listening endpoint: an event channel and an RDMA_PS_TCP cm_id bound to an address and
/// listening. Requests and connections made from it stay valid after it is gone.
/// Thread safety: one thread at a time per Endpoint object. Endpoints that share one
/// listener (listen_shared) may be used from different threads; each request goes to one
/// caller, and a thread that lost the race gets no_event from try_next_conn_req and
/// next_conn_req_for within its bound (next_conn_req waits on for the next request). listen, listen_shared and shutdown may be called concurrently.
/// Decides what happens to a connection request delivered by an event loop
/// (EventLoop::serve): accept it (std::move(*req).connect(...)), reject it
/// (std::move(*req).reject(...)), or keep it for later (move it elsewhere); a request left
/// in the argument is rejected when the handler returns. An error is a request that failed
/// on its way (it was rejected already) or a failure reading the listener's events.
using ConnReqHandler = std::function<void(expected<ConnReq> request)>;

class Endpoint {
 public:
  /// Listens on `addr`:`port` with `peer`. A specific address restricts the listener to
  /// that address and its device; a wildcard listens on all devices: "0.0.0.0" for IPv4
  /// clients, "::" for IPv4 and IPv6 ones (IPv6 only when net.ipv6.bindv6only is 1), ""
  /// binds "::" (or "0.0.0.0" where IPv6 is refused). An IPv6 link-local address needs
  /// its scope: "fe80::1%eth0" or "fe80::1%3".
  /// Port "0" lets the CM choose a free port: read it back with port().
  /// Errors:
  /// - inval: empty `peer`; `addr` not a numeric IPv4/IPv6 address, a link-local one
  ///   without a scope, a scope naming no interface or on another kind of address; `port`
  ///   not a decimal 0..65535; a negative backlog; `addr` belongs to another device than
  ///   `peer`'s.
  /// - provider: rdma_create_event_channel, fcntl (making its fd non-blocking),
  ///   rdma_create_id, rdma_bind_addr or rdma_listen failed (errno and
  ///   call in the Error; e.g. EADDRINUSE); ENODEV: `peer`'s device was removed (nothing is
  ///   called; docs/peer.md, "Device removal").
  /// - nomem: out of memory.
  static expected<Endpoint> listen(const Peer& peer, std::string_view addr,
                                   std::string_view port,
                                   const ListenOptions& options = {}) noexcept {
    return listen(std::span<const Peer>(&peer, 1), addr, port, options);
  }

  /// As above with one Peer per device: each request is served with the Peer of the device
  /// it arrived on (a wildcard listener spans devices). A request arriving on a device with
  /// no Peer is rejected and next_conn_req reports inval naming the device.
  /// Errors: as above; inval also for no peers, or two peers on one device.
  static expected<Endpoint> listen(std::span<const Peer> peers, std::string_view addr,
                                   std::string_view port,
                                   const ListenOptions& options = {}) noexcept;

  /// ib_cm_insert_listen's behaviour: when this process already listens through
  /// listen_shared on the same bound address and port, returns a new handle to that
  /// listener; otherwise listens as listen() does. The key is the address as the kernel
  /// binds it: family, canonical address, port ("::0" and "::" are one key, "0.0.0.0" and
  /// "::" two; "" is keyed as the wildcard listen() binds for it). A second specific
  /// address of one device is another listener. The listener stops when its last handle
  /// goes. Port "0" always creates a listener (shared by later calls with its port). The
  /// first caller's options (backlog) stay.
  /// A later caller's Peer: the same Peer shares; on a wildcard listener, a Peer on a device
  /// not yet served joins (that device's requests are served with it from then on, until
  /// the listener stops); anything else is inval (its connections would not be in its
  /// protection domain). As ib_cm_insert_listen, a listener is shared only with callers
  /// that pass the same handler: the overload below creates it with one.
  /// Errors: as listen(); inval also when:
  /// - the listener was created with a handler (or this call passes one, and it was not);
  /// - the Peer is on a device the listener already serves with another Peer, or on
  ///   another device than the specific address the listener is bound to;
  /// - "::" while this process shares the port's IPv4 wildcard ("0.0.0.0"), or the reverse
  ///   (an IPv6 wildcard takes IPv4 requests too; the kernel would refuse it).
  /// Thread safety: may be called concurrently with listen_shared, shutdown and the
  /// destructor of any Endpoint (the registry of shared listeners is locked).
  static expected<Endpoint> listen_shared(const Peer& peer, std::string_view addr,
                                          std::string_view port,
                                          const ListenOptions& options = {}) noexcept {
    return share(peer, addr, port, nullptr, options);
  }

  /// As listen_shared above, with the listener's connection request handler (the
  /// ib_cm_insert_listen form): EventLoop::serve(endpoint) calls it for each request,
  /// whichever handle's loop takes the request, exactly once per request. A later caller
  /// gets a handle to the listener only with the same handler (the same shared_ptr);
  /// another handler, or none, is inval ("sharing a listener between different handlers
  /// is not supported", as the kernel says). With handles served by loops on several
  /// threads the handler is called from those threads: it must be thread-safe.
  /// Errors: as above; inval also for an empty `handler`.
  static expected<Endpoint> listen_shared(const Peer& peer, std::string_view addr,
                                          std::string_view port,
                                          std::shared_ptr<ConnReqHandler> handler,
                                          const ListenOptions& options = {}) noexcept {
    if (!handler || !*handler)
      return detail::fail(detail::invalid("Endpoint::listen_shared", "the handler is empty"));
    return share(peer, addr, port, std::move(handler), options);
  }

  /// The handler the shared listener was created with (listen_shared), or null.
  /// Errors: inval when empty.
  expected<std::shared_ptr<ConnReqHandler>> handler() const noexcept;

  /// An empty Endpoint, as a moved-from one (every call is inval): for tables of slots.
  Endpoint() noexcept = default;
  Endpoint(Endpoint&& other) noexcept = default;
  /// Releases this handle as shutdown() does (a failure is logged: warning,
  /// "Endpoint::operator="), then takes `other`'s.
  Endpoint& operator=(Endpoint&& other) noexcept;
  /// Does what shutdown() does; a failure is logged (warning, "Endpoint::~Endpoint").
  ~Endpoint() { release_logged("Endpoint::~Endpoint"); }

  explicit operator bool() const noexcept { return state_ != nullptr; }

  /// Waits for the next connection request and creates its queue pair from `config`.
  /// Waits until a request arrives (an empty read, e.g. another handle's thread took the
  /// request, goes back to waiting). A signal does not interrupt a wait; it is retried.
  /// Errors:
  /// - inval: empty endpoint; a bad `config`; an event other than a connection request
  ///   (but ADDR_CHANGE, a bonding failover, which the listener survives: acknowledged,
  ///   logged at notice, and the wait goes on)
  ///   (acknowledged; the reason names it); a request arriving on a device for which the
  ///   endpoint has no Peer (rejected; the reason names the device).
  /// - no_event: only from try_next_conn_req and next_conn_req_for: nothing in time.
  /// - provider: poll, rdma_get_cm_event, ibv_create_comp_channel, ibv_create_cq,
  ///   ibv_req_notify_cq, rdma_create_qp, rdma_ack_cm_event, rdma_create_event_channel,
  ///   fcntl or rdma_migrate_id failed (the request is rejected). A request queued so long that its
  ///   client has given up can fail this way (rdma_create_qp, EINVAL). ENODEV (call
  ///   rdma_get_cm_event): the listener's device was removed (RDMA_CM_EVENT_DEVICE_REMOVAL;
  ///   the kernel destroyed the listening id): this call and every later one, which reads
  ///   nothing; release the endpoint (docs/peer.md, "Device removal").
  /// - nomem: out of memory (the request is rejected).
  expected<ConnReq> next_conn_req(const ConnConfig& config = {}) noexcept;
  /// As next_conn_req, but returns no_event at once when no request is pending (or
  /// another reader took it first).
  expected<ConnReq> try_next_conn_req(const ConnConfig& config = {}) noexcept;
  /// As next_conn_req, but returns no_event when no request arrived within `timeout`
  /// (never later: another reader taking the request only sends it back to waiting). A
  /// zero or negative timeout is try_next_conn_req.
  expected<ConnReq> next_conn_req_for(std::chrono::milliseconds timeout,
                                      const ConnConfig& config = {}) noexcept;

  /// The listening event channel's fd, for poll/epoll (readable = a request is pending).
  /// It is always non-blocking (O_NONBLOCK): rpmapp's waits read it only after poll and loop on
  /// an empty read, so a blocking call waits whatever the fd's flags. Never clear
  /// O_NONBLOCK: another reader (a thread on a handle of the same listener) or librdmacm
  /// itself may take the event between your poll and the read, and a blocking read would
  /// then hang until some later event.
  /// Errors: inval when empty.
  expected<int> fd() const noexcept;
  /// The bound port (the CM's choice when listening on "0"). Errors: inval when empty.
  expected<std::uint16_t> port() const noexcept;
  /// The bound numeric address ("0.0.0.0" or "::" for a wildcard listener; "::" for "");
  /// a link-local one with its scope as an interface name ("fe80::1%eth0").
  /// Errors: inval when empty; nomem.
  expected<std::string> local_address() const noexcept;
  /// The IB service ID rdma_cm uses for the port (RDMA_PS_TCP << 16 | port), in network
  /// byte order, as ib_cm_insert_listen takes it. Errors: inval when empty.
  expected<std::uint64_t> service_id() const noexcept;
  /// The device a specific-address listener is bound to; "" for a wildcard listener. The
  /// view is valid while the Endpoint lives. Errors: inval when empty.
  expected<std::string_view> device() const noexcept;
  /// How many Endpoint handles share this listener (1 unless listen_shared): the handles
  /// counted by listen_shared and shutdown. Errors: inval when empty.
  expected<long> share_count() const noexcept;

  /// Releases this handle (consumed: empty afterwards, whatever the result). When it is
  /// the listener's last handle, the pending connection requests are rejected and
  /// acknowledged, then the listening cm_id and the event channel are destroyed; for a
  /// shared listener this happens before another listen_shared can see the port free,
  /// and the errors go to the caller that released the last handle.
  /// Requests taken and connections made earlier are not affected.
  /// Errors: inval when empty; provider: rdma_get_cm_event, rdma_reject,
  /// rdma_ack_cm_event or rdma_destroy_id failed (the rest is still released; failures
  /// after the first are logged, notice; requests rejected here are logged, info).
  expected<void> shutdown() && noexcept;

 private:
  friend struct detail::LoopAccess;
  explicit Endpoint(std::shared_ptr<detail::ListenerState> state) noexcept
      : state_(std::move(state)) {}

  static expected<Endpoint> share(const Peer& peer, std::string_view addr, std::string_view port,
                                  std::shared_ptr<void> handler, const ListenOptions& options) noexcept;

  expected<void> release(detail::Teardown by) noexcept;

  void release_logged(const char* where) noexcept;

  expected<ConnReq> next(const char* call, const ConnConfig& config, detail::Wait wait) noexcept;

  std::shared_ptr<detail::ListenerState> state_;
  detail::SourceLink watchers_;  // event loops serving this handle
};

RPMAPP_END_NAMESPACE

#if !defined(RPMAPP_SEPARATE_COMPILATION)
#  include <rpmapp/impl/endpoint.ipp>
#endif
