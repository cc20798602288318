// What a completion queue tells the connections whose completions it holds: a transport
// failure (PathMonitor), and, for a queue shared by several connections (SharedCq, a shared
// receive queue's CQ), which connection each completion is for (CompletionRoutes).
#pragma once

#include <rpmapp/conn_id.hpp>
#include <rpmapp/detail/grants.hpp>
#include <rpmapp/detail/provider.hpp>
#include <rpmapp/detail/source_link.hpp>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <span>
#include <unordered_map>
#include <vector>

RPMAPP_BEGIN_NAMESPACE
namespace detail {

/// How a connection learns from its completions that its peer stopped answering: a work
/// request failed with IBV_WC_RETRY_EXC_ERR (the transport's retries ran out), which
/// rdma_cm does not report while a link is down. Conn::next_event then reports
/// ConnEvent::lost once.
struct PathMonitor {
  std::atomic<bool> failed{false};  // atomic: the queues may be read on another thread
  SourceLink* watchers = nullptr;   // the connection's event-loop watchers, told once
  GrantRegistry* grants = nullptr;  // the connection's grants: settled by their binds' completions
  /// The connection's identity (Conn::id): here, so that a shared queue's route to the
  /// connection is this monitor alone.
  ConnId conn = next_conn_id();
};

/// Looks for a transport failure among completions just read from a queue of the
/// connection `path` watches (none: nothing to tell).
/// Also settles the connection's grants whose binds the completions show done.
inline void watch_path(PathMonitor* path, std::span<const ibv_wc> completions) noexcept {
  if (path == nullptr) return;
  if (path->grants != nullptr && path->grants->pending.load(std::memory_order_relaxed) != 0) [[unlikely]]
    path->grants->completed(completions, {"Grant (settled by its bind's completion)", LogLevel::warning});
  if (path->failed.load(std::memory_order_relaxed)) return;
  for (const ibv_wc& wc : completions)
    if (wc.status == IBV_WC_RETRY_EXC_ERR) {
      path->failed.store(true, std::memory_order_relaxed);
      if (path->watchers != nullptr) path->watchers->signal();
      return;
    }
}

/// The connections of one shared completion queue, by queue pair number: each completion
/// read is tagged with its connection's ConnId and told to that connection's PathMonitor.
///
/// A queue pair number is unique only while the queue pair lives: a provider may give it
/// to the next one (mlx5 does). So when a connection goes, after its queue pair was
/// destroyed (nothing completes into the queue any more), the queue is drained: the
/// completions of that queue pair are dropped, the others are parked, in order, and come
/// out first at the next read. Only then is the number forgotten, and a later queue pair of
/// the same number never gets the gone one's completions.
///
/// Thread safety: every member may be called from any thread (one mutex): the queue may be
/// read on one thread while connections come and go on another.
class CompletionRoutes {
 public:
  CompletionRoutes() = default;
  CompletionRoutes(const CompletionRoutes&) = delete;
  CompletionRoutes& operator=(const CompletionRoutes&) = delete;

  /// Room for `entries` parked completions (the queue's size): draining then allocates
  /// nothing while the queue holds no more than that. Errors: nomem.
  expected<void> reserve(std::size_t entries) noexcept;

  /// Routes the completions of queue pair `qp_num` to the connection of `path` (kept until
  /// retire). A number still routed to a queue pair whose draining failed is drained
  /// again first. Errors: nomem; provider (ibv_poll_cq failed while draining that stale
  /// number: nothing is changed).
  expected<void> add(const Provider& p, ibv_cq* cq, std::uint32_t qp_num, PathMonitor& path) noexcept;

  /// The connection of queue pair `qp_num` is going and its queue pair was destroyed (or
  /// `qp_survived` a failed ibv_destroy_qp): drains the queue of its completions and
  /// forgets the number. A queue pair that survived, or whose draining failed, keeps its
  /// number routed to its ConnId, without a PathMonitor (`path` must not be used any
  /// more), so its completions never reach another connection.
  /// Errors: provider (ibv_poll_cq failed while draining).
  expected<void> retire(const Provider& p, ibv_cq* cq, std::uint32_t qp_num, bool qp_survived) noexcept;

  /// Reads up to out.size() completions: the parked ones first, then ibv_poll_cq. With
  /// `conns` (as many entries as `out`) each is tagged with its connection (ConnId{} for a
  /// queue pair that is no connection's). Returns how many, or ibv_poll_cq's negative value
  /// (nothing was read then).
  int poll(const Provider& p, ibv_cq* cq, std::span<ibv_wc> out, ConnId* conns) noexcept;

  /// How many queue pair numbers are routed (connections, and stale numbers).
  std::size_t size() noexcept;

 private:
  /// One word, as a shared queue holds one per connection: the connection's PathMonitor
  /// while it lives; once it is gone, its ConnId alone (shifted, the low bit set: a
  /// PathMonitor's address is even).
  class Route {
   public:
    explicit Route(PathMonitor& path) noexcept : bits_(reinterpret_cast<std::uintptr_t>(&path)) {}
    ConnId conn() const noexcept { return gone() ? ConnId{bits_ >> 1} : path()->conn; }
    /// Null once the connection is gone.
    PathMonitor* path() const noexcept { return gone() ? nullptr : reinterpret_cast<PathMonitor*>(bits_); }
    void forget_path() noexcept {
      if (!gone()) bits_ = static_cast<std::uintptr_t>(path()->conn.value << 1) | 1;
    }

   private:
    bool gone() const noexcept { return (bits_ & 1) != 0; }
    std::uintptr_t bits_;
  };
  static_assert(alignof(PathMonitor) > 1 && sizeof(std::uintptr_t) == sizeof(std::uint64_t));

  // With the mutex held: polls `cq` until empty, parking the completions of every queue pair
  // but `qp_num`'s, and drops the parked ones of `qp_num`. False when ibv_poll_cq failed.
  bool drain(const Provider& p, ibv_cq* cq, std::uint32_t qp_num, int& failure) noexcept;

  std::mutex mutex_;
  std::unordered_map<std::uint32_t, Route> routes_;
  std::vector<ibv_wc> parked_;
  std::size_t parked_head_ = 0;  // parked_[parked_head_, end) are still to be read
};

}  // namespace detail
RPMAPP_END_NAMESPACE

#if !defined(RPMAPP_SEPARATE_COMPILATION)
#  include <rpmapp/impl/detail_completion_routes.ipp>
#endif
