// rpmapp::Cq: a completion queue with its completion channel (librpma's rpma_cq), and the
// reading of work completions (ibv_wc).
#pragma once

#include <rpmapp/conn_id.hpp>
#include <rpmapp/detail/cm_event.hpp>
#include <rpmapp/detail/completion_routes.hpp>
#include <rpmapp/detail/errors.hpp>
#include <rpmapp/detail/handles.hpp>
#include <rpmapp/detail/verbs_abi.hpp>
#include <rpmapp/error.hpp>

#include <arpa/inet.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <span>
#include <string_view>

RPMAPP_BEGIN_NAMESPACE

/// The text of a work completion's status, e.g. "remote access error" (ibv_wc_status_str).
inline std::string_view to_string(ibv_wc_status status) noexcept { return ibv_wc_status_str(status); }

/// The name of a work completion's opcode, e.g. "read", "recv_rdma_with_imm".
constexpr std::string_view to_string(ibv_wc_opcode opcode) noexcept {
  switch (static_cast<int>(opcode)) {  // an int: rdma-core 39 lacks IBV_WC_ATOMIC_WRITE, 44 IBV_WC_FLUSH
    case IBV_WC_SEND: return "send";
    case IBV_WC_RDMA_WRITE: return "write";
    case IBV_WC_RDMA_READ: return "read";
    case IBV_WC_COMP_SWAP: return "compare_and_swap";
    case IBV_WC_FETCH_ADD: return "fetch_and_add";
    case IBV_WC_BIND_MW: return "bind_mw";
    case IBV_WC_LOCAL_INV: return "local_inv";
    case IBV_WC_TSO: return "tso";
    case detail::native_atomic_write_abi::wc_atomic_write: return "atomic_write";
    case detail::native_flush_abi::wc_flush: return "flush";
    case IBV_WC_RECV: return "recv";
    case IBV_WC_RECV_RDMA_WITH_IMM: return "recv_rdma_with_imm";
    default: return "unknown opcode";
  }
}

/// A failed work completion as an Error (errc::provider, call "ibv_poll_cq"), whose reason
/// gives the status's text and number, the user's context (wr_id) and the vendor error; success
/// when the status is IBV_WC_SUCCESS. A flushed completion (IBV_WC_WR_FLUSH_ERR: the queue
/// pair went to the error state, e.g. on disconnect) is an error too.
/// Note: a failed completion's opcode is not defined by ibverbs (only wr_id and status are).
inline expected<void> check(const ibv_wc& wc) noexcept {
  if (wc.status == IBV_WC_SUCCESS) return {};
  return detail::fail(detail::make_error(errc::provider, 0, "ibv_poll_cq",
                                         "work completion failed: {} (status {}, wr_id 0x{:x}, vendor_err 0x{:x})",
                                         to_string(wc.status), static_cast<int>(wc.status),
                                         wc.wr_id, wc.vendor_err));
}

/// The immediate data of a completion (wc.imm_data, which travels in network order) in
/// host order: the value the peer passed to write_with_imm / send_with_imm.
inline std::uint32_t immediate(const ibv_wc& wc) noexcept { return ntohl(wc.imm_data); }

namespace detail {

/// Takes the next event of a completion channel, waiting until `deadline` (poll, then
/// read; an empty read of a non-blocking fd goes back to poll; EINTR is retried), and
/// acknowledges it. Returns the CQ it was for (not yet re-armed).
/// Errors: no_completion (nothing by the deadline), provider (poll, ibv_get_cq_event).
inline expected<ibv_cq*> next_cq_event(ibv_comp_channel* channel, const Deadline& deadline) noexcept {
  const Provider& p = provider();
  for (;;) {
    pollfd pfd{channel->fd, POLLIN, 0};
    errno = 0;
    const int n = p.poll(&pfd, 1, deadline.poll_timeout());
    if (n < 0) {
      const int e = errno;
      if (e == EINTR) continue;
      return fail(provider_error("poll", e, "on the completion channel"));
    }
    if (n > 0) {
      ibv_cq* cq = nullptr;
      void* context = nullptr;
      errno = 0;
      if (p.get_cq_event(channel, &cq, &context) == 0) {
        p.ack_cq_events(cq, 1);
        return cq;
      }
      const int e = errno;
      if (e != EINTR && e != EAGAIN && e != EWOULDBLOCK)
        return fail(provider_error("ibv_get_cq_event", e));
    }
    if (deadline.passed())
      return fail(Error(errc::no_completion, 0, "ibv_get_cq_event", "no completion event in time"));
  }
}

/// The inval of a wait on a connection made without completion channels.
Error no_completion_channel(const char* call) noexcept;

/// The inval of a wait on a connection whose completions go to a SharedCq.
Error on_shared_cq(const char* call) noexcept;

/// Asks for the next completion event of `cq`. Errors: provider (ibv_req_notify_cq).
inline expected<void> rearm(ibv_cq* cq) noexcept {
  if (int rc = provider().req_notify_cq(cq, 0); rc != 0)
    return fail(provider_error("ibv_req_notify_cq", rc));
  return {};
}

/// A completion channel for a CQ. Errors: provider (ibv_create_comp_channel).
expected<void> make_comp_channel(CompChannel& out, ibv_context* verbs) noexcept;

/// A CQ on `channel`, armed for its first completion event; without a channel (null), a
/// CQ that is only polled, not armed.
/// Errors: provider (ibv_create_cq, ibv_req_notify_cq).
expected<void> make_cq(CompletionQueue& out, ibv_context* verbs, std::uint32_t size,
                       ibv_comp_channel* channel, int vector) noexcept;

/// What ibv_poll_cq returning `n` (negative, or more than the `room` it was given) means:
/// ibverbs sets no errno there, providers return -1 or a negative code, so the value itself
/// is reported (errno 0).
Error poll_error(int n, std::size_t room) noexcept;

}  // namespace detail

/// A completion queue and its completion channel: a connection's main CQ (send
/// completions, and receive ones unless it has a receive CQ), its receive CQ, a shared
/// receive queue's CQ, or a SharedCq's queue. A view: it is valid while what owns the
/// queue (the Conn, ConnReq, Srq or SharedCq) lives. A default-constructed Cq is empty
/// (every call is inval). On a queue several connections share, get(out, conns) tells
/// whose each completion is.
///
/// Two ways to read completions: poll with get() (non-blocking), or wait for the channel's
/// event and then get(). next() does both without losing a completion: it polls, and only
/// when the queue is empty waits for an event, re-arms the queue and polls again.
/// When a connection's CQ and receive CQ share one channel (ConnConfig::shared_completion
/// _channel), waiting is the connection's (Conn::wait_completion): wait()/next() here are
/// errc::shared_channel, as in librpma. A connection made without completion channels
/// (ConnConfig::completion_channel false) has queues that are only polled: get() works,
/// and fd(), wait(), try_wait(), wait_for(), next(), next_for() and arm() are inval.
/// Thread safety: one thread at a time per Cq (a second reader of the channel could block);
/// get() on a queue shared by connections from any number.
class Cq {
 public:
  constexpr Cq() noexcept = default;

  explicit operator bool() const noexcept { return cq_ != nullptr; }

  /// The completion channel's fd, for poll/epoll (readable = a completion event is
  /// pending; then call wait() or try_wait(), which acknowledge it and re-arm the queue).
  /// The fd may be made non-blocking; rpmapp polls before reading either way.
  /// Errors: inval when empty or when the queue has no completion channel.
  expected<int> fd() const noexcept;

  /// Waits for the queue's next completion event, acknowledges it and re-arms the queue
  /// (librpma's rpma_cq_wait). Completions are then read with get(). A signal does not end
  /// the wait.
  /// Errors: inval when empty or when the queue has no completion channel (ConnConfig::
  /// completion_channel false: nothing is waited for); shared_channel (wait on the Conn);
  /// no_completion (only from try_wait / wait_for: no event in time); provider: poll,
  /// ibv_get_cq_event or ibv_req_notify_cq failed (the event was taken and acknowledged, but
  /// the queue is not armed: its completions can still be read with get(); call arm()
  /// before waiting again); unknown: the event was for another queue.
  expected<void> wait() noexcept { return wait_event("Cq::wait", detail::Wait::forever()); }
  /// As wait(), returning no_completion at once when no event is pending.
  expected<void> try_wait() noexcept { return wait_event("Cq::try_wait", detail::Wait::none()); }
  /// As wait(), returning no_completion when no event came within `timeout`.
  expected<void> wait_for(std::chrono::milliseconds timeout) noexcept {
    return wait_event("Cq::wait_for", detail::Wait::bounded(timeout));
  }

  /// Asks for the queue's next completion event (ibv_req_notify_cq). wait() does this after
  /// each event; call it only to recover from a wait that failed in ibv_req_notify_cq.
  /// Errors: inval when empty or when the queue has no completion channel; provider:
  /// ibv_req_notify_cq failed.
  expected<void> arm() noexcept {
    if (!cq_) return detail::fail(empty("Cq::arm"));
    if (!channel_) return detail::fail(detail::no_completion_channel("Cq::arm"));
    auto armed = detail::rearm(cq_);
    detail::name_in(armed, "Cq::arm");
    return armed;
  }

  /// Polls up to out.size() completions into `out` without waiting (librpma's
  /// rpma_cq_get_wc) and returns the filled part. Check each one's status (check(wc)): a
  /// failed work request completes with an error status, never silently. IBV_WC_RETRY_EXC_ERR
  /// (the peer stopped answering) also makes the completion's connection report
  /// ConnEvent::lost (Conn::next_event), on every queue but a shared receive queue's CQ
  /// that no connection ever used.
  /// Errors: inval when empty or `out` is empty; no_completion when the queue is empty;
  /// provider: ibv_poll_cq failed; unknown: it reported more than asked.
  /// Thread safety: on a queue shared by connections (SharedCq, a shared receive queue's
  /// CQ), get() may be called from several threads; otherwise one thread at a time.
  expected<std::span<ibv_wc>> get(std::span<ibv_wc> out) noexcept {
    if (!cq_) [[unlikely]]
      return detail::fail(empty("Cq::get"));
    if (out.empty() || out.size() > 0x7fffffffu) [[unlikely]]
      return detail::fail(detail::invalid("Cq::get", "room for {} completions: give 1 to 2^31-1", out.size()));
    if (routes_ != nullptr) return routed_get("Cq::get", out, nullptr);
    const int n = detail::provider().poll_cq(cq_, static_cast<int>(out.size()), out.data());
    if (n > 0 && static_cast<std::size_t>(n) <= out.size()) [[likely]] {
      const auto got = out.first(static_cast<std::size_t>(n));
      detail::watch_path(path_, got);
      return got;
    }
    return detail::fail(get_error(n, out.size()));
  }

  /// As get(out), and tags each completion with its connection: conns[i] is the ConnId of
  /// the connection whose queue pair produced out[i] (Conn::id). On a queue of one
  /// connection, that connection's; on a shared queue, found by the completion's qp_num
  /// (O(1)); ConnId{} for a queue pair that is no connection's (raw verbs). A released
  /// connection's completions never come out of a shared queue (its release dropped them).
  /// Errors: as get(); inval also when conns.size() < out.size() (nothing is polled).
  expected<std::span<ibv_wc>> get(std::span<ibv_wc> out, std::span<ConnId> conns) noexcept {
    if (!cq_) [[unlikely]]
      return detail::fail(empty("Cq::get"));
    if (out.empty() || out.size() > 0x7fffffffu || conns.size() < out.size()) [[unlikely]]
      return detail::fail(detail::invalid("Cq::get", "room for {} completions and {} tags: give 1 to 2^31-1, "
                                          "and a tag for each", out.size(), conns.size()));
    if (routes_ != nullptr) return routed_get("Cq::get", out, conns.data());
    auto got = get(out);
    if (got)
      for (std::size_t i = 0; i < got->size(); ++i) conns[i] = owner_;
    return got;
  }

  /// Returns at least one completion: polls, and while the queue is empty waits for its
  /// event (acknowledged, queue re-armed) and polls again, so that no completion is lost
  /// between the poll and the wait. A signal does not end the wait (EINTR is retried).
  /// Errors: as get() (never no_completion) and wait(); inval at once, nothing polled, on a
  /// queue without a completion channel (poll it with get()).
  expected<std::span<ibv_wc>> next(std::span<ibv_wc> out) noexcept {
    return next_until("Cq::next", out, {}, false, detail::Deadline(detail::Wait::forever()));
  }
  /// As next(), returning no_completion when nothing completed within `timeout`.
  expected<std::span<ibv_wc>> next_for(std::span<ibv_wc> out, std::chrono::milliseconds timeout) noexcept {
    return next_until("Cq::next_for", out, {}, false, detail::Deadline(detail::Wait::bounded(timeout)));
  }
  /// next() and next_for() tagging each completion with its connection, as get(out, conns).
  expected<std::span<ibv_wc>> next(std::span<ibv_wc> out, std::span<ConnId> conns) noexcept {
    return next_until("Cq::next", out, conns, true, detail::Deadline(detail::Wait::forever()));
  }
  expected<std::span<ibv_wc>> next_for(std::span<ibv_wc> out, std::span<ConnId> conns,
                                       std::chrono::milliseconds timeout) noexcept {
    return next_until("Cq::next_for", out, conns, true, detail::Deadline(detail::Wait::bounded(timeout)));
  }

  /// The queue (for raw verbs). Errors: inval when empty.
  expected<ibv_cq*> native() const noexcept;
  /// Whether its completion channel is shared with the connection's other queue.
  /// Errors: inval when empty.
  expected<bool> shared_channel() const noexcept;

  friend bool operator==(const Cq& a, const Cq& b) noexcept { return a.cq_ == b.cq_; }

  /// Internal: a view of `cq` on `channel`: a queue of the connection `owner`, telling
  /// `path` (if any) of a transport failure; or a queue several connections share, whose
  /// `routes` tag and watch each completion.
  Cq(ibv_cq* cq, ibv_comp_channel* channel, bool shared, detail::PathMonitor* path = nullptr,
     ConnId owner = {}) noexcept
      : cq_(cq), channel_(channel), shared_(shared), path_(path), owner_(owner) {}
  Cq(ibv_cq* cq, ibv_comp_channel* channel, detail::CompletionRoutes* routes) noexcept
      : cq_(cq), channel_(channel), routes_(routes) {}

 private:
  // Out of line: building an Error inline costs get()'s successful path a larger frame.
  [[gnu::cold, gnu::noinline]] static Error get_error(int n, std::size_t room) noexcept {
    if (n == 0) return Error(errc::no_completion, 0, "ibv_poll_cq", "the queue is empty").name_operation("Cq::get");
    return detail::poll_error(n, room).name_operation("Cq::get");
  }
  static Error empty(const char* call) noexcept {
    return Error(errc::inval, 0, call, "no completion queue (empty Cq, or no receive CQ configured)");
  }

  expected<void> wait_event(const char* call, detail::Wait wait) noexcept {
    auto waited = wait_until(call, detail::Deadline(wait));
    detail::name_in(waited, call);
    return waited;
  }
  expected<void> wait_until(const char* call, const detail::Deadline& deadline) noexcept {
    if (!cq_) return detail::fail(empty(call));
    if (!channel_) return detail::fail(detail::no_completion_channel(call));
    if (shared_)
      return detail::fail(Error(errc::shared_channel, 0, call,
                                "the channel is shared by the connection's queues: use Conn::wait_completion"));
    auto cq = detail::next_cq_event(channel_, deadline);
    if (!cq) return detail::fail(cq.error());
    if (*cq != cq_)
      return detail::fail(Error(errc::unknown, 0, "ibv_get_cq_event", "an event for another completion queue"));
    return detail::rearm(cq_);
  }
  // The shared queues' get: parked completions first, each tagged (conns: optional).
  expected<std::span<ibv_wc>> routed_get(const char* call, std::span<ibv_wc> out, ConnId* conns) noexcept {
    const int n = routes_->poll(detail::provider(), cq_, out, conns);
    if (n > 0) return out.first(static_cast<std::size_t>(n));
    auto error = get_error(n, out.size());
    return detail::fail(error.name_operation(call));
  }

  expected<std::span<ibv_wc>> next_until(const char* call, std::span<ibv_wc> out, std::span<ConnId> conns, bool tagged,
                                         const detail::Deadline& deadline) noexcept {
    if (cq_ && !channel_) return detail::fail(detail::no_completion_channel(call));
    for (;;) {
      auto got = tagged ? get(out, conns) : get(out);
      if (got || got.error().code() != errc::no_completion) {
        detail::name_in(got, call);
        return got;
      }
      if (auto waited = wait_until(call, deadline); !waited)
        return detail::fail(waited.error().name_operation(call));
    }
  }

  ibv_cq* cq_ = nullptr;
  ibv_comp_channel* channel_ = nullptr;
  bool shared_ = false;
  detail::PathMonitor* path_ = nullptr;
  ConnId owner_;
  detail::CompletionRoutes* routes_ = nullptr;
};

RPMAPP_END_NAMESPACE

#if !defined(RPMAPP_SEPARATE_COMPILATION)
#  include <rpmapp/impl/cq.ipp>
#endif
