// rpmapp::Peer: a protection domain on one RDMA device.
#pragma once

#include <rpmapp/detail/address.hpp>
#include <rpmapp/detail/cm_event.hpp>
#include <rpmapp/detail/device_context.hpp>
#include <rpmapp/detail/errors.hpp>
#include <rpmapp/detail/handles.hpp>
#include <rpmapp/error.hpp>
#include <rpmapp/mr_usage.hpp>

#include <chrono>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include <unistd.h>

RPMAPP_BEGIN_NAMESPACE

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
  ProtectionDomain pd;
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
  rdma_event_channel* take_spare_channel() noexcept {
    std::lock_guard lock(spare_channels_mutex);
    if (spare_channels.empty()) return nullptr;
    rdma_event_channel* channel = spare_channels.back();
    spare_channels.pop_back();
    return channel;
  }
  /// Keeps `channel` (empty: its cm_id is destroyed) as a spare; false when there are
  /// max_spare_channels already (the caller closes it).
  bool keep_spare_channel(rdma_event_channel* channel) noexcept {
    std::lock_guard lock(spare_channels_mutex);
    if (spare_channels.size() >= max_spare_channels) return false;
    spare_channels.push_back(channel);  // no allocation: reserved by the constructor
    return true;
  }

  /// A spare CQ of `size` entries on completion vector `vector`, or nullptr.
  ibv_cq* take_spare_cq(std::uint32_t size, int vector) noexcept {
    std::lock_guard lock(spare_cqs_mutex);
    for (std::size_t i = spare_cqs.size(); i-- > 0;) {  // the latest first
      if (spare_cqs[i].size != size || spare_cqs[i].vector != vector) continue;
      ibv_cq* cq = spare_cqs[i].cq;
      spare_cqs.erase(spare_cqs.begin() + static_cast<std::ptrdiff_t>(i));
      return cq;
    }
    return nullptr;
  }
  /// Keeps `cq` (no queue pair on it, polled empty) as a spare; false when there are
  /// max_spare_cqs already (the caller destroys it).
  bool keep_spare_cq(ibv_cq* cq, std::uint32_t size, int vector) noexcept {
    std::lock_guard lock(spare_cqs_mutex);
    if (spare_cqs.size() >= max_spare_cqs) return false;
    spare_cqs.push_back({cq, size, vector});  // no allocation: reserved by the constructor
    return true;
  }

  /// Closes the spare event channels, destroys the spare CQs, deregisters the flush
  /// buffer and deallocates the domain, reporting the first failure (the rest is still
  /// released). Idempotent.
  expected<void> release(Teardown by) noexcept {
    // libibverbs' destroy calls return the errno value instead of setting errno
    FirstError first{by};
    {
      std::lock_guard lock(spare_channels_mutex);
      for (rdma_event_channel* channel : spare_channels) seam->destroy_event_channel(channel);
      spare_channels.clear();
    }
    {
      std::lock_guard lock(spare_cqs_mutex);
      for (const SpareCq& spare : spare_cqs)
        first.value_call(seam->destroy_cq(spare.cq), "ibv_destroy_cq");
      spare_cqs.clear();
    }
    if (flush_mr) first.value_call(seam->dereg_mr(flush_mr.release()), "ibv_dereg_mr");
    flush_buffer.reset();
    if (pd) first.value_call(seam->dealloc_pd(pd.release()), "ibv_dealloc_pd");
    return first.result();
  }
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
inline expected<MemoryRegion> register_memory(const PeerState& peer, void* addr,
                                              std::size_t size, MrUsage usage,
                                              Rights rights = Rights::of_usage) noexcept {
  const Provider& p = provider();
  const int access = rights == Rights::of_usage ? access_for(usage, peer.iwarp, peer.native_flush)
                     : rights == Rights::for_windows ? access_for_grants(usage, peer.iwarp)
                     : access_for_grants(usage, peer.iwarp) & ~IBV_ACCESS_MW_BIND;
  errno = 0;
  ibv_mr* mr = p.reg_mr(peer.pd.get(), addr, size, access);
  if (mr == nullptr && errno == EINVAL && (access & native_flush_abi::access_flush_persistent))
    return fail(provider_error("ibv_reg_mr", EINVAL,
                               "the device flushes natively and refuses flush_persistent for "
                               "memory that is not persistent (rxe: only pmem pages)"));
  if (mr == nullptr && errno == EOPNOTSUPP && peer.odp) {
    errno = 0;
    mr = p.reg_mr(peer.pd.get(), addr, size, access | IBV_ACCESS_ON_DEMAND);
    if (mr == nullptr)
      return fail(provider_error("ibv_reg_mr", errno, "retried with IBV_ACCESS_ON_DEMAND"));
  }
  if (mr == nullptr) return fail(provider_error("ibv_reg_mr", errno));
  return MemoryRegion(mr);
}

/// Allocates `state`'s protection domain on `context` and registers the page its emulated
/// flushes read into (Peer::open; a connection's own domain, own_domain). Errors:
/// provider / nomem: ibv_alloc_pd or ibv_reg_mr failed, or no page. What it made is
/// released with `state`.
inline expected<void> open_domain(const char* call, PeerState& state, ibv_context* context) noexcept {
  errno = 0;
  state.pd.reset(provider().alloc_pd(context));
  if (!state.pd) {
    const int e = errno;
    if (e == 0) return fail(Error(errc::unknown, 0, "ibv_alloc_pd", "no errno set"));
    return fail(provider_error("ibv_alloc_pd", e));
  }
  state.context = context;
  const long page = sysconf(_SC_PAGESIZE);
  const std::size_t page_size = page > 0 ? static_cast<std::size_t>(page) : 4096;
  state.flush_buffer.reset(static_cast<std::byte*>(std::aligned_alloc(page_size, page_size)));
  if (!state.flush_buffer) return fail(Error(errc::nomem, ENOMEM, call, "no page for the flush buffer"));
  auto flush_mr = register_memory(state, state.flush_buffer.get(), PeerState::flush_read_size, MrUsage::read_dst);
  if (!flush_mr) return fail(flush_mr.error());
  state.flush_mr = std::move(*flush_mr);
  return {};
}

/// A protection domain of its own for one connection (ConnConfig::own_protection_domain),
/// on the device of `like` (the Peer the connection would otherwise use), whose
/// capabilities it shares: no probe, only open_domain's calls. Errors: as open_domain;
/// nomem when out of memory.
inline expected<std::shared_ptr<PeerState>> own_domain(const char* call, const PeerState& like) noexcept {
  std::shared_ptr<PeerState> state;
  try {
    state = std::make_shared<PeerState>();
  } catch (const std::bad_alloc&) {
    return fail(Error(errc::nomem, ENOMEM, call, "memory allocation failed"));
  }
  state->teardown = {call, LogLevel::notice};  // until the connection is made
  state->iwarp = like.iwarp;
  state->odp = like.odp;
  state->native_atomic_write = like.native_atomic_write;
  state->native_flush = like.native_flush;
  state->memory_windows = like.memory_windows;
  if (auto opened = open_domain(call, *state, like.context); !opened) return fail(opened.error());
  state->teardown = {"Peer (last reference)", LogLevel::warning};
  return state;
}

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
  static expected<Peer> open(ibv_context* context) noexcept {
    constexpr const char* call = "Peer::open";
    if (context == nullptr) return detail::fail(detail::invalid(call, "device context is null"));
    if (auto owned = detail::check_cm_context(call, context); !owned)
      return detail::fail(owned.error().name_operation(call));
    return detail::no_throw(call, [&]() -> expected<Peer> {
      auto state = std::make_shared<detail::PeerState>();
      state->teardown = {call, LogLevel::notice};  // until the Peer is made
      const detail::Provider& p = detail::provider();
      // librpma's capability probes: on-demand paging (RC read and write) and native
      // atomic write.
      ibv_device_attr_ex attr{};
      if (int rc = p.query_device_ex(context, nullptr, &attr); rc != 0)
        return detail::fail(detail::provider_error("ibv_query_device_ex", rc));
      const std::uint32_t rc_odp = attr.odp_caps.per_transport_caps.rc_odp_caps;
      state->odp = (attr.odp_caps.general_caps & IBV_ODP_SUPPORT) != 0 &&
                   (rc_odp & IBV_ODP_SUPPORT_READ) != 0 && (rc_odp & IBV_ODP_SUPPORT_WRITE) != 0;
      state->native_atomic_write = (attr.device_cap_flags_ex & detail::device_atomic_write_flag) != 0;
      // librpma 1.3's rule: native flush only when the device has both types
      constexpr std::uint64_t both_flushes = detail::native_flush_abi::device_flush_global |
                                             detail::native_flush_abi::device_flush_persistent;
      state->native_flush = detail::build_has_native_flush &&
                            (attr.device_cap_flags_ex & both_flushes) == both_flushes;
      state->memory_windows = (attr.orig_attr.device_cap_flags &
                               (IBV_DEVICE_MEM_WINDOW_TYPE_2A | IBV_DEVICE_MEM_WINDOW_TYPE_2B)) != 0;
      state->iwarp = context->device != nullptr &&
                     context->device->transport_type == IBV_TRANSPORT_IWARP;
      if (auto opened = detail::open_domain(call, *state, context); !opened) return detail::fail(opened.error());
      state->teardown = {"Peer (last reference)", LogLevel::warning};
      return Peer(std::move(state));
    });
  }

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
                                         std::chrono::milliseconds(1000)) noexcept {
    constexpr const char* call = "Peer::from_address";
    detail::SocketAddress where;
    if (auto ok = detail::check_numeric_address(call, addr, &where); !ok)
      return detail::fail(ok.error().name_operation(call));
    return detail::no_throw(call, [&]() -> expected<Peer> {
      const detail::Deadline deadline(detail::Wait::bounded(timeout));
      for (int attempt = 0;; ++attempt) {
        rdma_cm_id* raw = nullptr;
        errno = 0;
        if (detail::provider().create_id(nullptr, &raw, nullptr, RDMA_PS_TCP) != 0)
          return detail::fail(detail::provider_error("rdma_create_id", errno));
        // Destroyed on the way out: a failure there is logged (notice when this call fails).
        detail::CmId id(raw, detail::CmIdDeleter{false, detail::current_provider,
                                                 {call, LogLevel::notice}});
        errno = 0;
        if (kind == AddressKind::local) {
          if (detail::provider().bind_addr(id.get(), where.get()) != 0)
            return detail::fail(detail::provider_error("rdma_bind_addr", errno));
        } else if (detail::provider().resolve_addr(
                       id.get(), nullptr, where.get(),
                       attempt == 0 ? detail::Wait::bounded(timeout).ms : deadline.poll_timeout()) != 0) {
          // Without an event channel librdmacm waits for the resolution in a blocking
          // read, which a signal caught without SA_RESTART ends with EINTR: start again
          // on a fresh id with the time left (the old one may still get the event).
          const int e = errno;
          if (e == EINTR && !deadline.passed()) continue;
          return detail::fail(detail::provider_error(
              "rdma_resolve_addr", e, e == EINTR ? "a signal came after the timeout" : ""));
        }
        if (id->verbs == nullptr)
          return detail::fail(detail::invalid(call, "no RDMA device has address {}", addr));
        auto peer = open(id->verbs);
        if (peer) id.get_deleter().by.level = LogLevel::warning;
        return peer;
      }
    });
  }

  /// An empty Peer, as a moved-from one (every call is inval): for tables of slots.
  Peer() noexcept = default;
  Peer(Peer&&) noexcept = default;
  /// Releases this handle as the destructor does, then takes `other`'s.
  Peer& operator=(Peer&& other) noexcept {
    if (this != &other) {
      release_logged("Peer::operator=");
      state_ = std::move(other.state_);
    }
    return *this;
  }
  /// Releases this handle; when it is the last user of the protection domain, the domain
  /// is deallocated and a failure logged (warning, "Peer::~Peer"). When something made
  /// from the Peer goes last, its failure is logged under "Peer (last reference)".
  ~Peer() { release_logged("Peer::~Peer"); }

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
  /// Whether the device supports on-demand paging for RC reads and writes (librpma's
  /// rpma_utils_ibv_context_is_odp_capable): a registration refused with EOPNOTSUPP is
  /// then retried with IBV_ACCESS_ON_DEMAND. Errors: inval when empty.
  expected<bool> odp_capable() const noexcept {
    if (!state_) return detail::fail(detail::moved_from("Peer::odp_capable"));
    return state_->odp;
  }
  /// Whether the device has native 8-byte atomic writes (IBV_WR_ATOMIC_WRITE); without
  /// them Conn::atomic_write is emulated as librpma 1.2 does. Errors: inval when empty.
  expected<bool> native_atomic_write() const noexcept {
    if (!state_) return detail::fail(detail::moved_from("Peer::native_atomic_write"));
    return state_->native_atomic_write;
  }
  /// Whether Conn::flush runs natively (RDMA FLUSH, ibv_wr_flush): the build's rdma-core
  /// has it (45 on) and the device reports both flush types (IB_UVERBS_DEVICE_FLUSH_GLOBAL
  /// and _PERSISTENT; rxe from kernel 6.2), as librpma 1.3 decides. Otherwise a flush is
  /// emulated with an RDMA READ, as librpma 1.2 does. It also decides how regions are
  /// registered for flushes (MrUsage). Errors: inval when empty.
  expected<bool> native_flush() const noexcept {
    if (!state_) return detail::fail(detail::moved_from("Peer::native_flush"));
    return state_->native_flush;
  }
  /// Whether the device has memory windows bound to one queue pair (type 2A or 2B; rxe's
  /// 2B), which grants use (grant_mode()). Errors: inval when empty.
  expected<bool> memory_windows() const noexcept {
    if (!state_) return detail::fail(detail::moved_from("Peer::memory_windows"));
    return state_->memory_windows;
  }
  /// How MrScope::grants regions are granted: windows where the device has them
  /// (memory_windows()), registrations otherwise. Errors: inval when empty.
  expected<GrantMode> grant_mode() const noexcept {
    if (!state_) return detail::fail(detail::moved_from("Peer::grant_mode"));
    return state_->memory_windows ? GrantMode::windows : GrantMode::registrations;
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
  /// Errors: inval when empty; provider: ibv_dereg_mr (the flush buffer's) or
  /// ibv_dealloc_pd failed (the first failure; the rest is still released, and a later
  /// failure is logged, notice).
  expected<void> close() && noexcept {
    if (!state_) return detail::fail(detail::moved_from("Peer::close"));
    auto state = std::move(state_);
    if (state.use_count() == 1) return detail::named("Peer::close", state->release({"Peer::close", LogLevel::warning}));
    return {};
  }

  /// Internal: the shared state, for the types made from a Peer.
  const std::shared_ptr<detail::PeerState>& state() const noexcept { return state_; }
  /// Internal: a handle to `state` (Conn::peer, ConnReq::peer).
  static Peer of(std::shared_ptr<detail::PeerState> state) noexcept { return Peer(std::move(state)); }

 private:
  explicit Peer(std::shared_ptr<detail::PeerState> state) noexcept : state_(std::move(state)) {}

  void release_logged(const char* where) noexcept {
    if (!state_) return;
    auto state = std::move(state_);
    // The last user: released here, under this name (no other reference can appear).
    if (state.use_count() == 1) {
      const detail::Teardown by{where, LogLevel::warning};
      if (auto released = state->release(by); !released) [[unlikely]]
        detail::log(by.level, by.where, released.error());
    }
  }

  std::shared_ptr<detail::PeerState> state_;
};

RPMAPP_END_NAMESPACE
