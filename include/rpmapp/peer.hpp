// rpmapp::Peer: a protection domain on one RDMA device.
#pragma once

#include <rpmapp/detail/address.hpp>
#include <rpmapp/detail/device_context.hpp>
#include <rpmapp/detail/errors.hpp>
#include <rpmapp/detail/handles.hpp>
#include <rpmapp/error.hpp>
#include <rpmapp/mr_usage.hpp>
#include <rpmapp/private_data.hpp>

#include <chrono>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

RPMAPP_BEGIN_NAMESPACE

/// What a Peer's device can do and how much it takes, read once by Peer::open
/// (ibv_query_device_ex and the device's transport). Peer::capabilities().
struct DeviceCapabilities {
  bool iwarp = false;           ///< the transport is iWARP (siw; irdma in iWARP mode)
  bool atomics = false;         ///< compare-and-swap and fetch-and-add (never on iWARP)
  bool immediate_data = false;  ///< write_with_imm, send_with_imm (not on iWARP)
  bool native_atomic_write = false;  ///< Peer::native_atomic_write()
  bool native_flush = false;         ///< Peer::native_flush()
  bool memory_windows = false;       ///< Peer::memory_windows()
  bool odp = false;                  ///< Peer::odp_capable()
  /// Work requests per send or receive queue (ConnConfig::sq_size, rq_size).
  std::uint32_t max_queue_wr = 0;
  /// Scatter/gather entries per send or receive work request (ConnConfig::max_sge).
  std::uint32_t max_sge = 0;
  /// Scatter/gather entries per RDMA READ (siw: 1): for raw verbs on Conn::qp(); rpmapp's
  /// reads use one.
  std::uint32_t max_read_sge = 0;
  /// Entries per completion queue (ConnConfig::cq_size, rcq_size; SrqConfig's sizes).
  std::uint32_t max_cqe = 0;
  /// Work requests per shared receive queue (SrqConfig::rq_size).
  std::uint32_t max_srq_wr = 0;
  /// RDMA READs (and atomics) one queue pair may have outstanding as the requester.
  std::uint32_t max_outstanding_reads = 0;
  friend bool operator==(const DeviceCapabilities&, const DeviceCapabilities&) = default;
};

namespace detail {
/// Shared by a Peer and everything made from it, so that the protection domain outlives
/// every queue pair created on it. The device context is librdmacm's (never closed).
struct PeerState {
  /// Bytes an emulated flush reads (librpma's read-after-write: an 8-byte RDMA READ).
  static constexpr std::size_t flush_read_size = 8;
  struct FreeDeleter {
    void operator()(std::byte* p) const noexcept { std::free(p); }
  };

  const Provider* seam = current_provider;  // the provider that makes and releases it
  ibv_context* context = nullptr;
  bool iwarp = false;                // READ destinations need REMOTE_WRITE too
  bool odp = false;                  // on-demand paging for RC reads and writes
  bool native_atomic_write = false;  // IBV_WR_ATOMIC_WRITE
  bool native_flush = false;         // ibv_wr_flush, both flush types (rdma-core 45 on)
  bool memory_windows = false;       // type 2A or 2B: windows bound to one queue pair (grants)
  bool atomics = false;              // atomic_cap is not IBV_ATOMIC_NONE
  // the device's limits (DeviceCapabilities), checked by create_queues before creating
  std::uint32_t max_queue_wr = 0, max_sge = 0, max_read_sge = 0, max_cqe = 0, max_srq_wr = 0,
                max_outstanding_reads = 0;
  ProtectionDomain pd;
  bool uses_device = false;  // counted in device_registry() (use_device); released after the domain
  // Where emulated flushes read to: one page, registered once per Peer, shared by its
  // connections (what lands there is never looked at).
  std::unique_ptr<std::byte, FreeDeleter> flush_buffer;
  MemoryRegion flush_mr;
  /// Event channels of released connections made with ConnConfig::reuse_event_channel,
  /// empty and non-blocking, made and closed through `seam`; guarded by the mutex
  /// (connections are released on any thread).
  static constexpr std::size_t max_spare_channels = 64;
  std::mutex spare_channels_mutex;
  std::vector<rdma_event_channel*> spare_channels;
  /// CQs of released connections made with ConnConfig::reuse_completion_queues: no
  /// completion channel, no queue pair on them, nothing left to poll; made and destroyed
  /// through `seam`.
  struct SpareCq {
    ibv_cq* cq;
    std::uint32_t size;
    int vector;
  };
  static constexpr std::size_t max_spare_cqs = 64;
  std::mutex spare_cqs_mutex;
  std::vector<SpareCq> spare_cqs;
  /// Who releases the domain when the state goes: Peer::open on its failure paths, then
  /// the last of the Peer and what was made from it.
  Teardown teardown{"Peer (last reference)", LogLevel::warning};

  PeerState() {
    spare_channels.reserve(max_spare_channels);
    spare_cqs.reserve(max_spare_cqs);
  }
  PeerState(const PeerState&) = delete;
  PeerState& operator=(const PeerState&) = delete;
  ~PeerState() {
    if (auto released = release(teardown); !released) [[unlikely]]
      log(teardown.level, teardown.where, released.error());
  }

  /// A spare event channel, or nullptr when there is none.
  rdma_event_channel* take_spare_channel() noexcept;
  /// Keeps `channel` (empty: its cm_id is destroyed) as a spare; false when there are
  /// max_spare_channels already (the caller closes it).
  bool keep_spare_channel(rdma_event_channel* channel) noexcept;

  /// A spare CQ of `size` entries on completion vector `vector`, or nullptr.
  ibv_cq* take_spare_cq(std::uint32_t size, int vector) noexcept;
  /// Keeps `cq` (no queue pair on it, polled empty) as a spare; false when there are
  /// max_spare_cqs already (the caller destroys it).
  bool keep_spare_cq(ibv_cq* cq, std::uint32_t size, int vector) noexcept;

  /// Closes the spare event channels, destroys the spare CQs, deregisters the flush
  /// buffer and deallocates the domain, reporting the first failure (the rest is still
  /// released); then stops counting as a user of the device (release_device). Idempotent.
  expected<void> release(Teardown by) noexcept;
};

/// The rights register_memory gives a registration for its usages.
enum class Rights {
  of_usage,     ///< access_for's (MrScope::peer)
  for_windows,  ///< access_for_grants': local rights and MW_BIND (grants by windows)
  local_only,   ///< the local rights only (grants by registrations of their ranges)
};

/// Registers `size` bytes at `addr` for `usage` on `peer` with `rights`, retrying with
/// on-demand paging when the device refuses the memory with EOPNOTSUPP and supports ODP
/// (librpma's rule: FSDAX memory). Errors: provider / nomem (ibv_reg_mr, errno in the Error).
expected<MemoryRegion> register_memory(const PeerState& peer, void* addr,
                                       std::size_t size, MrUsage usage,
                                       Rights rights = Rights::of_usage) noexcept;

/// Allocates `state`'s protection domain on `context` and registers the page its emulated
/// flushes read into (Peer::open; a connection's own domain, own_domain). Errors:
/// provider / nomem: ibv_alloc_pd or ibv_reg_mr failed, or no page. What it made is
/// released with `state`.
expected<void> open_domain(const char* call, PeerState& state, ibv_context* context) noexcept;

/// A protection domain of its own for one connection (ConnConfig::own_protection_domain),
/// on the device of `like` (the Peer the connection would otherwise use), whose
/// capabilities it shares: no probe, only open_domain's calls. Errors: as open_domain;
/// nomem when out of memory.
expected<std::shared_ptr<PeerState>> own_domain(const char* call, const PeerState& like) noexcept;

}  // namespace detail

/// How a Peer's grants (Grant::make) give a connection's peer access to memory.
enum class GrantMode {
  /// A type 2 memory window bound to the connection's queue pair: its key is good on that
  /// connection only.
  windows,
  /// A registration of the granted range with the granted rights only (the device has no
  /// type 2 windows: siw, some NICs): its key is the device's and is good on every
  /// connection of the Peer while the grant lives.
  registrations,
};

/// Which side of an address Peer::from_address looks for.
enum class AddressKind {
  local,   ///< the device that owns the address (bind)
  remote,  ///< the device that reaches the address (resolve)
};

/// A protection domain on one RDMA device (librpma's rpma_peer). Move-only handle; the
/// domain lives until the Peer and everything made from it (endpoints, requests,
/// connections) are gone, so destroying a Peer first is safe.
/// Device removal: once any cm_id of the device reported RDMA_CM_EVENT_DEVICE_REMOVAL (its
/// connections report ConnEvent::lost, its listeners an error), registering memory,
/// ConnReq::to and Endpoint::listen on the Peer fail with provider ENODEV naming the device;
/// queries still answer. The kernel's removal of a device that cannot disassociate its users
/// (rxe) waits until every process has let go of it: release everything made on the device;
/// the last domain of it to go then has librdmacm close its context (rdma_get_devices), which
/// lets the removal finish. A device added back needs a new Peer. docs/peer.md, "Device removal".
/// Thread safety: a Peer may be used from several threads at once (all its calls are
/// const); creating and destroying Peers is thread-safe.
class Peer {
 public:
  /// How many event channels of released connections a Peer keeps for later ones
  /// (ConnConfig::reuse_event_channel).
  static constexpr std::size_t max_spare_event_channels = detail::PeerState::max_spare_channels;
  /// How many CQs of released connections a Peer keeps for later ones
  /// (ConnConfig::reuse_completion_queues).
  static constexpr std::size_t max_spare_completion_queues = detail::PeerState::max_spare_cqs;

  /// Allocates a protection domain on `context`, which must be one of librdmacm's own
  /// device contexts: an element of rdma_get_devices()'s list (those stay open for the
  /// process), or what Peer::from_address finds. librdmacm creates queue pairs on its own
  /// context of the device, so a context the caller opened with ibv_open_device, even of
  /// the same device, could never carry a connection.
  /// Probes the device as librpma does (on-demand paging, native atomic write) and
  /// registers one page that emulated flushes read into.
  /// Errors:
  /// - inval: `context` is null; it is not one of librdmacm's contexts (the reason names
  ///   the device and how to get a usable context).
  /// - nomem: ibv_alloc_pd, ibv_reg_mr or rdma_get_devices failed with ENOMEM, or out of
  ///   memory.
  /// - provider: rdma_get_devices, ibv_query_device_ex, ibv_alloc_pd or ibv_reg_mr failed
  ///   (errno in the Error).
  static expected<Peer> open(ibv_context* context) noexcept;

  /// Opens a Peer on the device that owns (`local`) or reaches (`remote`) the numeric
  /// address `addr`, as rpma_utils_get_ibv_context does. A remote lookup resolves the
  /// address and may block up to `timeout`; a signal does not end that wait (librdmacm's
  /// EINTR is retried on a fresh cm_id with the time left).
  /// Errors:
  /// - inval: `addr` is not a numeric IPv4/IPv6 address, is link-local IPv6 without its
  ///   scope ("fe80::1%eth0"), or has a scope naming no interface or on another kind of
  ///   address; no RDMA device has it.
  /// - provider: rdma_create_id, rdma_bind_addr, rdma_resolve_addr
  ///   (EINTR only for a signal after the timeout), or one of open()'s calls
  ///   (rdma_get_devices, ibv_query_device_ex, ibv_alloc_pd, ibv_reg_mr) failed (errno and
  ///   call in the Error).
  /// - nomem: out of memory (also a provider call's ENOMEM).
  static expected<Peer> from_address(std::string_view addr, AddressKind kind,
                                     std::chrono::milliseconds timeout =
                                         std::chrono::milliseconds(1000)) noexcept;

  /// An empty Peer, as a moved-from one (every call is inval): for tables of slots.
  Peer() noexcept = default;
  Peer(Peer&&) noexcept = default;
  /// Releases this handle as the destructor does, then takes `other`'s.
  Peer& operator=(Peer&& other) noexcept;
  /// Releases this handle; when it is the last user of the protection domain, the domain
  /// is deallocated and a failure logged (warning, "Peer::~Peer"). When something made
  /// from the Peer goes last, its failure is logged under "Peer (last reference)".
  ~Peer() { release_logged("Peer::~Peer"); }

  /// False when moved from or closed.
  explicit operator bool() const noexcept { return state_ != nullptr; }

  /// The device context. Errors: inval when empty.
  expected<ibv_context*> context() const noexcept;
  /// The protection domain. Errors: inval when empty.
  expected<ibv_pd*> pd() const noexcept;
  /// Whether the device supports on-demand paging for RC reads and writes (librpma's
  /// rpma_utils_ibv_context_is_odp_capable): a registration refused with EOPNOTSUPP is
  /// then retried with IBV_ACCESS_ON_DEMAND. Errors: inval when empty.
  expected<bool> odp_capable() const noexcept;
  /// Whether the device has native 8-byte atomic writes (IBV_WR_ATOMIC_WRITE); without
  /// them Conn::atomic_write is emulated as librpma 1.2 does. Errors: inval when empty.
  expected<bool> native_atomic_write() const noexcept;
  /// Whether Conn::flush runs natively (RDMA FLUSH, ibv_wr_flush): the build's rdma-core
  /// has it (45 on) and the device reports both flush types (IB_UVERBS_DEVICE_FLUSH_GLOBAL
  /// and _PERSISTENT; rxe from kernel 6.2), as librpma 1.3 decides. Otherwise a flush is
  /// emulated with an RDMA READ, as librpma 1.2 does. It also decides how regions are
  /// registered for flushes (MrUsage). Errors: inval when empty.
  expected<bool> native_flush() const noexcept;
  /// Whether the device has memory windows bound to one queue pair (type 2A or 2B; rxe's
  /// 2B), which grants use (grant_mode()). Errors: inval when empty.
  expected<bool> memory_windows() const noexcept;
  /// How MrScope::grants regions are granted: windows where the device has them
  /// (memory_windows()), registrations otherwise. Errors: inval when empty.
  expected<GrantMode> grant_mode() const noexcept;
  /// Whether the device speaks iWARP (siw, irdma in iWARP mode): no immediate data, no
  /// atomics, exact-length private data (docs/peer.md, "Transports"). Errors: inval when
  /// empty.
  expected<bool> iwarp() const noexcept;
  /// The private data limits of the device's transport, which ConnReq::connect and
  /// ConnReq::reject check: 56/196/148 bytes (connect/accept/reject) on InfiniBand and
  /// RoCE, 251 for each on iWARP. Errors: inval when empty.
  expected<PrivateDataLimits> private_data_limits() const noexcept;
  /// The device's name, e.g. "rxe0". Errors: inval when empty.
  expected<std::string> device_name() const noexcept;
  /// What the device can do and its limits, as Peer::open read them: the transport,
  /// atomics, immediate data, the probes above, and the sizes a connection's queues may
  /// have (a ConnConfig beyond them is inval naming the device, before anything is
  /// created). Not in the device's attributes, so not here: the largest inline message
  /// (ibv_query_qp on Conn::qp() gives the queue pair's) and whether the provider has extended
  /// queue pairs. Errors: inval when empty.
  expected<DeviceCapabilities> capabilities() const noexcept;

  /// Releases this handle. When nothing else uses the protection domain it is deallocated
  /// now and a failure is reported; otherwise it goes when its last user goes.
  /// The Peer is empty afterwards, whatever the result.
  /// Errors: inval when empty; provider: ibv_dereg_mr (the flush buffer's) or
  /// ibv_dealloc_pd failed (the first failure; the rest is still released, and a later
  /// failure is logged, notice).
  expected<void> close() && noexcept;

  /// Internal: the shared state, for the types made from a Peer.
  const std::shared_ptr<detail::PeerState>& state() const noexcept { return state_; }
  /// Internal: a handle to `state` (Conn::peer, ConnReq::peer).
  static Peer of(std::shared_ptr<detail::PeerState> state) noexcept { return Peer(std::move(state)); }

 private:
  explicit Peer(std::shared_ptr<detail::PeerState> state) noexcept : state_(std::move(state)) {}

  void release_logged(const char* where) noexcept;

  std::shared_ptr<detail::PeerState> state_;
};

RPMAPP_END_NAMESPACE

#if !defined(RPMAPP_SEPARATE_COMPILATION)
#  include <rpmapp/impl/peer.ipp>
#endif
