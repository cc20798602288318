// rpmapp/detail/background_connect.hpp's definitions.
#pragma once

#include <rpmapp/detail/background_connect.hpp>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <new>

RPMAPP_BEGIN_NAMESPACE
namespace detail {

RPMAPP_DECL BackgroundConnect::BackgroundConnect(std::unique_ptr<ConnectionCore> core,
                                                 std::span<const std::byte> private_data, const char* call) noexcept
    : core_(std::move(core)), call_(call) {
  const std::size_t n = std::min(private_data.size(), data_.size());
  std::copy_n(private_data.begin(), n, data_.begin());
  param_ = conn_param(std::span<const std::byte>(data_.data(), n), core_->config);
}

RPMAPP_DECL expected<std::unique_ptr<BackgroundConnect>> BackgroundConnect::start(
    std::unique_ptr<ConnectionCore> core, std::span<const std::byte> private_data, const char* call) noexcept {
  std::unique_ptr<BackgroundConnect> b(new (std::nothrow) BackgroundConnect(std::move(core), private_data, call));
  if (!b) return fail(Error(errc::nomem, ENOMEM, "operator new", "memory allocation failed"));
  errno = 0;
  b->fd_ = b->seam_->eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (b->fd_ < 0) return fail(provider_error("eventfd", errno, "the signal of iWARP's rdma_connect on its own thread"));
  if (const int err = b->seam_->pthread_create(&b->thread_, &BackgroundConnect::run, b.get()); err != 0)
    return fail(provider_error("pthread_create", err, "the thread that makes iWARP's rdma_connect"));
  b->started_ = true;
  return b;
}

RPMAPP_DECL void* BackgroundConnect::run(void* self) noexcept {
  auto& b = *static_cast<BackgroundConnect*>(self);
  errno = 0;
  if (b.seam_->connect(b.core_->id.get(), &b.param_) != 0) b.call_errno_ = errno != 0 ? errno : EIO;
  b.finished_.store(true, std::memory_order_seq_cst);
  const std::uint64_t one = 1;
  (void)b.seam_->write(b.fd_, &one, sizeof one);  // non-blocking: a full counter is signalled already
  if (LoopCore* loop = b.adopter_.load(std::memory_order_seq_cst)) loop->wake();
  return nullptr;
}

RPMAPP_DECL expected<std::unique_ptr<ConnectionCore>> BackgroundConnect::take() noexcept {
  if (call_errno_ != 0) {
    auto released = std::move(core_);  // as ConnReq::connect: a failed request is released
    return fail(provider_error_in(call_, "rdma_connect", call_errno_));
  }
  return std::move(core_);
}

}  // namespace detail
RPMAPP_END_NAMESPACE
