// What a connection request and a connection own: the cm_id with its own event channel (or
// its inbox on a shared one), the completion channel, the completion queues and the queue
// pair.
#pragma once

#include <rpmapp/config.hpp>
#include <rpmapp/cq.hpp>
#include <rpmapp/detail/address.hpp>
#include <rpmapp/detail/cm_event.hpp>
#include <rpmapp/detail/errors.hpp>
#include <rpmapp/detail/event_routes.hpp>
#include <rpmapp/detail/handles.hpp>
#include <rpmapp/detail/source_link.hpp>
#include <rpmapp/peer.hpp>
#include <rpmapp/private_data.hpp>
#include <rpmapp/shared_cq.hpp>
#include <rpmapp/shared_event_channel.hpp>
#include <rpmapp/srq.hpp>

#include <array>
#include <atomic>
#include <cstddef>
#include <memory>
#include <span>
#include <string_view>
#include <utility>
#include <vector>

RPMAPP_BEGIN_NAMESPACE
namespace detail {

/// The private data a connection received (with its request, acceptance or rejection), as
/// rdma_cm delivered it. Data of zeros only, what a peer that sends none gives on IB (rdma_cm
/// pads to the protocol's size), is kept as its length over a block of zeros: most servers'
/// connections then hold no copy, and the core holds one word.
class ReceivedPrivateData {
 public:
  ReceivedPrivateData() noexcept = default;
  ReceivedPrivateData(const ReceivedPrivateData&) = delete;
  ReceivedPrivateData& operator=(const ReceivedPrivateData&) = delete;
  ~ReceivedPrivateData() {
    if (copied()) delete[] reinterpret_cast<std::byte*>(bits_);
  }

  std::span<const std::byte> view() const noexcept {
    if (!copied()) return {zeros.data(), static_cast<std::size_t>(bits_ >> 1)};
    const auto* copy = reinterpret_cast<const std::byte*>(bits_);
    return {copy + 1, std::to_integer<std::size_t>(copy[0])};
  }
  bool empty() const noexcept { return view().empty(); }
  /// Copies the private data `event` carries (none: empty). Throws bad_alloc.
  void store(const rdma_cm_event& event);
  void swap(ReceivedPrivateData& other) noexcept { std::swap(bits_, other.bits_); }

 private:
  bool copied() const noexcept { return bits_ != 0 && (bits_ & 1) == 0; }

  // rdma_cm_event's private_data_len is a uint8_t
  static constexpr std::array<std::byte, 256> zeros{};
  // A copy (new std::byte[1 + size], the size first), or zeros only: (size << 1) | 1.
  std::uintptr_t bits_ = 0;
};

/// What a connection keeps of its ConnConfig once its queues are made: what releasing,
/// reusing and polling them and answering the request read (the rest of the config is read
/// while the queues are made, by accept_request and PendingConnReq).
struct ConnSettings {
  std::uint32_t cq_size = 0;
  std::uint32_t rcq_size = 0;
  int completion_vector = 0;
  std::uint8_t retry_count = 0;
  std::uint8_t rnr_retry_count = 0;
  bool completion_channel = true;
  bool shared_completion_channel = false;
  bool reuse_event_channel = false;
  bool reuse_completion_queues = false;
};

inline ConnSettings settings_of(const ConnConfig& cfg) noexcept {
  return {cfg.cq_size,        cfg.rcq_size,           cfg.completion_vector,         cfg.retry_count,
          cfg.rnr_retry_count, cfg.completion_channel, cfg.shared_completion_channel, cfg.reuse_event_channel,
          cfg.reuse_completion_queues};
}

/// Teardown (close_core): the grants' windows go first, then the queue pair, the CQs and
/// their channels, the cm_id (rejected first if it is an unanswered request), its event
/// channel, the shared receive queue, and the protection domain (Peer) last.
/// A server keeps one per connection, so it is kept small: its handles keep no provider
/// (close_core releases them all through `seam`), the device's name is read from the id,
/// and only ConnSettings of the config stay.
struct ConnectionCore {
  const Provider* seam = current_provider;  // the provider that makes and releases it
  std::shared_ptr<PeerState> peer;
  std::shared_ptr<SrqState> srq;  // ConnConfig::srq's, or none
  std::shared_ptr<SharedCqState> shared_cq;  // ConnConfig::shared_cq's, or none
  /// ConnConfig::shared_event_channel's (then `channel` is empty and the id's events come
  /// through `inbox`), or none.
  std::shared_ptr<EventRoutes> events;
  OwnedEventChannel channel;
  EventInbox inbox;
  OwnedCmId id;
  // the CQ's, or the one both CQs share (none: completion_channel off)
  OwnedCompChannel comp_channel;
  // the receive CQ's own (not shared)
  OwnedCompChannel rcq_channel;
  OwnedCompletionQueue cq;
  OwnedCompletionQueue rcq;
  OwnedQueuePair qp;
  std::uint32_t qp_num = 0;  // the queue pair's, kept to retire its routes after it is gone
  std::uint32_t max_inline_data = 0;  // as the queue pair was created
  ReceivedPrivateData private_data;
  ConnSettings config;
  bool reject_unanswered = false;     // `id` is an incoming request not answered yet
  bool direct_write_to_pmem = false;  // the peer's (Conn::apply_remote_peer_config)
  bool closed_reported = false;       // ConnEvent::closed was reported
  bool lost_reported = false;         // ConnEvent::lost was reported for path.failed
  bool device_removed = false;        // ConnEvent::lost was reported for DEVICE_REMOVAL
  /// An accepting side on iWARP until its ESTABLISHED event is read (take_conn_event):
  /// sends, writes and reads posted before it can reach the client ahead of the MPA reply
  /// and end the connection (measured on siw), so they are refused (await_established).
  /// Atomic: the data path may run on another thread than the event reader.
  std::atomic<bool> before_established{false};
  bool completion_fds_nonblocking = false;  // an event loop made them O_NONBLOCK
  /// The main CQ [0] and the receive CQ [1] whose event an event loop took and which it has
  /// not re-armed yet (ibv_req_notify_cq failed): such a queue raises no event until then,
  /// so the loop re-arms it before it next polls or waits (ChannelQueues).
  bool rearm_due[2] = {false, false};
  /// Told by the connection's queues when the peer stopped answering; tells `watchers`.
  /// path.conn is the connection's ConnId (tags its completions in shared queues; never
  /// reused).
  PathMonitor path{false, &watchers, &grants};
  /// The grants made on this connection (Grant::make): revoked before the queue pair goes.
  GrantRegistry grants;
  /// Event loops waiting on this connection: last, so they are told before anything is
  /// released (their fds leave epoll sets while still open).
  SourceLink watchers;
  /// Who releases what is left when the core is destroyed: the function that is making it
  /// (on its failure paths), then its owner's destructor. Each owner sets it.
  Teardown teardown{"detail::ConnectionCore", LogLevel::warning};

  ~ConnectionCore();

  /// The name of the device the connection is on (valid while `id` holds librdmacm's).
  std::string_view device() const noexcept { return device_name(id->verbs); }

  /// The receive CQ, its channel: the connection's own, the shared receive queue's, or
  /// none (receive completions go to the main CQ).
  ibv_cq* receive_cq() const noexcept;
  ibv_comp_channel* receive_channel() const noexcept;
};

/// Whether `core`'s event channel comes from and goes back to its peer's spares
/// (ConnConfig::reuse_event_channel; only through the provider that made the peer).
inline bool reuses_channels(const ConnectionCore& core) noexcept {
  return core.config.reuse_event_channel && core.peer && core.peer->seam == core.seam;
}

/// Whether `core`'s CQs come from and go back to its peer's spares
/// (ConnConfig::reuse_completion_queues; check_config has refused it with a completion
/// channel).
inline bool reuses_cqs(const ConnectionCore& core) noexcept {
  return core.config.reuse_completion_queues && core.peer && core.peer->seam == core.seam;
}

/// Releases `core`'s CQ `cq` of `size` entries once its queue pair is gone: with
/// reuse_completion_queues, polls it until it is empty and keeps it as a spare of the peer;
/// else, or when polling fails or the peer has enough spares, destroys it. A CQ whose queue
/// pair survived a failed ibv_destroy_qp is never kept (that queue pair could still complete
/// work into it): it is destroyed, which the kernel refuses (EBUSY) while the queue pair
/// holds it, so it stays with that queue pair.
void release_cq(const ConnectionCore& core, ibv_cq* cq, std::uint32_t size,
                bool qp_survived, FirstError& first) noexcept;

/// Once `core`'s queue pair is gone (or `qp_survived` its failed destruction): takes it
/// out of the shared queues' routes, draining them of its completions (CompletionRoutes::
/// retire).
void retire_routes(const ConnectionCore& core, bool qp_survived, FirstError& first) noexcept;

/// Releases everything `core` owns, in teardown order, reporting the first failure (the
/// later ones are logged, see FirstError).
expected<void> close_core(ConnectionCore& core, Teardown by) noexcept;

expected<void> check_config(const char* call, const ConnConfig& cfg) noexcept;
/// Checks `cfg`'s queue sizes and scatter/gather entries against `peer`'s device
/// (DeviceCapabilities), for a connection with or without a shared receive queue (`srq`:
/// rq_size unused) and shared CQ (cq_size unused). Errors: inval naming the size, the limit
/// and the device.
expected<void> check_device_limits(const ConnConfig& cfg, const PeerState& peer, bool srq,
                                   bool shared_cq) noexcept;

/// The queues a ConnConfig shares with other connections (ConnConfig::srq, shared_cq),
/// held: what a config kept for later requests (EventLoop::serve, co_await next_conn_req)
/// holds instead of the pointers, so that the Srq and SharedCq handles may be moved or
/// destroyed once the call returns.
struct SharedQueues {
  std::shared_ptr<SrqState> srq;            // null without one
  std::shared_ptr<SharedCqState> cq;        // null without one
  std::shared_ptr<EventRoutes> events;      // ConnConfig::shared_event_channel's, or null
};

/// `cfg`'s shared queues (an empty handle, which check_config refuses, gives none).
inline SharedQueues shared_queues_of(const ConnConfig& cfg) noexcept {
  return {cfg.srq != nullptr && *cfg.srq ? cfg.srq->state() : nullptr,
          cfg.shared_cq != nullptr && *cfg.shared_cq ? cfg.shared_cq->state() : nullptr,
          cfg.shared_event_channel != nullptr && *cfg.shared_event_channel ? cfg.shared_event_channel->state()
                                                                           : nullptr};
}

/// Gives `core` (whose peer is known) a share of the shared queues (none: nothing), so
/// that they outlive the connection whatever happens to their handles. Errors: inval: the receive queue is on another Peer than the
/// connection's, or has its own CQ while the connection wants a shared completion channel
/// (librpma's rule).
expected<void> attach_shared_queues(const char* call, ConnectionCore& core, const ConnConfig& cfg,
                                    const SharedQueues& shared) noexcept;

/// Gives `core` (its peer and config set) its rdma_cm event channel: one of the peer's
/// spares with ConnConfig::reuse_event_channel, else a new non-blocking one; nothing on a
/// shared event channel (core.events).
/// Errors: provider (rdma_create_event_channel, fcntl).
expected<void> open_event_channel(ConnectionCore& core) noexcept;

/// The channel `core`'s id is (to be) on: its own or the shared one.
inline rdma_event_channel* event_channel_of(const ConnectionCore& core) noexcept {
  return core.events ? core.events->channel.get() : core.channel.get();
}

/// The fd to poll for `core`'s events: its own channel's, or the shared channel's (whose
/// events may be other connections'). For Conn::fd and the like: inval on a shared channel.
expected<int> event_fd(const char* call, const ConnectionCore& core) noexcept;

/// The next event of `core`'s id, waiting until `deadline`: from its own channel, or its
/// inbox on a shared one (EventRoutes::next, whose inval names `call`). Errors: as
/// next_cm_event, and EventRoutes::next's.
inline expected<CmEvent> next_event_of(const char* call, ConnectionCore& core, const Deadline& deadline) noexcept {
  if (core.events) return core.events->next(call, core.inbox, deadline);
  return next_cm_event(core.channel.get(), deadline);
}

/// A CQ of `size` entries for `core` on `channel` (null without completion_channel): one of
/// its peer's spares with reuse_completion_queues (which has no channel), else a new one.
/// Errors: provider (ibv_create_cq, ibv_req_notify_cq).
expected<void> open_cq(ConnectionCore& core, OwnedCompletionQueue& out, std::uint32_t size,
                       ibv_comp_channel* channel) noexcept;

/// Which message private data goes with: its limit differs (PrivateDataLimits).
enum class PrivateDataUse { connect, accept, reject };

/// inval when `data` is longer than `peer`'s transport allows for `use`; the reason names
/// the device, its transport and the limit.
expected<void> check_private_data(const char* call, std::span<const std::byte> data, const PeerState& peer,
                                  PrivateDataUse use) noexcept;

/// Creates the completion channel(s), CQ(s) and queue pair of `core->id` on `core->peer`
/// (and its shared receive queue, core->srq): the CQ with its own channel; a receive CQ
/// (rcq_size > 0, and no shared receive queue with a CQ of its own) with its own channel or
/// the shared one. Without completion_channel, no channel: the CQs are only polled.
expected<void> create_queues(ConnectionCore& core, const ConnConfig& cfg) noexcept;

rdma_conn_param conn_param(std::span<const std::byte> private_data,
                           const ConnSettings& settings) noexcept;

/// Copies `from` into the caller's buffer; nothing is written on failure.
expected<std::size_t> copy_out(const char* call, std::span<const std::byte> from,
                               std::span<std::byte> to) noexcept;

}  // namespace detail
RPMAPP_END_NAMESPACE

#if !defined(RPMAPP_SEPARATE_COMPILATION)
#  include <rpmapp/impl/detail_connection.ipp>
#endif
