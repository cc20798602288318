// 14-asio: an rpmapp fd watched by standalone Asio. rpmapp owns the fd (Endpoint::fd,
// Conn::fd, PendingConnReq::fd): Asio must never close it, and must let go of it before
// rpmapp closes it.
#pragma once

#include <asio/error.hpp>
#include <asio/io_context.hpp>
#include <asio/posix/stream_descriptor.hpp>

#include <utility>

namespace example {

/// An asio::posix::stream_descriptor on an fd it does not own: released (taken out of
/// Asio's reactor, not closed) when it goes. Destroy it before the rpmapp object whose fd
/// it watches. A wait still pending then completes with asio::error::operation_aborted.
class WatchedFd {
 public:
  explicit WatchedFd(asio::io_context& io) : descriptor_(io) {}
  WatchedFd(const WatchedFd&) = delete;
  WatchedFd& operator=(const WatchedFd&) = delete;
  ~WatchedFd() { release(); }

  /// Starts watching `fd` (registers it with the reactor).
  asio::error_code watch(int fd) {
    asio::error_code ec;
    descriptor_.assign(fd, ec);
    return ec;
  }
  /// Stops watching, without closing the fd.
  void release() {
    if (descriptor_.is_open()) (void)descriptor_.release();
  }

  /// Calls `handler(const asio::error_code&)` once the fd is readable. rpmapp's fds are
  /// non-blocking: after it, take what is pending (try_next_conn_req, try_next_event,
  /// try_wait) until no_event, then wait again. (Asio's reactor is edge-triggered: an
  /// event left unread raises no new wake-up.)
  template <class Handler>
  void when_readable(Handler&& handler) {
    descriptor_.async_wait(asio::posix::descriptor_base::wait_read, std::forward<Handler>(handler));
  }

 private:
  asio::posix::stream_descriptor descriptor_;
};

}  // namespace example
