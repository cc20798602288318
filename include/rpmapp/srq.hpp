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
  /// Who releases the queue when the state goes: Srq::create on its failure paths, then
  /// the last of the Srq and the connections using it.
  Teardown teardown{"Srq (last reference)", LogLevel::warning};

  SrqState() = default;
  SrqState(const SrqState&) = delete;
  SrqState& operator=(const SrqState&) = delete;
  ~SrqState() {
    if (auto released = release(teardown); !released) [[unlikely]]
      log(teardown.level, teardown.where, released.error());
  }

  /// Destroys the CQ, its channel and the queue, reporting the first failure (the rest is
  /// still released). Idempotent.
  expected<void> release(Teardown by) noexcept {
    FirstError first{by};
    if (rcq) first.value_call(seam->destroy_cq(rcq.release()), "ibv_destroy_cq");
    if (channel)
      first.value_call(seam->destroy_comp_channel(channel.release()), "ibv_destroy_comp_channel");
    if (srq) first.value_call(seam->destroy_srq(srq.release()), "ibv_destroy_srq");
    return first.result();
  }
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
  /// - inval: empty `peer`; rq_size 0; a size above 2^31-1.
  /// - provider / nomem: ibv_create_srq, ibv_create_comp_channel, ibv_create_cq or
  ///   ibv_req_notify_cq failed (errno in the Error).
  /// Thread safety: may be called concurrently.
  static expected<Srq> create(const Peer& peer, const SrqConfig& config = {}) noexcept {
    constexpr const char* call = "Srq::create";
    if (!peer) return detail::fail(detail::moved_from(call));
    if (config.rq_size == 0) return detail::fail(detail::invalid(call, "rq_size must be at least 1"));
    if (config.rq_size > 0x7fffffffu || config.rcq_size > 0x7fffffffu)
      return detail::fail(detail::invalid(call, "rq_size and rcq_size must fit in an int"));
    return detail::no_throw(call, [&]() -> expected<Srq> {
      const detail::Provider& p = detail::provider();
      auto state = std::make_shared<detail::SrqState>();
      state->teardown = {call, LogLevel::notice};  // until the Srq is made
      state->peer = peer.state();
      ibv_srq_init_attr attr{};
      attr.attr.max_wr = config.rq_size;
      attr.attr.max_sge = 1;
      errno = 0;
      state->srq.reset(p.create_srq(state->peer->pd.get(), &attr));
      if (!state->srq) return detail::fail(detail::provider_error("ibv_create_srq", errno));
      if (config.rcq_size > 0) {
        ibv_context* context = state->peer->context;
        errno = 0;
        state->channel.reset(p.create_comp_channel(context));
        if (!state->channel) return detail::fail(detail::provider_error("ibv_create_comp_channel", errno));
        errno = 0;
        state->rcq.reset(p.create_cq(context, static_cast<int>(config.rcq_size), nullptr,
                                     state->channel.get(), 0));
        if (!state->rcq) return detail::fail(detail::provider_error("ibv_create_cq", errno));
        if (auto armed = detail::rearm(state->rcq.get()); !armed) return detail::fail(armed.error());
      }
      state->teardown = {"Srq (last reference)", LogLevel::warning};
      return Srq(std::move(state));
    });
  }

  /// An empty Srq, as a moved-from one (every call is inval): for tables of slots.
  Srq() noexcept = default;
  Srq(Srq&&) noexcept = default;
  /// Releases this handle as the destructor does, then takes `other`'s.
  Srq& operator=(Srq&& other) noexcept {
    if (this != &other) {
      release_logged("Srq::operator=");
      state_ = std::move(other.state_);
    }
    return *this;
  }
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
    return detail::post_srq_recv("Srq::recv", state_->srq.get(), *sge, context);
  }

  /// The queue's receive CQ; an empty Cq when it was created with rcq_size 0.
  /// Errors: inval when empty.
  expected<Cq> rcq() const noexcept {
    if (!state_) return detail::fail(detail::moved_from("Srq::rcq"));
    return Cq(state_->rcq.get(), state_->channel.get(), false);
  }

  /// The queue itself, for raw verbs. Errors: inval when empty.
  expected<ibv_srq*> native() const noexcept {
    if (!state_) return detail::fail(detail::moved_from("Srq::native"));
    return state_->srq.get();
  }

  /// Releases this handle. When no connection uses the queue any more it is destroyed now
  /// (CQ, channel, queue) and the first failure is reported; otherwise it goes with its
  /// last connection. The Srq is empty afterwards, whatever the result.
  /// Errors: inval when empty; provider: ibv_destroy_cq, ibv_destroy_comp_channel or
  /// ibv_destroy_srq failed (the first failure; a later one is logged, notice).
  expected<void> close() && noexcept {
    if (!state_) return detail::fail(detail::moved_from("Srq::close"));
    auto state = std::move(state_);
    if (state.use_count() != 1) return {};
    return detail::named("Srq::close", state->release({"Srq::close", LogLevel::warning}));
  }

  /// Internal: the shared state, for the connections that use the queue.
  const std::shared_ptr<detail::SrqState>& state() const noexcept { return state_; }

 private:
  explicit Srq(std::shared_ptr<detail::SrqState> state) noexcept : state_(std::move(state)) {}

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

  std::shared_ptr<detail::SrqState> state_;
};

RPMAPP_END_NAMESPACE
