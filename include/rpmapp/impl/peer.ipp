// Definitions of rpmapp/peer.hpp: opening and releasing a Peer's protection domain, registering memory.
#pragma once

#include <rpmapp/peer.hpp>

#include <rpmapp/detail/cm_event.hpp>

#include <cerrno>
#include <new>

#include <unistd.h>

RPMAPP_BEGIN_NAMESPACE

namespace detail {

RPMAPP_DECL rdma_event_channel* PeerState::take_spare_channel() noexcept {
  std::lock_guard lock(spare_channels_mutex);
  if (spare_channels.empty()) return nullptr;
  rdma_event_channel* channel = spare_channels.back();
  spare_channels.pop_back();
  return channel;
}

RPMAPP_DECL bool PeerState::keep_spare_channel(rdma_event_channel* channel) noexcept {
  std::lock_guard lock(spare_channels_mutex);
  if (spare_channels.size() >= max_spare_channels) return false;
  spare_channels.push_back(channel);  // no allocation: reserved by the constructor
  return true;
}

RPMAPP_DECL ibv_cq* PeerState::take_spare_cq(std::uint32_t size, int vector) noexcept {
  std::lock_guard lock(spare_cqs_mutex);
  for (std::size_t i = spare_cqs.size(); i-- > 0;) {  // the latest first
    if (spare_cqs[i].size != size || spare_cqs[i].vector != vector) continue;
    ibv_cq* cq = spare_cqs[i].cq;
    spare_cqs.erase(spare_cqs.begin() + static_cast<std::ptrdiff_t>(i));
    return cq;
  }
  return nullptr;
}

RPMAPP_DECL bool PeerState::keep_spare_cq(ibv_cq* cq, std::uint32_t size, int vector) noexcept {
  std::lock_guard lock(spare_cqs_mutex);
  if (spare_cqs.size() >= max_spare_cqs) return false;
  spare_cqs.push_back({cq, size, vector});  // no allocation: reserved by the constructor
  return true;
}

RPMAPP_DECL expected<void> PeerState::release(Teardown by) noexcept {
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
  if (uses_device) {
    uses_device = false;
    release_device(*seam, context);
  }
  return first.result();
}

RPMAPP_DECL expected<MemoryRegion> register_memory(const PeerState& peer, void* addr,
                                                   std::size_t size, MrUsage usage,
                                                   Rights rights) noexcept {
  if (auto present = check_device("ibv_reg_mr", peer.context); !present) return fail(present.error());
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

RPMAPP_DECL expected<void>
open_domain(const char* call, PeerState& state, ibv_context* context) noexcept {
  errno = 0;
  state.pd.reset(provider().alloc_pd(context));
  if (!state.pd) {
    const int e = errno;
    if (e == 0) return fail(Error(errc::unknown, 0, "ibv_alloc_pd", "no errno set"));
    return fail(provider_error("ibv_alloc_pd", e));
  }
  state.context = context;
  if (auto used = use_device(call, context); !used) return fail(used.error());
  state.uses_device = true;
  const long page = sysconf(_SC_PAGESIZE);
  const std::size_t page_size = page > 0 ? static_cast<std::size_t>(page) : 4096;
  state.flush_buffer.reset(static_cast<std::byte*>(std::aligned_alloc(page_size, page_size)));
  if (!state.flush_buffer) return fail(Error(errc::nomem, ENOMEM, call, "no page for the flush buffer"));
  auto flush_mr = register_memory(state, state.flush_buffer.get(), PeerState::flush_read_size, MrUsage::read_dst);
  if (!flush_mr) return fail(flush_mr.error());
  state.flush_mr = std::move(*flush_mr);
  return {};
}

RPMAPP_DECL expected<std::shared_ptr<PeerState>>
own_domain(const char* call, const PeerState& like) noexcept {
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
  state->atomics = like.atomics;
  state->max_queue_wr = like.max_queue_wr;
  state->max_sge = like.max_sge;
  state->max_read_sge = like.max_read_sge;
  state->max_cqe = like.max_cqe;
  state->max_srq_wr = like.max_srq_wr;
  state->max_outstanding_reads = like.max_outstanding_reads;
  if (auto opened = open_domain(call, *state, like.context); !opened) return fail(opened.error());
  state->teardown = {"Peer (last reference)", LogLevel::warning};
  return state;
}

}  // namespace detail

RPMAPP_DECL expected<Peer> Peer::open(ibv_context* context) noexcept {
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
    // (a build on rdma-core older than 44 cannot post it: emulated, as on a kernel without it)
    state->native_atomic_write = detail::build_has_native_atomic_write &&
                                 (attr.device_cap_flags_ex & detail::device_atomic_write_flag) != 0;
    // librpma 1.3's rule: native flush only when the device has both types
    constexpr std::uint64_t both_flushes = detail::native_flush_abi::device_flush_global |
                                           detail::native_flush_abi::device_flush_persistent;
    state->native_flush = detail::build_has_native_flush &&
                          (attr.device_cap_flags_ex & both_flushes) == both_flushes;
    state->memory_windows = (attr.orig_attr.device_cap_flags &
                             (IBV_DEVICE_MEM_WINDOW_TYPE_2A | IBV_DEVICE_MEM_WINDOW_TYPE_2B)) != 0;
    state->iwarp = context->device != nullptr &&
                   context->device->transport_type == IBV_TRANSPORT_IWARP;
    const ibv_device_attr& limits = attr.orig_attr;
    state->atomics = limits.atomic_cap != IBV_ATOMIC_NONE;
    state->max_queue_wr = static_cast<std::uint32_t>(std::max(limits.max_qp_wr, 0));
    state->max_sge = static_cast<std::uint32_t>(std::max(limits.max_sge, 0));
    state->max_read_sge = static_cast<std::uint32_t>(std::max(limits.max_sge_rd, 0));
    state->max_cqe = static_cast<std::uint32_t>(std::max(limits.max_cqe, 0));
    state->max_srq_wr = static_cast<std::uint32_t>(std::max(limits.max_srq_wr, 0));
    state->max_outstanding_reads = static_cast<std::uint32_t>(std::max(limits.max_qp_init_rd_atom, 0));
    if (auto opened = detail::open_domain(call, *state, context); !opened) return detail::fail(opened.error());
    state->teardown = {"Peer (last reference)", LogLevel::warning};
    return Peer(std::move(state));
  });
}

RPMAPP_DECL expected<Peer> Peer::from_address(std::string_view addr, AddressKind kind,
                                              std::chrono::milliseconds timeout) noexcept {
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
      detail::CmId id(raw, detail::CmIdDeleter{{}, {call, LogLevel::notice}});
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

RPMAPP_DECL Peer& Peer::operator=(Peer&& other) noexcept {
  if (this != &other) {
    release_logged("Peer::operator=");
    state_ = std::move(other.state_);
  }
  return *this;
}

RPMAPP_DECL expected<void> Peer::close() && noexcept {
  if (!state_) return detail::fail(detail::moved_from("Peer::close"));
  return detail::close_last_reference(std::move(state_), "Peer::close");
}

RPMAPP_DECL void Peer::release_logged(const char* where) noexcept {
  detail::release_last_reference_logged(std::move(state_), where);
}

RPMAPP_DECL expected<ibv_context*> Peer::context() const noexcept {
  if (!state_) return detail::fail(detail::moved_from("Peer::context"));
  return state_->context;
}

RPMAPP_DECL expected<ibv_pd*> Peer::pd() const noexcept {
  if (!state_) return detail::fail(detail::moved_from("Peer::pd"));
  return state_->pd.get();
}

RPMAPP_DECL expected<bool> Peer::odp_capable() const noexcept {
  if (!state_) return detail::fail(detail::moved_from("Peer::odp_capable"));
  return state_->odp;
}

RPMAPP_DECL expected<bool> Peer::native_atomic_write() const noexcept {
  if (!state_) return detail::fail(detail::moved_from("Peer::native_atomic_write"));
  return state_->native_atomic_write;
}

RPMAPP_DECL expected<bool> Peer::native_flush() const noexcept {
  if (!state_) return detail::fail(detail::moved_from("Peer::native_flush"));
  return state_->native_flush;
}

RPMAPP_DECL expected<bool> Peer::memory_windows() const noexcept {
  if (!state_) return detail::fail(detail::moved_from("Peer::memory_windows"));
  return state_->memory_windows;
}

RPMAPP_DECL expected<GrantMode> Peer::grant_mode() const noexcept {
  if (!state_) return detail::fail(detail::moved_from("Peer::grant_mode"));
  return state_->memory_windows ? GrantMode::windows : GrantMode::registrations;
}

RPMAPP_DECL expected<bool> Peer::iwarp() const noexcept {
  if (!state_) return detail::fail(detail::moved_from("Peer::iwarp"));
  return state_->iwarp;
}

RPMAPP_DECL expected<PrivateDataLimits> Peer::private_data_limits() const noexcept {
  if (!state_) return detail::fail(detail::moved_from("Peer::private_data_limits"));
  return rpmapp::private_data_limits(state_->iwarp);
}

RPMAPP_DECL expected<std::string> Peer::device_name() const noexcept {
  if (!state_) return detail::fail(detail::moved_from("Peer::device_name"));
  return detail::no_throw("Peer::device_name", [&]() -> expected<std::string> {
    return std::string(detail::device_name(state_->context));
  });
}

RPMAPP_DECL expected<DeviceCapabilities> Peer::capabilities() const noexcept {
  if (!state_) return detail::fail(detail::moved_from("Peer::capabilities"));
  const detail::PeerState& s = *state_;
  DeviceCapabilities caps;
  caps.iwarp = s.iwarp;
  caps.atomics = s.atomics;
  caps.immediate_data = !s.iwarp;
  caps.native_atomic_write = s.native_atomic_write;
  caps.native_flush = s.native_flush;
  caps.memory_windows = s.memory_windows;
  caps.odp = s.odp;
  caps.max_queue_wr = s.max_queue_wr;
  caps.max_sge = s.max_sge;
  caps.max_read_sge = s.max_read_sge;
  caps.max_cqe = s.max_cqe;
  caps.max_srq_wr = s.max_srq_wr;
  caps.max_outstanding_reads = s.max_outstanding_reads;
  return caps;
}

RPMAPP_END_NAMESPACE
