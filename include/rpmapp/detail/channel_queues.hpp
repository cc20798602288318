// One completion channel and the completion queues whose events it carries, for the event
// loop (EventLoop::watch_completions, co_await completions()): a connection's, or a
// SharedCq's (one queue, its completions tagged with their connections).
//
// The order that loses no completion: take the channel's events (acknowledging each),
// re-arm their queues, then poll until empty. Re-arming raises no event for completions
// already queued, so a drain cut short (a budget, an exception, a failed poll) must be
// resumed without waiting for an event; and a queue whose re-arm failed raises none at
// all, so it stays due for re-arming (ConnectionCore::rearm_due, SharedCqState::rearm_due)
// until a re-arm works.
#pragma once

#include <rpmapp/cq.hpp>
#include <rpmapp/detail/cm_event.hpp>
#include <rpmapp/detail/connection.hpp>

#include <algorithm>
#include <cstddef>
#include <span>

RPMAPP_BEGIN_NAMESPACE
namespace detail {

class ChannelQueues {
 public:
  /// The main channel (the main CQ's; also the receive CQ's with
  /// ConnConfig::shared_completion_channel), or with `receive` the receive CQ's own.
  ChannelQueues(ConnectionCore& core, bool receive) noexcept
      : due_(core.rearm_due), path_(&core.path), owner_(core.path.conn) {
    if (receive) {
      channel_ = core.rcq_channel.get();
      queues_[1] = core.rcq.get();
    } else {
      channel_ = core.comp_channel.get();
      queues_[0] = core.cq.get();
      if (core.config.shared_completion_channel) queues_[1] = core.rcq.get();
    }
  }
  /// A SharedCq's channel (null without one) and queue.
  explicit ChannelQueues(SharedCqState& shared) noexcept
      : channel_(shared.channel.get()), due_(shared.rearm_due), routes_(&shared.routes) {
    queues_[0] = shared.cq.get();
  }

  /// The channel; null when the connection has none of that kind.
  ibv_comp_channel* channel() const noexcept { return channel_; }

  /// Takes every event the channel holds without blocking (its fd must be non-blocking:
  /// completion_fds_nonblocking), acknowledges each and makes its queue due for re-arming.
  /// A queue raises at most one event per arming, so once every queue is due (taken, or
  /// its re-arm failed) there is nothing more to read, and no read is made for it.
  /// Errors: provider (ibv_get_cq_event failing otherwise than "nothing there" or EINTR; EIO
  /// once the device is gone: the channel delivers nothing more).
  expected<void> take_events() noexcept {
    const Provider& p = provider();
    while (!all_due()) {
      ibv_cq* cq = nullptr;
      void* context = nullptr;
      errno = 0;
      if (p.get_cq_event(channel_, &cq, &context) != 0) {
        const int e = errno;
        if (is_empty_channel_errno(e) || e == EINTR) return {};
        return fail(provider_error("ibv_get_cq_event", e));
      }
      p.ack_cq_events(cq, 1);
      for (int i = 0; i < 2; ++i)
        if (queues_[i] == cq) due_[i] = true;
    }
    return {};
  }

  /// Re-arms every queue due for it. Errors: provider (ibv_req_notify_cq, the first
  /// failure): that queue stays due.
  expected<void> rearm() noexcept {
    expected<void> result;
    for (int i = 0; i < 2; ++i) {
      if (queues_[i] == nullptr || !due_[i]) continue;
      if (auto armed = detail::rearm(queues_[i]); !armed) {
        if (result) result = fail(armed.error());
        continue;
      }
      due_[i] = false;
    }
    return result;
  }

  /// Whether a queue is still due for re-arming (its last re-arm failed).
  bool rearm_pending() const noexcept {
    return (queues_[0] != nullptr && due_[0]) || (queues_[1] != nullptr && due_[1]);
  }

  /// Polls the queues in turn (main first) into `out` (1 to 2^31-1 entries): how many the
  /// first non-empty one gave (watched for a lost path, as Cq::get); 0 when all are empty.
  /// With `conns` (as many as `out`), each is tagged with its connection (Cq::get).
  /// Errors: as Cq::get (poll_error).
  expected<std::size_t> poll(std::span<ibv_wc> out, ConnId* conns = nullptr) noexcept {
    for (ibv_cq* cq : queues_) {
      if (cq == nullptr) continue;
      const int n = routes_ != nullptr ? routes_->poll(provider(), cq, out, conns)
                                       : provider().poll_cq(cq, static_cast<int>(out.size()), out.data());
      if (n == 0) continue;
      if (n < 0 || static_cast<std::size_t>(n) > out.size()) return fail(poll_error(n, out.size()));
      const auto got = out.first(static_cast<std::size_t>(n));
      if (routes_ == nullptr) {
        watch_path(path_, got);
        if (conns != nullptr) std::fill(conns, conns + got.size(), owner_);
      }
      return got.size();
    }
    return std::size_t{0};
  }

 private:
  bool all_due() const noexcept {
    return (queues_[0] == nullptr || due_[0]) && (queues_[1] == nullptr || due_[1]);
  }

  ibv_comp_channel* channel_ = nullptr;
  ibv_cq* queues_[2] = {nullptr, nullptr};  // the main CQ, the receive CQ (as due_)
  bool* due_;                               // their owner's rearm_due
  PathMonitor* path_ = nullptr;             // a connection's (told of what its queues hold)
  ConnId owner_;                            // a connection's (the tag of its completions)
  CompletionRoutes* routes_ = nullptr;      // a SharedCq's
};

}  // namespace detail
RPMAPP_END_NAMESPACE
