// Owning handles for provider resources. Each deleter goes through the provider seam that
// was current when the handle was made (a handle that outlives a test's provider override
// is still released by the provider that created its resource); a struct's member order
// encodes teardown order (a cm_id before its event channel).
//
// The owners (ConnectionCore, ListenerState, PeerState, SrqState, MrLocal) release their
// handles explicitly and report failures under their own name; a deleter below releases
// only what an owner did not, and reports a failure that nobody else can see through the
// log hook (warning, `where` naming the handle). Nothing is formatted unless a log
// function listens.
#pragma once

#include <rpmapp/detail/errors.hpp>
#include <rpmapp/detail/provider.hpp>
#include <rpmapp/log.hpp>

#include <cerrno>
#include <memory>
#include <optional>

RPMAPP_BEGIN_NAMESPACE
namespace detail {

/// Who tears something down, for the log: the rpmapp function or destructor (`where`),
/// and how severe a failed release is there: warning where nobody else learns of it,
/// notice where the caller already gets an error (the first failure of a close(), or the
/// failure that made a call give up).
struct Teardown {
  const char* where;
  LogLevel level;
};

/// Reports a failed release: `rc` as librdmacm returns it (-1 and errno).
void log_errno_release(const Teardown& by, int rc, const char* call) noexcept;
/// As above, for libibverbs' destroy calls (which return the errno value).
void log_value_release(const Teardown& by, int rc, const char* call) noexcept;

/// One level less severe than `level` (debug stays debug).
constexpr LogLevel less_severe(LogLevel level) noexcept {
  return level == LogLevel::debug ? level : static_cast<LogLevel>(static_cast<int>(level) + 1);
}

/// Remembers the first failure of a teardown sequence that goes on regardless (the one
/// the caller gets); each later one is logged one level below `by.level`, under `by.where`.
struct FirstError {
  explicit FirstError(Teardown who) noexcept : by(who) {}
  Teardown by;
  // optional: an Error is large and zero-filled when made; teardown usually has none
  std::optional<Error> error;
  /// For calls returning -1 and setting errno (librdmacm).
  void errno_call(int rc, const char* call) noexcept {
    if (rc != 0) [[unlikely]]
      note(provider_error(call, errno));
  }
  /// For calls returning an errno value (libibverbs).
  void value_call(int rc, const char* call) noexcept {
    if (rc != 0) [[unlikely]]
      note(provider_error(call, rc));
  }
  void note(const Error& e) noexcept;
  expected<void> result() const noexcept {
    if (error) [[unlikely]]
      return fail(*error);
    return {};
  }
};

/// The provider seam current when a handle is made, kept by its deleter.
struct CapturedProvider {
  const Provider* seam = current_provider;
  const Provider& provider() const noexcept { return *seam; }
};

/// For the handles of an owner that releases them all itself, through the one seam it
/// keeps (ConnectionCore: close_core, through core.seam): the deleter is only a backstop
/// and takes no room (a server keeps a core per connection). Should it run, it releases
/// through the seam current then.
struct CurrentProvider {
  const Provider& provider() const noexcept { return *current_provider; }
};

template <class Seam>
struct EventChannelDeleterOf : Seam {
  void operator()(rdma_event_channel* c) const noexcept { this->provider().destroy_event_channel(c); }
};
using EventChannelDeleter = EventChannelDeleterOf<CapturedProvider>;
using EventChannel = std::unique_ptr<rdma_event_channel, EventChannelDeleter>;

/// rdma_destroy_id through `p`, a failure logged under `by`.
void destroy_cm_id(const Provider& p, rdma_cm_id* id, const Teardown& by) noexcept;

/// Destroys a cm_id; `by` may be changed while the handle lives (a call that gives up
/// with an error logs the failed destroy as a notice).
struct CmIdDeleter : CapturedProvider {
  Teardown by{"detail::CmId", LogLevel::warning};
  void operator()(rdma_cm_id* id) const noexcept { destroy_cm_id(provider(), id, by); }
};
using CmId = std::unique_ptr<rdma_cm_id, CmIdDeleter>;

/// The backstop of a cm_id whose owner releases it itself (ConnectionCore, which also
/// rejects an unanswered request first): it only destroys the id.
struct OwnedCmIdDeleter : CurrentProvider {
  void operator()(rdma_cm_id* id) const noexcept { destroy_cm_id(provider(), id, by); }
  static constexpr Teardown by{"detail::CmId", LogLevel::warning};
};

/// Acknowledges a CM event (which releases it) when it goes out of scope. A caller that
/// lets an event go this way on its failure paths names itself in `by`.
struct CmEventAcker : CapturedProvider {
  Teardown by{"detail::CmEvent", LogLevel::warning};
  void operator()(rdma_cm_event* e) const noexcept {
    errno = 0;
    log_errno_release(by, provider().ack_cm_event(e), "rdma_ack_cm_event");
  }
};
using CmEvent = std::unique_ptr<rdma_cm_event, CmEventAcker>;

struct PdDeleter : CapturedProvider {
  void operator()(ibv_pd* pd) const noexcept {
    log_value_release(by, provider().dealloc_pd(pd), "ibv_dealloc_pd");
  }
  static constexpr Teardown by{"detail::ProtectionDomain", LogLevel::warning};
};
using ProtectionDomain = std::unique_ptr<ibv_pd, PdDeleter>;

template <class Seam>
struct CompChannelDeleterOf : Seam {
  void operator()(ibv_comp_channel* c) const noexcept {
    log_value_release(by, this->provider().destroy_comp_channel(c), "ibv_destroy_comp_channel");
  }
  static constexpr Teardown by{"detail::CompChannel", LogLevel::warning};
};
using CompChannelDeleter = CompChannelDeleterOf<CapturedProvider>;
using CompChannel = std::unique_ptr<ibv_comp_channel, CompChannelDeleter>;

template <class Seam>
struct CqDeleterOf : Seam {
  void operator()(ibv_cq* cq) const noexcept {
    log_value_release(by, this->provider().destroy_cq(cq), "ibv_destroy_cq");
  }
  static constexpr Teardown by{"detail::CompletionQueue", LogLevel::warning};
};
using CqDeleter = CqDeleterOf<CapturedProvider>;
using CompletionQueue = std::unique_ptr<ibv_cq, CqDeleter>;

/// The queue pair of a cm_id (created by rdma_create_qp); holds the id without owning it.
template <class Seam>
struct QpDeleterOf : Seam {
  void operator()(rdma_cm_id* id) const noexcept {
    log_value_release(by, this->provider().destroy_qp(id), "ibv_destroy_qp");
  }
  static constexpr Teardown by{"detail::QueuePair", LogLevel::warning};
};
using QpDeleter = QpDeleterOf<CapturedProvider>;
using QueuePairOf = std::unique_ptr<rdma_cm_id, QpDeleter>;

// The handles of an owner that releases them itself (ConnectionCore): their deleters
// take no room (CurrentProvider).
using OwnedEventChannel = std::unique_ptr<rdma_event_channel, EventChannelDeleterOf<CurrentProvider>>;
using OwnedCmId = std::unique_ptr<rdma_cm_id, OwnedCmIdDeleter>;
using OwnedCompChannel = std::unique_ptr<ibv_comp_channel, CompChannelDeleterOf<CurrentProvider>>;
using OwnedCompletionQueue = std::unique_ptr<ibv_cq, CqDeleterOf<CurrentProvider>>;
using OwnedQueuePair = std::unique_ptr<rdma_cm_id, QpDeleterOf<CurrentProvider>>;

struct MrDeleter : CapturedProvider {
  void operator()(ibv_mr* mr) const noexcept {
    log_value_release(by, provider().dereg_mr(mr), "ibv_dereg_mr");
  }
  static constexpr Teardown by{"detail::MemoryRegion", LogLevel::warning};
};
using MemoryRegion = std::unique_ptr<ibv_mr, MrDeleter>;

struct SrqDeleter : CapturedProvider {
  void operator()(ibv_srq* srq) const noexcept {
    log_value_release(by, provider().destroy_srq(srq), "ibv_destroy_srq");
  }
  static constexpr Teardown by{"detail::SharedReceiveQueue", LogLevel::warning};
};
using SharedReceiveQueue = std::unique_ptr<ibv_srq, SrqDeleter>;

/// For a handle on shared state that its last reference releases (PeerState, SrqState,
/// SharedCqState: `expected<void> release(Teardown)`): the handle's close(), named `call`.
/// Releases the state when `state` was its last reference, else only lets go of it.
template <class State>
expected<void> close_last_reference(std::shared_ptr<State> state, const char* call) noexcept {
  if (state.use_count() != 1) return {};
  return named(call, state->release({call, LogLevel::warning}));
}

/// As close_last_reference, for a destructor or an assignment (`where`): a failure is logged.
template <class State>
void release_last_reference_logged(std::shared_ptr<State> state, const char* where) noexcept {
  if (!state || state.use_count() != 1) return;  // no other reference can appear when it is 1
  const Teardown by{where, LogLevel::warning};
  if (auto released = state->release(by); !released) [[unlikely]]
    log(by.level, by.where, released.error());
}

}  // namespace detail
RPMAPP_END_NAMESPACE

#if !defined(RPMAPP_SEPARATE_COMPILATION)
#  include <rpmapp/impl/detail_handles.ipp>
#endif
