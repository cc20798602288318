// rpmapp::SharedCq: one completion queue for many connections of a Peer, its completions
// tagged with their connections; and rpmapp::SharedCqConfig.
#pragma once

#include <rpmapp/cq.hpp>
#include <rpmapp/detail/completion_routes.hpp>
#include <rpmapp/detail/errors.hpp>
#include <rpmapp/detail/handles.hpp>
#include <rpmapp/error.hpp>
#include <rpmapp/peer.hpp>

#include <cstdint>
#include <memory>

RPMAPP_BEGIN_NAMESPACE

/// The shape of a shared completion queue.
struct SharedCqConfig {
  /// Entries (ibv_create_cq's cqe; the device may give more). Every connection using the
  /// queue completes into it: size it for the work requests all of them can have
  /// outstanding at once (send queues, and receive queues or a shared receive queue whose
  /// receives come here), or the queue overruns and its connections fail. 1 to the
  /// device's max_cqe (Soft-RoCE: 32767).
  std::uint32_t size = 4096;
  /// Whether the queue has a completion channel (one fd) to wait on: Cq::wait, next, fd.
  /// false: it is only polled (Cq::get), as ConnConfig::completion_channel false.
  bool completion_channel = true;
  /// The completion vector, below the device's num_comp_vectors.
  int completion_vector = 0;
};

namespace detail {
/// Member order is teardown order, reversed: the CQ before its channel, the Peer last.
struct SharedCqState {
  const Provider* seam = current_provider;
  std::shared_ptr<PeerState> peer;
  CompChannel channel;
  CompletionQueue cq;
  /// The connections whose queue pairs complete here, by queue pair number.
  CompletionRoutes routes;
  /// For the event loop watching the queue: whether it took the queue's event and has not
  /// re-armed it yet ([0]; [1] unused), as ConnectionCore::rearm_due; whether it made the
  /// channel's fd non-blocking.
  bool rearm_due[2] = {false, false};
  bool fd_nonblocking = false;
  /// Who releases the queue: SharedCq::create on its failure paths, then the last of the
  /// SharedCq and the connections using it.
  Teardown teardown{"SharedCq (last reference)", LogLevel::warning};

  SharedCqState() = default;
  SharedCqState(const SharedCqState&) = delete;
  SharedCqState& operator=(const SharedCqState&) = delete;
  ~SharedCqState();

  /// Destroys the CQ and its channel, reporting the first failure. Idempotent.
  expected<void> release(Teardown by) noexcept;
};
}  // namespace detail

/// A completion queue that the connections created with ConnConfig::shared_cq pointing at
/// it share, instead of each having its own: their send completions, and their receive
/// completions unless a shared receive queue with a CQ of its own (Srq) takes those. A
/// server with thousands of connections then has one queue (and at most one fd) to poll
/// or wait on instead of thousands. Each completion comes back tagged with its connection
/// (cq().get(out, conns), Conn::id), looked up by queue pair number in O(1); a released
/// connection's completions are dropped at its release, so they never reach a later
/// connection that got the same queue pair number. A connection that stops answering
/// (IBV_WC_RETRY_EXC_ERR) still reports ConnEvent::lost.
/// Move-only; the queue lives until the SharedCq and every connection using it are gone.
/// Thread safety: cq().get() may be called from several threads at once (a mutex); waiting
/// on the queue (cq().wait, next) is one thread's at a time; connections may be made and
/// released on any thread meanwhile.
class SharedCq {
 public:
  /// Creates the queue (ibv_create_cq) on `peer`'s device, with its completion channel
  /// (ibv_create_comp_channel) and armed (ibv_req_notify_cq) unless
  /// config.completion_channel is false.
  /// Errors:
  /// - inval: empty `peer`; size 0, above 2^31-1 or above the device's max_cqe
  ///   (Peer::capabilities); a negative completion_vector, or one not below the device's
  ///   num_comp_vectors.
  /// - provider / nomem: ibv_create_comp_channel, ibv_create_cq or ibv_req_notify_cq
  ///   failed (errno in the Error); out of memory.
  /// Thread safety: may be called concurrently.
  static expected<SharedCq> create(const Peer& peer, const SharedCqConfig& config = {}) noexcept;

  /// An empty SharedCq, as a moved-from one (every call is inval).
  SharedCq() noexcept = default;
  SharedCq(SharedCq&&) noexcept = default;
  /// Releases this handle as the destructor does, then takes `other`'s.
  SharedCq& operator=(SharedCq&& other) noexcept;
  /// Releases this handle; when no connection uses the queue any more it is destroyed and
  /// a failure logged (warning, "SharedCq::~SharedCq").
  ~SharedCq() { release_logged("SharedCq::~SharedCq"); }

  explicit operator bool() const noexcept { return state_ != nullptr; }

  /// The queue, to read (get, next: with a `conns` span for the tags) and wait on (wait,
  /// fd, arm). Valid while this SharedCq or a connection using the queue lives.
  /// Errors: inval when empty.
  expected<Cq> cq() const noexcept;

  /// How many connections' queue pairs complete into the queue now (queue pairs whose
  /// destruction failed count on: their numbers stay theirs). Errors: inval when empty.
  expected<std::size_t> connections() const noexcept;

  /// Releases this handle. When no connection uses the queue any more it is destroyed now
  /// (CQ, then channel) and the first failure is reported; otherwise it goes with its last
  /// connection. The SharedCq is empty afterwards, whatever the result.
  /// Errors: inval when empty; provider: ibv_destroy_cq or ibv_destroy_comp_channel failed.
  expected<void> close() && noexcept;

  /// Internal: the shared state, for the connections that use the queue.
  const std::shared_ptr<detail::SharedCqState>& state() const noexcept { return state_; }

 private:
  explicit SharedCq(std::shared_ptr<detail::SharedCqState> state) noexcept : state_(std::move(state)) {}

  void release_logged(const char* where) noexcept;

  std::shared_ptr<detail::SharedCqState> state_;
};

RPMAPP_END_NAMESPACE

#if !defined(RPMAPP_SEPARATE_COMPILATION)
#  include <rpmapp/impl/shared_cq.ipp>
#endif
