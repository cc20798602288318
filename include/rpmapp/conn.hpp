// rpmapp::Conn: an established (or establishing) connection.
#pragma once

#include <rpmapp/detail/cm_event.hpp>
#include <rpmapp/detail/connection.hpp>
#include <rpmapp/detail/operations.hpp>
#include <rpmapp/cq.hpp>
#include <rpmapp/error.hpp>
#include <rpmapp/mr.hpp>
#include <rpmapp/peer_config.hpp>

#include <array>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>

RPMAPP_BEGIN_NAMESPACE

/// What Conn::next_event reports (librpma's enum rpma_conn_event).
enum class ConnEvent {
  established,  ///< the connection is up (RDMA_CM_EVENT_ESTABLISHED)
  closed,       ///< the peer or we disconnected: reported once per connection, for the
                ///< first of DISCONNECTED and TIMEWAIT_EXIT (the other is acknowledged and
                ///< not reported)
  lost,         ///< the connection failed or its device went away (CONNECT_ERROR,
                ///< DEVICE_REMOVAL; ADDR_CHANGE: a bonding failover under its address, after
                ///< which rdma_cm says to connect again), or the peer stopped answering: a work request of this
                ///< connection completed with IBV_WC_RETRY_EXC_ERR (rdma_cm itself reports
                ///< nothing while a link is down). Reported once; later events still come.
  rejected,     ///< the peer rejected the request; private_data() has its reject data
  unreachable,  ///< the peer did not answer (UNREACHABLE). On an established connection
                ///< this can be transient (seen on rxe while a link was down): not always fatal.
};

constexpr std::string_view to_string(ConnEvent event) noexcept {
  switch (event) {
    case ConnEvent::established: return "established";
    case ConnEvent::closed: return "closed";
    case ConnEvent::lost: return "lost";
    case ConnEvent::rejected: return "rejected";
    case ConnEvent::unreachable: return "unreachable";
  }
  return "undefined";
}

namespace detail {

/// Takes and acknowledges one event of a connection: its ConnEvent, or nullopt for one not
/// reported (the second end-of-connection event).
expected<std::optional<ConnEvent>> take_conn_event(const char* call, ConnectionCore& core,
                                                   const Deadline& deadline) noexcept;

/// The next reported event of a connection by `deadline`. One deadline for every event
/// taken: a swallowed second end-of-connection event does not extend the caller's bound.
expected<ConnEvent> next_conn_event(const char* call, ConnectionCore& core,
                                    const Deadline& deadline) noexcept;

}  // namespace detail

class ConnReq;
class Grant;

/// A connection, made by ConnReq::connect. It owns its cm_id (on its own event channel),
/// its queue pair and completion queues, and keeps its Peer's protection domain alive.
/// It stays valid after the Endpoint it came from is gone.
/// Thread safety: one thread at a time per Conn; different Conns are independent.
class Conn {
 public:
  /// An empty Conn, as a moved-from one (every call is inval): for tables of slots.
  Conn() noexcept = default;
  Conn(Conn&&) noexcept = default;
  /// Releases this connection as the destructor does (failures logged under
  /// "Conn::operator="), then takes `other`'s.
  Conn& operator=(Conn&& other) noexcept;
  /// Releases everything, like close(); a failure is logged (warning, "Conn::~Conn"; the
  /// ones after the first, notice).
  ~Conn() = default;

  explicit operator bool() const noexcept { return core_ != nullptr; }

  /// Waits for the next connection event. ConnEvent::closed comes once per connection:
  /// rdma_cm reports the end of a connection twice (DISCONNECTED, then TIMEWAIT_EXIT when
  /// the queue pair leaves the CM's time-wait), so the first is reported (whichever it is)
  /// and the second is acknowledged, not reported, and the call goes on waiting. After
  /// closed nothing more is reported: next_event() would wait forever. A signal does not
  /// interrupt a wait; it is retried.
  /// ConnEvent::lost is also reported (once, before any event rdma_cm has queued) after a
  /// completion of this connection's queues was read with IBV_WC_RETRY_EXC_ERR: by
  /// Cq::get/next on cq() or its own rcq(), wait_completion's queue, or an EventLoop. A
  /// wait already blocked in another thread sees it at its next call.
  /// Errors:
  /// - inval: the Conn is empty.
  /// - no_event: only from try_next_event and next_event_for: nothing in time.
  /// - provider: poll, rdma_get_cm_event or rdma_ack_cm_event failed. ENODEV (call
  ///   rdma_get_cm_event): every call after the `lost` of RDMA_CM_EVENT_DEVICE_REMOVAL (the
  ///   kernel destroyed the id: no event comes any more); release the connection.
  /// - unknown: an event that has no ConnEvent (it is acknowledged; the reason names it).
  /// - nomem: out of memory storing the peer's private data.
  expected<ConnEvent> next_event() noexcept;
  /// As next_event, but returns no_event at once when nothing is pending (also when all
  /// that was pending was the second end-of-connection event, acknowledged and dropped).
  expected<ConnEvent> try_next_event() noexcept;
  /// As next_event, but returns no_event when nothing to report arrived within `timeout`
  /// (a zero or negative timeout is try_next_event).
  expected<ConnEvent> next_event_for(std::chrono::milliseconds timeout) noexcept;

  /// The fd of the connection's event channel, for poll/epoll (readable = an event is
  /// pending).
  /// It is always non-blocking (O_NONBLOCK): rpmapp's waits read it only after poll and loop on
  /// an empty read, so a blocking call waits whatever the fd's flags. Never clear
  /// O_NONBLOCK: librdmacm may consume an event itself between your poll and the read,
  /// and a blocking read would then hang until some later event.
  /// Closed with the connection, unless ConnConfig::reuse_event_channel gives the channel
  /// back to the Peer: then take it out of your epoll sets before releasing the Conn.
  /// Errors: inval when empty.
  expected<int> fd() const noexcept;

  /// The peer's private data: on the accepting side the request's, on the connecting side
  /// the accept's (after established) or the reject's (after rejected). On InfiniBand and
  /// RoCE rdma_cm pads it to the protocol's size with zeros (56 bytes on a request, 196 on
  /// an accept, 148 on a reject); iWARP delivers it at its length: carry your own length
  /// if it matters. Valid until the next call on this Conn.
  /// Errors: inval when empty.
  expected<std::span<const std::byte>> private_data() const noexcept;
  /// Copies private_data() into `out` and returns its size. Errors: inval when empty or
  /// when `out` is too small (nothing is written then).
  expected<std::size_t> copy_private_data(std::span<std::byte> out) const noexcept;

  /// The queue pair number. Errors: inval when empty.
  expected<std::uint32_t> qp_num() const noexcept;
  /// The connection's identity, which tags its completions in shared queues (SharedCq, a
  /// shared receive queue's CQ): ConnReq::id's number, never given to another connection of
  /// the process. Errors: inval when empty.
  expected<ConnId> id() const noexcept;
  /// The queue pair, for the data path. Errors: inval when empty.
  expected<ibv_qp*> qp() const noexcept;
  /// The main completion queue: send completions, and receive ones unless the connection
  /// has a receive CQ (librpma's rpma_conn_get_cq). Valid while the Conn lives. Without
  /// ConnConfig::completion_channel it has no channel: poll it with Cq::get (waits are inval).
  /// With ConnConfig::shared_cq, the shared queue (other connections' completions too:
  /// read them with their tags, Cq::get with `conns`).
  /// Errors: inval when empty.
  expected<Cq> cq() const noexcept;
  /// The receive completion queue: the connection's own (ConnConfig::rcq_size > 0), or its
  /// shared receive queue's; an empty Cq when receive completions go to cq()
  /// (librpma's rpma_conn_get_rcq giving NULL). Errors: inval when empty.
  expected<Cq> rcq() const noexcept;
  /// The shared completion channel's fd (ConnConfig::shared_completion_channel), for
  /// poll/epoll; readable when either queue has a completion event (librpma's
  /// rpma_conn_get_compl_fd). Errors: inval when empty or without completion channels
  /// (ConnConfig::completion_channel false); not_shared_chnl when the queues have their own
  /// channels.
  expected<int> completion_fd() const noexcept;
  /// Waits for a completion event on the shared completion channel, acknowledges it,
  /// re-arms the queue it was for and returns that queue (cq() or rcq()); read its
  /// completions with Cq::get (librpma's rpma_conn_wait). A signal does not end the wait.
  /// Errors: inval when empty or without completion channels (ConnConfig::completion_channel
  /// false: poll with Cq::get); not_shared_chnl when the queues have their own channels
  /// (use Cq::wait); no_completion (only try_/_for: no event in time); provider: poll,
  /// ibv_get_cq_event or ibv_req_notify_cq failed; unknown: an event for a queue that is
  /// not this connection's.
  expected<Cq> wait_completion() noexcept {
    return wait_shared("Conn::wait_completion", detail::Wait::forever());
  }
  expected<Cq> try_wait_completion() noexcept {
    return wait_shared("Conn::try_wait_completion", detail::Wait::none());
  }
  expected<Cq> wait_completion_for(std::chrono::milliseconds timeout) noexcept {
    return wait_shared("Conn::wait_completion_for", detail::Wait::bounded(timeout));
  }

  /// Applies the peer's configuration (librpma's rpma_conn_apply_remote_peer_cfg): with
  /// direct_write_to_pmem, flush(FlushType::persistent) becomes possible.
  /// Errors: inval when empty.
  expected<void> apply_remote_peer_config(const PeerConfig& config) noexcept;

  // ---- the data path (librpma's rpma_read, rpma_write, ...). Each operation checks its
  // arguments before posting anything: the local range within `MrLocal` (registered on this
  // connection's Peer, for the usage the operation needs), the remote range within the
  // peer's region and the usage the peer registered it for. A failure there is inval (or
  // nosupp, where librpma says so) and nothing is posted. `when` chooses whether a
  // successful operation produces a completion; `context` comes back as the completion's
  // wr_id. The memory must stay registered until the operation completes.
  // Errors common to all: inval when the Conn is empty or an argument is bad (the reason
  // says which); provider: ibv_post_send / ibv_post_recv failed (ENOMEM: the queue is
  // full: more work requests in flight than its size); again for every operation but recv
  // on the accepting side of an iWARP connection until its ConnEvent::established was read
  // (next_event, an event loop's watch or co_await): before it, what it posts can reach the
  // client ahead of the MPA reply and end the connection (measured on siw).
  // Thread safety: one thread at a time per Conn.

  /// RDMA READ of `len` bytes from the peer's `src` at `src_offset` into `dst` at
  /// `dst_offset` (dst registered for read_dst; src for read_src).
  expected<void> read(const MrLocal& dst, std::size_t dst_offset, const MrRemote& src,
                      std::size_t src_offset, std::size_t len, Completion when = Completion::always,
                      std::uint64_t context = 0) noexcept {
    if (!core_) [[unlikely]]
      return detail::fail(detail::moved_from("Conn::read"));
    return detail::read("Conn::read", *core_, dst, dst_offset, src, src_offset, len, when, context);
  }
  /// RDMA WRITE of `len` bytes from `src` at `src_offset` (write_src) to the peer's `dst`
  /// at `dst_offset` (write_dst).
  expected<void> write(const MrRemote& dst, std::size_t dst_offset, const MrLocal& src,
                       std::size_t src_offset, std::size_t len, Completion when = Completion::always,
                       std::uint64_t context = 0) noexcept {
    if (!core_) [[unlikely]]
      return detail::fail(detail::moved_from("Conn::write"));
    return detail::write("Conn::write", *core_, dst, dst_offset, src, src_offset, len, when,
                         context, IBV_WR_RDMA_WRITE, 0);
  }
  /// As write(), and the peer's receive completes with `imm` (read it with
  /// immediate(wc); it travels in network order, as librpma sends it). It consumes a
  /// receive posted on the peer. Errors: also nosupp on an iWARP device, which has no
  /// immediate data (the reason names the device); nothing is posted.
  expected<void> write_with_imm(const MrRemote& dst, std::size_t dst_offset, const MrLocal& src,
                                std::size_t src_offset, std::size_t len, std::uint32_t imm,
                                Completion when = Completion::always,
                                std::uint64_t context = 0) noexcept {
    if (!core_) [[unlikely]]
      return detail::fail(detail::moved_from("Conn::write_with_imm"));
    return detail::write("Conn::write_with_imm", *core_, dst, dst_offset, src, src_offset, len,
                         when, context, IBV_WR_RDMA_WRITE_WITH_IMM, imm);
  }
  /// Writes 8 bytes atomically to the peer's `dst` at `dst_offset` (the remote address
  /// 8-byte aligned; write_dst): natively where the device has IBV_WR_ATOMIC_WRITE (Peer::native_atomic_
  /// write), else as librpma 1.2 emulates it, an 8-byte inline RDMA WRITE fenced after the
  /// reads in flight. `value` is copied when posted.
  /// Errors: also nosupp: emulation on a queue pair with less than 8 bytes of inline data;
  /// provider: ibv_wr_complete (native) failed.
  expected<void> atomic_write(const MrRemote& dst, std::size_t dst_offset,
                              std::span<const std::byte, 8> value,
                              Completion when = Completion::always, std::uint64_t context = 0) noexcept {
    if (!core_) [[unlikely]]
      return detail::fail(detail::moved_from("Conn::atomic_write"));
    return detail::atomic_write("Conn::atomic_write", *core_, dst, dst_offset, value, when, context);
  }
  /// As above, writing the bytes of `value` as they are in memory (host byte order), as a
  /// librpma program passes a uint64_t's.
  expected<void> atomic_write(const MrRemote& dst, std::size_t dst_offset, std::uint64_t value,
                              Completion when = Completion::always, std::uint64_t context = 0) noexcept {
    std::array<std::byte, 8> bytes;
    std::memcpy(bytes.data(), &value, sizeof value);
    return atomic_write(dst, dst_offset, std::span<const std::byte, 8>(bytes), when, context);
  }
  /// Makes the writes to [dst_offset, dst_offset + len) of the peer's `dst` visible or
  /// persistent when it completes (librpma's rpma_flush). Native where Peer::native_flush()
  /// (an RDMA FLUSH of the range, as librpma 1.3; its completion's opcode is IBV_WC_FLUSH,
  /// 8); otherwise emulated as librpma 1.2 does: an RDMA READ of up to 8 bytes at
  /// `dst_offset` into the Peer's flush buffer (opcode IBV_WC_RDMA_READ). A native flush
  /// needs the peer's region registered with the flush right (a peer that flushes natively
  /// registers so; one that emulates, librpma 1.2 or rpmapp on rdma-core 44, does not: the
  /// flush then completes with a remote access error).
  /// Errors: provider (ibv_post_send, or ibv_wr_complete for a native flush).
  /// Errors: also nosupp (as librpma): persistent without the peer's direct_write_to_pmem
  /// (apply_remote_peer_config), or a region the peer did not register for that flush type.
  expected<void> flush(const MrRemote& dst, std::size_t dst_offset, std::size_t len, FlushType type,
                       Completion when = Completion::always, std::uint64_t context = 0) noexcept {
    if (!core_) [[unlikely]]
      return detail::fail(detail::moved_from("Conn::flush"));
    return detail::flush("Conn::flush", *core_, dst, dst_offset, len, type, when, context);
  }
  /// Sends `len` bytes of `src` at `offset` (registered for send); the peer needs a
  /// receive posted. A length of 0 sends an empty message.
  expected<void> send(const MrLocal& src, std::size_t offset, std::size_t len,
                      Completion when = Completion::always, std::uint64_t context = 0) noexcept {
    if (!core_) [[unlikely]]
      return detail::fail(detail::moved_from("Conn::send"));
    return detail::send("Conn::send", *core_, src, offset, len, when, context, IBV_WR_SEND, 0);
  }
  /// As send(), with immediate data `imm` (see write_with_imm; nosupp on iWARP).
  expected<void> send_with_imm(const MrLocal& src, std::size_t offset, std::size_t len,
                               std::uint32_t imm, Completion when = Completion::always,
                               std::uint64_t context = 0) noexcept {
    if (!core_) [[unlikely]]
      return detail::fail(detail::moved_from("Conn::send_with_imm"));
    return detail::send("Conn::send_with_imm", *core_, src, offset, len, when, context,
                        IBV_WR_SEND_WITH_IMM, imm);
  }
  /// Posts a receive of up to `len` bytes into `dst` at `offset` (registered for recv). Its
  /// completion (always produced) lands in rcq() if the connection has one, else in cq().
  /// A length of 0 receives an empty message (posted without a scatter/gather entry, as
  /// librpma does; on iWARP, whose siw refuses that, with one of length 0).
  /// Errors: also inval on a connection with a shared receive queue (use Srq::recv).
  expected<void> recv(const MrLocal& dst, std::size_t offset, std::size_t len,
                      std::uint64_t context = 0) noexcept {
    if (!core_) [[unlikely]]
      return detail::fail(detail::moved_from("Conn::recv"));
    return detail::recv("Conn::recv", *core_, dst, offset, len, context);
  }

  /// The other side's numeric address; a link-local IPv6 one with its scope
  /// ("fe80::1%eth0"), so it can be passed to ConnReq::to. Errors: inval when empty; nomem.
  expected<std::string> peer_address() const noexcept;
  /// The other side's port. Errors: inval when empty.
  expected<std::uint16_t> peer_port() const noexcept;
  /// The RDMA device the connection runs on, e.g. "rxe0"; the view is valid while the
  /// Conn lives. Errors: inval when empty.
  expected<std::string_view> device() const noexcept;
  /// The Peer whose protection domain the connection's queue pair is on: the one it was
  /// made from, or its own with ConnConfig::own_protection_domain (register this
  /// connection's memory there). The handle shares the domain, which lives while any user
  /// does. Errors: inval when empty.
  expected<Peer> peer() const noexcept;

  /// Starts disconnecting. The peer sees ConnEvent::closed; this side sees closed once the
  /// peer has also called disconnect() (or destroyed its connection), or after the CM's
  /// timeout: call disconnect() on both sides, as with librpma. Wait for closed before
  /// close(): closing first cancels the disconnect request, and one not yet sent never
  /// leaves (kernel 7.2 under a burst of disconnects: 76 of 1,000 peers never saw closed).
  /// On the accepting side, wait for ConnEvent::established first: before it the IB CM can
  /// send neither a DREQ nor a DREP, so rdma_disconnect only moves the queue pair to the
  /// error state and returns success, and the peer may never see closed (seen on rxe when a
  /// client's message was answered before the server's ESTABLISHED arrived).
  /// Work still queued is flushed (IBV_WC_WR_FLUSH_ERR): rdma_disconnect moves an IB
  /// queue pair to the error state; on iWARP, where it moves it only to SQD (siw then never
  /// completes what is queued), disconnect() moves it to the error state itself first.
  /// Errors: inval when empty; provider: rdma_disconnect or (iWARP) ibv_modify_qp failed.
  expected<void> disconnect() noexcept;

  /// Releases the queue pair, completion queues, cm_id and event channel (consumes the
  /// Conn: it is empty afterwards, whatever the result) and returns the first failure.
  /// Errors: inval when empty; provider: ibv_destroy_qp, ibv_destroy_cq,
  /// ibv_destroy_comp_channel or rdma_destroy_id failed (the rest is still released;
  /// failures after the first are logged, notice).
  expected<void> close() && noexcept;

 private:
  friend struct detail::LoopAccess;
  friend class ConnReq;
  friend class Grant;
  explicit Conn(std::unique_ptr<detail::ConnectionCore> core) noexcept;

  static Error not_shared(const char* call) noexcept {
    return Error(errc::not_shared_chnl, 0, call,
                 "the queues have their own completion channels (ConnConfig::shared_completion_channel is off)");
  }

  expected<Cq> wait_shared(const char* call, detail::Wait wait) noexcept {
    auto fired = wait_shared_event(call, wait);
    detail::name_in(fired, call);
    return fired;
  }
  expected<Cq> wait_shared_event(const char* call, detail::Wait wait) noexcept {
    if (!core_) return detail::fail(detail::moved_from(call));
    if (core_->shared_cq) return detail::fail(detail::on_shared_cq(call));
    if (!core_->config.completion_channel) return detail::fail(detail::no_completion_channel(call));
    if (!core_->config.shared_completion_channel) return detail::fail(not_shared(call));
    auto fired = detail::next_cq_event(core_->comp_channel.get(), detail::Deadline(wait));
    if (!fired) return detail::fail(fired.error());
    if (*fired != core_->cq.get() && *fired != core_->rcq.get())
      return detail::fail(Error(errc::unknown, 0, "ibv_get_cq_event", "an event for a queue not of this connection"));
    if (auto armed = detail::rearm(*fired); !armed) return detail::fail(armed.error());
    return Cq(*fired, core_->comp_channel.get(), true, &core_->path);
  }

  expected<ConnEvent> next(const char* call, detail::Wait wait) noexcept {
    if (!core_) return detail::fail(detail::moved_from(call));
    return detail::next_conn_event(call, *core_, detail::Deadline(wait));
  }

  std::unique_ptr<detail::ConnectionCore> core_;
};

RPMAPP_END_NAMESPACE

#if !defined(RPMAPP_SEPARATE_COMPILATION)
#  include <rpmapp/impl/conn.ipp>
#endif
