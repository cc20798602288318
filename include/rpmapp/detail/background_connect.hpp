// EventLoop::connect's rdma_connect on iWARP, made on a thread of its own: siw makes the
// TCP connection inside that call (a blocking kernel connect, up to TCP's SYN timeout), so
// on the loop's thread it would stall every other source of the loop meanwhile.
#pragma once

#include <rpmapp/config.hpp>
#include <rpmapp/detail/connection.hpp>
#include <rpmapp/detail/loop_core.hpp>
#include <rpmapp/detail/provider.hpp>
#include <rpmapp/error.hpp>
#include <rpmapp/private_data.hpp>

#include <pthread.h>

#include <array>
#include <atomic>
#include <cstddef>
#include <memory>
#include <span>

RPMAPP_BEGIN_NAMESPACE
namespace detail {

/// One rdma_connect in progress on its own thread. Its fd() becomes readable once the
/// call returned (finished()); the connection (or the call's error) is then take()n on the
/// loop's thread, which also releases everything: the thread only makes the call and
/// signals. Destroying it waits for the call to return (LoopCore::adopt keeps one whose
/// coroutine is gone instead, so that the loop does not wait).
class BackgroundConnect final : public Orphan {
 public:
  /// Starts `core`'s rdma_connect with `private_data` (copied; at most what iWARP allows,
  /// which the caller checked); `call` (a string literal) names the call's failure in
  /// take(). Errors: provider (eventfd, pthread_create), nomem; `core` is then released.
  static expected<std::unique_ptr<BackgroundConnect>> start(std::unique_ptr<ConnectionCore> core,
                                                            std::span<const std::byte> private_data,
                                                            const char* call) noexcept;

  BackgroundConnect(const BackgroundConnect&) = delete;
  BackgroundConnect& operator=(const BackgroundConnect&) = delete;
  /// Waits for the thread (rdma_connect returned), closes the fd, releases what is left.
  /// (The virtual functions are defined here, in the class: one defined after it would be
  /// the key function, and every translation unit would emit the vtable and all it calls.)
  ~BackgroundConnect() override {
    if (started_) pthread_join(thread_, nullptr);
    if (fd_ >= 0) seam_->close(fd_);
  }

  int fd() const noexcept { return fd_; }
  bool finished() const noexcept override { return finished_.load(std::memory_order_acquire); }

  /// Once finished(): the connection's core, or rdma_connect's error (provider, in `call`
  /// as ConnReq::connect's; the request is released). Once.
  expected<std::unique_ptr<ConnectionCore>> take() noexcept;

  /// `loop` keeps this object from now on (LoopCore::adopt): the thread wakes it when done.
  void adopted_by(LoopCore& loop) noexcept override {
    adopter_.store(&loop, std::memory_order_seq_cst);
    // Done before it saw the adopter: nobody else wakes the loop to reap it.
    if (finished_.load(std::memory_order_seq_cst)) loop.wake();
  }

 private:
  BackgroundConnect(std::unique_ptr<ConnectionCore> core, std::span<const std::byte> private_data,
                    const char* call) noexcept;
  static void* run(void* self) noexcept;

  const Provider* seam_ = current_provider;  // the thread calls this one, not the global
  std::unique_ptr<ConnectionCore> core_;
  const char* call_;
  std::array<std::byte, max_iwarp_private_data> data_{};
  rdma_conn_param param_{};
  int fd_ = -1;
  pthread_t thread_{};
  bool started_ = false;
  int call_errno_ = 0;  // rdma_connect's errno, 0 on success: written by the thread before finished_
  std::atomic<bool> finished_{false};
  std::atomic<LoopCore*> adopter_{nullptr};
};

}  // namespace detail
RPMAPP_END_NAMESPACE

#if !defined(RPMAPP_SEPARATE_COMPILATION)
#  include <rpmapp/impl/detail_background_connect.ipp>
#endif
