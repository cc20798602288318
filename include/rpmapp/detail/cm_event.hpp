// Taking the next event from an rdma_cm event channel: blocking, non-blocking or bounded.
//
// Every channel rpmapp creates is made O_NONBLOCK (make_nonblocking), so that reading it
// never blocks: several threads may be woken by one event (endpoints sharing a listener),
// and librdmacm reads again after an event it consumes itself. Waiting is poll's job
// alone, in one loop (next_cm_event) that ends at the caller's deadline.
#pragma once

#include <rpmapp/detail/errors.hpp>
#include <rpmapp/detail/handles.hpp>

#include <chrono>

RPMAPP_BEGIN_NAMESPACE
namespace detail {

/// How long a call waits for an event: forever (-1), not at all (0), or a bound in ms.
struct Wait {
  int ms;
  static constexpr Wait forever() noexcept { return {-1}; }
  static constexpr Wait none() noexcept { return {0}; }
  /// A bound; zero or negative is none() (returns at once), never forever().
  static Wait bounded(std::chrono::milliseconds t) noexcept {
    auto ms = t.count();
    return {ms <= 0 ? 0 : ms > 0x7fffffff ? 0x7fffffff : static_cast<int>(ms)};
  }
};

/// The end of a wait, fixed when the wait starts, so that retries and the several events
/// one call handles share the caller's bound. Wait::none() reads no clock: it has passed
/// from the start.
class Deadline {
 public:
  using clock = std::chrono::steady_clock;
  explicit Deadline(Wait wait) noexcept
      : forever_(wait.ms < 0),
        end_(wait.ms <= 0 ? clock::time_point::min() : clock::now() + std::chrono::milliseconds(wait.ms)) {}
  bool forever() const noexcept { return forever_; }
  /// Wait::none(): the caller looks once and does not wait.
  bool immediate() const noexcept { return !forever_ && now_passed(); }
  bool passed() const noexcept { return !forever_ && (now_passed() || clock::now() >= end_); }
  /// poll's timeout for the time left: -1 forever, else the ms left rounded up (0 when
  /// passed), so that poll never returns before the deadline.
  int poll_timeout() const noexcept {
    if (forever_) return -1;
    if (now_passed()) return 0;
    const auto left = end_ - clock::now();
    if (left <= clock::duration::zero()) return 0;
    const auto ms = std::chrono::ceil<std::chrono::milliseconds>(left).count();
    return ms > 0x7fffffff ? 0x7fffffff : static_cast<int>(ms);
  }
  /// When a bounded wait ends (meaningless for forever()).
  clock::time_point end() const noexcept { return end_; }

 private:
  bool now_passed() const noexcept { return end_ == clock::time_point::min(); }
  bool forever_;
  clock::time_point end_;
};

inline bool is_empty_channel_errno(int e) noexcept {
  return e == EAGAIN || e == EWOULDBLOCK || e == ENODATA;
}

/// Sets O_NONBLOCK on the fd of `channel`, just made (reads must never block: see above).
/// One F_SETFL, no F_GETFL: librdmacm opens the channel O_RDWR | O_CLOEXEC, and F_SETFL
/// keeps the access mode and the fd flags, so O_NONBLOCK alone is what F_GETFL's flags
/// with O_NONBLOCK added would be. Errors: provider (fcntl).
expected<void> make_nonblocking(rdma_event_channel* channel) noexcept;

/// A provider call that failed in poll_cm_event: its name (nullptr when none did) and errno.
struct CmReadFailure {
  const char* call = nullptr;
  int sys_errno = 0;
};

/// One look for the next event of `channel`: poll for the time left until `deadline`,
/// then a (non-blocking) read; a signal (EINTR from poll or the read) is retried with the
/// time left. With no time to wait (Wait::none()) it only reads: the channel is
/// non-blocking, so an empty read costs what a poll would, and an event one call less.
/// nullptr when there is none: poll found nothing in time, or the read was empty
/// (another reader took the event, or librdmacm consumed it; its errno goes to
/// `empty_read`), or a call failed (`failed` says which). Builds no Error and no expected:
/// listeners drain with it on every stop, and next_cm_event runs it once per event. The
/// calls go through `p`.
rdma_cm_event* poll_cm_event(rdma_event_channel* channel, const Deadline& deadline,
                             const Provider& p, int& empty_read,
                             CmReadFailure& failed) noexcept;

/// The next event of `channel` (to be acknowledged by the caller through CmEvent), waiting
/// until `deadline`: poll_cm_event again until an event comes or the deadline passes.
/// The calls go through `p` (the provider that made the channel, for teardown).
/// Errors: no_event (nothing by the deadline), provider (poll, rdma_get_cm_event).
expected<CmEvent> next_cm_event(rdma_event_channel* channel, const Deadline& deadline,
                                const Provider& p = provider()) noexcept;

/// As above, with a deadline starting now.
inline expected<CmEvent> next_cm_event(rdma_event_channel* channel, Wait wait,
                                       const Provider& p = provider()) noexcept {
  return next_cm_event(channel, Deadline(wait), p);
}

/// Acknowledges an event explicitly (through the provider it came from), reporting a
/// failure.
expected<void> ack(CmEvent& event) noexcept;

const char* event_name(rdma_cm_event_type type) noexcept;

/// Logs that an event of `type` was not reported: "<TYPE> event: <what>". Formats only
/// when a log function listens at `level`.
void log_event(LogLevel level, const char* where, rdma_cm_event_type type,
               std::string_view what) noexcept;

}  // namespace detail
RPMAPP_END_NAMESPACE

#if !defined(RPMAPP_SEPARATE_COMPILATION)
#  include <rpmapp/impl/detail_cm_event.ipp>
#endif
