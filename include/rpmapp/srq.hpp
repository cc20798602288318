// rpmapp::Srq: a shared receive queue on a Peer, used by several connections
// (librpma's rpma_srq), and rpmapp::SrqConfig.
#pragma once

#include <rpmapp/cq.hpp>
#include <rpmapp/detail/data_path.hpp>
#include <rpmapp/detail/errors.hpp>
#include <rpmapp/detail/handles.hpp>
#include <rpmapp/error.hpp>
#include <rpmapp/mr.hpp>
#include <rpmapp/peer.hpp>

#include <cstdint>
#include <memory>

RPMAPP_BEGIN_NAMESPACE

/// Sizes of a shared receive queue (librpma's rpma_srq_cfg, with the defaults its manual
/// gives: 100 and 100; librpma 1.2's code uses 20 for both).
struct SrqConfig {
  /// Receives the queue holds. >= 1.
  std::uint32_t rq_size = 100;
  /// Size of the queue's own receive CQ, which every connection using the queue delivers
  /// its receive completions to; 0 = none (each connection's own CQ gets them).
  std::uint32_t rcq_size = 100;
};

namespace detail {
/// Member order is teardown order, reversed: the CQ before its channel, the queue, and
/// the protection domain (Peer) last.
struct SrqState {
  const Provider* seam = current_provider;
  std::shared_ptr<PeerState> peer;
  SharedReceiveQueue srq;
  CompChannel channel;
  CompletionQueue rcq;
  /// The connections whose receives complete into `rcq`, by queue pair number.
  CompletionRoutes routes;
  /// Who releases the queue when the state goes: Srq::create on its failure paths, then
  /// the last of the Srq and the connections using it.
  Teardown teardown{"Srq (last reference)", LogLevel::warning};

  SrqState() = default;
  SrqState(const SrqState&) = delete;
  SrqState& operator=(const SrqState&) = delete;
  ~SrqState();

  /// Destroys the CQ, its channel and the queue, reporting the first failure (the rest is
  /// still released). Idempotent.
  expected<void> release(Teardown by) noexcept;
};
}  // namespace detail

/// A shared receive queue: receives posted here serve every connection created with
/// ConnConfig::srq pointing at it. Move-only; the queue lives until the Srq and every
/// connection using it are gone.
/// Thread safety: recv() may be called from several threads at once (the provider
/// serializes posts to a shared receive queue); the receive CQ is one thread's at a time.
class Srq {
 public:
  /// Creates the queue (ibv_create_srq, one scatter/gather entry per receive) and, when
  /// config.rcq_size > 0, its receive CQ with a completion channel (librpma's rpma_srq_new).
  /// Errors:
  /// - inval: empty `peer`; rq_size 0; a size above 2^31-1; rq_size above the device's
  ///   max_srq_wr or rcq_size above its max_cqe (Peer::capabilities), naming the device.
  /// - provider / nomem: ibv_create_srq, ibv_create_comp_channel, ibv_create_cq or
  ///   ibv_req_notify_cq failed (errno in the Error).
  /// Thread safety: may be called concurrently.
  static expected<Srq> create(const Peer& peer, const SrqConfig& config = {}) noexcept;

  /// An empty Srq, as a moved-from one (every call is inval): for tables of slots.
  Srq() noexcept = default;
  Srq(Srq&&) noexcept = default;
  /// Releases this handle as the destructor does, then takes `other`'s.
  Srq& operator=(Srq&& other) noexcept;
  /// Releases this handle; when no connection uses the queue any more it is destroyed and
  /// a failure logged (warning, "Srq::~Srq"). When a connection goes last, its failure is
  /// logged under "Srq (last reference)".
  ~Srq() { release_logged("Srq::~Srq"); }

  explicit operator bool() const noexcept { return state_ != nullptr; }

  /// Posts a receive of [offset, offset + len) of `dst` (registered for MrUsage::recv) to
  /// the shared queue (librpma's rpma_srq_recv); `context` comes back as the completion's
  /// wr_id. A length of 0 receives a message without payload (e.g. only immediate data).
  /// Errors: inval (empty Srq or region, range outside the region, region not registered
  /// for recv; nothing is posted); provider: ibv_post_srq_recv failed (ENOMEM: the queue
  /// is full).
  expected<void> recv(const MrLocal& dst, std::size_t offset, std::size_t len,
                      std::uint64_t context = 0) noexcept {
    constexpr const char* call = "Srq::recv";
    if (!state_) [[unlikely]]
      return detail::fail(detail::moved_from(call));
    auto sge = detail::recv_sge(call, dst, offset, len, state_->peer->pd.get());
    if (!sge) [[unlikely]]
      return detail::fail(sge.error());
    return detail::post_srq_recv("Srq::recv", state_->srq.get(), *sge, context, state_->peer->iwarp);
  }

  /// The queue's receive CQ; an empty Cq when it was created with rcq_size 0. Its
  /// completions are tagged with their connections (Cq::get with `conns`).
  /// Errors: inval when empty.
  expected<Cq> rcq() const noexcept;

  /// The queue itself, for raw verbs. Errors: inval when empty.
  expected<ibv_srq*> native() const noexcept;

  /// Releases this handle. When no connection uses the queue any more it is destroyed now
  /// (CQ, channel, queue) and the first failure is reported; otherwise it goes with its
  /// last connection. The Srq is empty afterwards, whatever the result.
  /// Errors: inval when empty; provider: ibv_destroy_cq, ibv_destroy_comp_channel or
  /// ibv_destroy_srq failed (the first failure; a later one is logged, notice).
  expected<void> close() && noexcept;

  /// Internal: the shared state, for the connections that use the queue.
  const std::shared_ptr<detail::SrqState>& state() const noexcept { return state_; }

 private:
  explicit Srq(std::shared_ptr<detail::SrqState> state) noexcept : state_(std::move(state)) {}

  void release_logged(const char* where) noexcept;

  std::shared_ptr<detail::SrqState> state_;
};

RPMAPP_END_NAMESPACE

#if !defined(RPMAPP_SEPARATE_COMPILATION)
#  include <rpmapp/impl/srq.ipp>
#endif
