// rpmapp::ConnReq: a connection request, incoming (from an Endpoint) or outgoing (to a
// server), and rpmapp::PendingConnReq: an outgoing request whose address and route are
// still being resolved.
#pragma once

#include <rpmapp/config.hpp>
#include <rpmapp/conn.hpp>
#include <rpmapp/detail/address.hpp>
#include <rpmapp/detail/cm_event.hpp>
#include <rpmapp/detail/connection.hpp>
#include <rpmapp/error.hpp>
#include <rpmapp/peer.hpp>

#include <chrono>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>

RPMAPP_BEGIN_NAMESPACE

class Endpoint;
class PendingConnReq;

/// A connection request with its queue pair and completion queues already created (from
/// ConnConfig), so the connection can carry data as soon as it is established.
/// Incoming requests come from Endpoint::next_conn_req; outgoing ones from ConnReq::to or
/// PendingConnReq. A request stays valid after its Endpoint is gone.
/// Dropping an incoming request rejects it and frees its cm_id.
/// Thread safety: one thread at a time per ConnReq; different requests are independent.
class ConnReq {
 public:
  /// Resolves `addr`:`port` (each step bounded by `config.timeout`) and creates the queue
  /// pair on `peer`. Blocks; see start() for the non-blocking form.
  /// Errors:
  /// - inval: empty `peer`; `addr` not a numeric address, a link-local IPv6 one without its
  ///   scope ("fe80::1%eth0"), a scope naming no interface or on another kind of address;
  ///   `port` not decimal 0..65535 (or 0); a bad `config`; the address is reached through
  ///   another device than `peer`'s (or through a librdmacm context other than `peer`'s:
  ///   compared by pointer).
  /// - provider: rdma_create_event_channel, fcntl (making its fd non-blocking),
  ///   rdma_create_id, rdma_resolve_addr, rdma_resolve_route (also an
  ///   ADDR_ERROR / ROUTE_ERROR event, errno from its status), poll, rdma_get_cm_event,
  ///   ibv_create_comp_channel, ibv_create_cq, ibv_req_notify_cq or rdma_create_qp failed;
  ///   ENODEV: `peer`'s device was removed (nothing is called; docs/peer.md, "Device
  ///   removal").
  /// - nomem: out of memory.
  /// Thread safety: may be called concurrently.
  static expected<ConnReq> to(const Peer& peer, std::string_view addr, std::string_view port,
                              const ConnConfig& config = {}) noexcept;

  /// Starts resolving `addr`:`port` and returns at once; the request completes through
  /// PendingConnReq (its fd() becomes readable as resolution advances), so one thread can
  /// have many outgoing requests in flight. Errors: as to(), for the steps taken so far.
  static expected<PendingConnReq> start(const Peer& peer, std::string_view addr,
                                        std::string_view port,
                                        const ConnConfig& config = {}) noexcept;

  /// An empty ConnReq, as a moved-from one (every call is inval): for tables of slots.
  ConnReq() noexcept = default;
  ConnReq(ConnReq&&) noexcept = default;
  /// Releases this request as the destructor does (failures logged under
  /// "ConnReq::operator="), then takes `other`'s.
  ConnReq& operator=(ConnReq&& other) noexcept;
  /// Releases the request as close() does; a failure is logged (warning,
  /// "ConnReq::~ConnReq"; the ones after the first, notice).
  ~ConnReq() = default;

  explicit operator bool() const noexcept { return core_ != nullptr; }

  /// Accepts (incoming) or connects (outgoing), sending `private_data` (at most the
  /// device's Peer::private_data_limits(): 196 bytes on accept and 56 on connect on
  /// InfiniBand and RoCE, 251 on iWARP). Consumes the request: on success the Conn owns everything;
  /// on a provider failure the request is released (an incoming one is rejected). Only an
  /// inval leaves the request as it was. Establishment is reported by Conn::next_event.
  /// Errors:
  /// - inval: empty request; private data too long for the device's transport (nothing
  ///   is sent; the reason names the device, its transport and the limit).
  /// - provider: rdma_accept or rdma_connect failed; ENODEV: the request's device was
  ///   removed (nothing is called; docs/peer.md, "Device removal").
  expected<Conn> connect(std::span<const std::byte> private_data = {}) && noexcept;

  /// Rejects an incoming request, sending `private_data` (at most the device's limit:
  /// max_reject_private_data, 148 bytes, the IB CM's REJ size, which the kernel enforces;
  /// 251 on iWARP) to the client, and releases it (consumed, whatever the result, except
  /// on inval).
  /// Errors:
  /// - inval: empty request; an outgoing request; private data too long (nothing is sent,
  ///   the request is left as it was and can still be accepted).
  /// - provider: rdma_reject failed (the request is still released), or a release step
  ///   (ibv_destroy_qp, ibv_destroy_cq, ibv_destroy_comp_channel, rdma_destroy_id) failed.
  expected<void> reject(std::span<const std::byte> private_data = {}) && noexcept;

  /// Releases the request (an incoming one is rejected without private data), reporting
  /// the first failure (the later ones are logged, notice). Consumed whatever the result.
  /// Errors: inval when empty; provider.
  expected<void> close() && noexcept;

  /// Posts a receive before the connection exists (librpma's rpma_conn_req_recv), so that
  /// the peer's first message finds it: as Conn::recv.
  /// Errors: inval (empty request, bad region or range, a shared receive queue); provider:
  /// ibv_post_recv failed.
  expected<void> recv(const MrLocal& dst, std::size_t offset, std::size_t len,
                      std::uint64_t context = 0) noexcept {
    if (!core_) return detail::fail(detail::moved_from("ConnReq::recv"));
    return detail::recv("ConnReq::recv", *core_, dst, offset, len, context);
  }

  /// True for a request that came from an Endpoint. Errors: inval when empty.
  expected<bool> is_incoming() const noexcept;
  /// The private data of an incoming request, as rdma_cm delivered it: zero-padded to 56
  /// bytes whatever the client sent on InfiniBand and RoCE, at its length on iWARP. Empty
  /// for an outgoing request. Errors: inval when empty.
  expected<std::span<const std::byte>> private_data() const noexcept;
  /// Copies private_data() into `out`; returns its size. Errors: inval when empty or when
  /// `out` is too small (nothing is written then).
  expected<std::size_t> copy_private_data(std::span<std::byte> out) const noexcept;
  /// The other side's numeric address; a link-local IPv6 one with its scope
  /// ("fe80::1%eth0"), so it can be passed to ConnReq::to. Errors: inval when empty; nomem.
  expected<std::string> peer_address() const noexcept;
  /// The other side's port. Errors: inval when empty.
  expected<std::uint16_t> peer_port() const noexcept;
  /// The RDMA device the request arrived on (or leaves from), e.g. "rxe0"; the view is
  /// valid while the request lives. Errors: inval when empty.
  expected<std::string_view> device() const noexcept;
  /// The Peer the connection will be on (as Conn::peer): with
  /// ConnConfig::own_protection_domain its own, for the memory of receives posted before
  /// accepting. Errors: inval when empty.
  expected<Peer> peer() const noexcept;
  /// The queue pair number. Errors: inval when empty.
  expected<std::uint32_t> qp_num() const noexcept;
  /// The connection's identity (Conn::id once accepted or connected), for tagging: its
  /// completions in shared queues carry it from the start, receives completing before
  /// the connection is established included. Errors: inval when empty.
  expected<ConnId> id() const noexcept;

 private:
  friend struct detail::LoopAccess;
  friend class Endpoint;
  friend class PendingConnReq;
  /// connect()'s name in its errors, also where EventLoop::connect makes the call.
  static constexpr const char* connect_call = "ConnReq::connect";
  static expected<PendingConnReq> start_as(const char* call, const Peer& peer,
                                           std::string_view addr, std::string_view port,
                                           const ConnConfig& config) noexcept;
  /// connect() up to the provider call: its checks, then the core taken from the request
  /// (EventLoop::connect makes iWARP's blocking rdma_connect on a thread of its own).
  /// Errors: as connect()'s inval (the request left as it was) and ENODEV (released).
  expected<std::unique_ptr<detail::ConnectionCore>> take_for_connect(
      const char* call, std::span<const std::byte> private_data) && noexcept;
  ConnReq(std::unique_ptr<detail::ConnectionCore> core, bool incoming) noexcept
      : core_(std::move(core)), incoming_(incoming) {
    core_->teardown = {"ConnReq::~ConnReq", LogLevel::warning};
  }

  std::unique_ptr<detail::ConnectionCore> core_;
  bool incoming_ = false;
};

/// An outgoing request whose address and route resolution is in progress (ConnReq::start).
/// Thread safety: one thread at a time per PendingConnReq.
class PendingConnReq {
 public:
  /// An empty PendingConnReq, as a moved-from one (every call is inval): for tables of slots.
  PendingConnReq() noexcept = default;
  PendingConnReq(PendingConnReq&&) noexcept = default;
  /// Releases this request as the destructor does (failures logged under
  /// "PendingConnReq::operator="), then takes `other`'s.
  PendingConnReq& operator=(PendingConnReq&& other) noexcept;
  /// Releases what resolution made so far; a failure is logged (warning,
  /// "PendingConnReq::~PendingConnReq"; the ones after the first, notice).
  ~PendingConnReq() = default;

  explicit operator bool() const noexcept { return core_ != nullptr; }

  /// The fd of the request's event channel: readable when resolution has advanced.
  /// It is always non-blocking (O_NONBLOCK): rpmapp's waits read it only after poll and loop on
  /// an empty read, so a blocking call waits whatever the fd's flags. Never clear
  /// O_NONBLOCK: librdmacm may consume an event itself between your poll and the read,
  /// and a blocking read would then hang until some later event.
  /// Errors: inval when empty.
  expected<int> fd() const noexcept;

  /// Advances resolution with the events already pending. While it is in progress returns
  /// no_event and the object stays usable; otherwise it is consumed: on success the ConnReq
  /// owns everything, on failure everything is released.
  /// Errors: no_event (in progress); inval (empty; the address is reached through another
  /// device than the Peer's); provider (as ConnReq::to; ENODEV naming the removal when the
  /// Peer's device was removed during resolution); nomem.
  expected<ConnReq> try_wait() && noexcept;
  /// As try_wait, waiting up to `timeout` for resolution to finish (one bound for all its
  /// steps; a zero or negative timeout is try_wait). A signal does not interrupt a wait;
  /// it is retried.
  expected<ConnReq> wait_for(std::chrono::milliseconds timeout) && noexcept;
  /// Waits until resolution finishes. rdma_cm bounds each of its two steps by
  /// ConnConfig::timeout; should it stay silent, this gives up after twice that plus one
  /// second in all (provider, ETIMEDOUT, naming the step).
  expected<ConnReq> wait() && noexcept;

 private:
  friend struct detail::LoopAccess;
  friend class ConnReq;
  enum class Stage { address, route };

  // `config`'s queue sizes and timeout are read until the queues are made (the shared
  // queues it names are already held by `core`).
  PendingConnReq(std::unique_ptr<detail::ConnectionCore> core, const ConnConfig& config) noexcept
      : core_(std::move(core)), config_(config) {
    config_.srq = nullptr;
    config_.shared_cq = nullptr;
    config_.shared_event_channel = nullptr;
    core_->teardown = {"PendingConnReq::~PendingConnReq", LogLevel::warning};
  }

  // Releases the request after `call` failed (release failures are logged, notice: the
  // caller gets the failure that ended it).
  void drop(const char* call) noexcept {
    core_->teardown = {call, LogLevel::notice};
    core_.reset();
  }

  const char* resolving_call() const noexcept {
    return stage_ == Stage::address ? "rdma_resolve_addr" : "rdma_resolve_route";
  }

  // Handles events until resolution is over or none arrives within `wait`; an error names
  // `call`.
  expected<ConnReq> advance(const char* call, detail::Wait wait) noexcept;
  expected<ConnReq> advance_events(const char* call, detail::Wait wait) noexcept;

  // One resolution event: true when the request is ready.
  expected<bool> handle(const char* call, const rdma_cm_event& event) noexcept;

  std::unique_ptr<detail::ConnectionCore> core_;
  ConnConfig config_;
  Stage stage_ = Stage::address;
};

inline expected<PendingConnReq> ConnReq::start(const Peer& peer, std::string_view addr,
                                               std::string_view port,
                                               const ConnConfig& config) noexcept {
  return start_as("ConnReq::start", peer, addr, port, config);
}

RPMAPP_END_NAMESPACE

#if !defined(RPMAPP_SEPARATE_COMPILATION)
#  include <rpmapp/impl/conn_req.ipp>
#endif
