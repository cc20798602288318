// Owning handles for provider resources. Each deleter goes through the provider seam that
// was current when the handle was made (a handle that outlives a test's provider override
// is still released by the provider that created its resource); a struct's member order
// encodes teardown order (a cm_id before its event channel).
#pragma once

#include <rpmapp/detail/provider.hpp>

#include <memory>

RPMAPP_BEGIN_NAMESPACE
namespace detail {

/// The provider seam current when a handle is made, kept by its deleter.
struct CapturedProvider {
  const Provider* seam = current_provider;
  const Provider& provider() const noexcept { return *seam; }
};

struct EventChannelDeleter : CapturedProvider {
  void operator()(rdma_event_channel* c) const noexcept { provider().destroy_event_channel(c); }
};
using EventChannel = std::unique_ptr<rdma_event_channel, EventChannelDeleter>;

/// Destroys a cm_id; an incoming request that was never accepted is rejected first
/// (librpma only rejects, and leaks the id).
struct CmIdDeleter {
  bool reject_first = false;
  const Provider* seam = current_provider;
  void operator()(rdma_cm_id* id) const noexcept {
    if (reject_first) (void)seam->reject(id, nullptr, 0);
    (void)seam->destroy_id(id);
  }
};
using CmId = std::unique_ptr<rdma_cm_id, CmIdDeleter>;

/// Acknowledges a CM event (which releases it) when it goes out of scope.
struct CmEventAcker : CapturedProvider {
  void operator()(rdma_cm_event* e) const noexcept { (void)provider().ack_cm_event(e); }
};
using CmEvent = std::unique_ptr<rdma_cm_event, CmEventAcker>;

struct AddrInfoDeleter : CapturedProvider {
  void operator()(rdma_addrinfo* ai) const noexcept { provider().freeaddrinfo(ai); }
};
using AddrInfo = std::unique_ptr<rdma_addrinfo, AddrInfoDeleter>;

struct PdDeleter : CapturedProvider {
  void operator()(ibv_pd* pd) const noexcept { (void)provider().dealloc_pd(pd); }
};
using ProtectionDomain = std::unique_ptr<ibv_pd, PdDeleter>;

struct CompChannelDeleter : CapturedProvider {
  void operator()(ibv_comp_channel* c) const noexcept { (void)provider().destroy_comp_channel(c); }
};
using CompChannel = std::unique_ptr<ibv_comp_channel, CompChannelDeleter>;

struct CqDeleter : CapturedProvider {
  void operator()(ibv_cq* cq) const noexcept { (void)provider().destroy_cq(cq); }
};
using CompletionQueue = std::unique_ptr<ibv_cq, CqDeleter>;

/// The queue pair of a cm_id (created by rdma_create_qp); holds the id without owning it.
struct QpDeleter : CapturedProvider {
  void operator()(rdma_cm_id* id) const noexcept { provider().destroy_qp(id); }
};
using QueuePairOf = std::unique_ptr<rdma_cm_id, QpDeleter>;

struct MrDeleter : CapturedProvider {
  void operator()(ibv_mr* mr) const noexcept { (void)provider().dereg_mr(mr); }
};
using MemoryRegion = std::unique_ptr<ibv_mr, MrDeleter>;

struct SrqDeleter : CapturedProvider {
  void operator()(ibv_srq* srq) const noexcept { (void)provider().destroy_srq(srq); }
};
using SharedReceiveQueue = std::unique_ptr<ibv_srq, SrqDeleter>;

}  // namespace detail
RPMAPP_END_NAMESPACE
