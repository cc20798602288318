// The definitions of rpmapp/detail/completion_routes.hpp: tagging and draining a shared
// completion queue.
#pragma once

#include <rpmapp/detail/completion_routes.hpp>
#include <rpmapp/detail/errors.hpp>
#include <rpmapp/log.hpp>

#include <algorithm>
#include <new>

RPMAPP_BEGIN_NAMESPACE
namespace detail {

RPMAPP_DECL expected<void> CompletionRoutes::reserve(std::size_t entries) noexcept {
  return no_throw("CompletionRoutes::reserve", [&]() -> expected<void> {
    std::lock_guard lock(mutex_);
    parked_.reserve(entries);
    return {};
  });
}

RPMAPP_DECL expected<void> CompletionRoutes::add(const Provider& p, ibv_cq* cq, std::uint32_t qp_num,
                                                 PathMonitor& path) noexcept {
  return no_throw("CompletionRoutes::add", [&]() -> expected<void> {
    std::lock_guard lock(mutex_);
    if (routes_.count(qp_num) != 0) {  // a gone queue pair's number, its draining failed before
      int failure = 0;
      if (!drain(p, cq, qp_num, failure))
        return fail(make_error(errc::provider, 0, "ibv_poll_cq",
                               "returned {} draining the shared queue of a gone queue pair numbered {}",
                               failure, qp_num));
    }
    routes_.insert_or_assign(qp_num, Route(path));
    return {};
  });
}

RPMAPP_DECL expected<void> CompletionRoutes::retire(const Provider& p, ibv_cq* cq, std::uint32_t qp_num,
                                                    bool qp_survived) noexcept {
  std::lock_guard lock(mutex_);
  auto route = routes_.find(qp_num);
  if (route == routes_.end()) return {};
  route->second.forget_path();  // the connection is going: nothing may reach it any more
  if (qp_survived) return {};    // it may still complete work: its number stays its own
  int failure = 0;
  if (!drain(p, cq, qp_num, failure))
    return fail(make_error(errc::provider, 0, "ibv_poll_cq",
                           "returned {} draining the shared queue of queue pair {}: its number stays "
                           "routed to the gone connection",
                           failure, qp_num));
  routes_.erase(route);
  return {};
}

RPMAPP_DECL bool CompletionRoutes::drain(const Provider& p, ibv_cq* cq, std::uint32_t qp_num, int& failure) noexcept {
  constexpr int batch_size = 32;
  ibv_wc batch[batch_size];
  std::size_t lost = 0;
  for (;;) {
    const int n = p.poll_cq(cq, batch_size, batch);
    if (n == 0) break;
    if (n < 0 || n > batch_size) {
      failure = n;
      return false;
    }
    for (int i = 0; i < n; ++i) {
      if (batch[i].qp_num == qp_num) continue;
      try {
        parked_.push_back(batch[i]);
      } catch (const std::bad_alloc&) {
        ++lost;
      }
    }
    // The queue was empty then: every completion of the gone queue pair, all queued
    // before draining began, was taken.
    if (n < batch_size) break;
  }
  const auto gone = std::remove_if(parked_.begin() + static_cast<std::ptrdiff_t>(parked_head_), parked_.end(),
                                   [qp_num](const ibv_wc& wc) { return wc.qp_num == qp_num; });
  parked_.erase(gone, parked_.end());
  if (lost != 0) [[unlikely]]
    log(LogLevel::error, "a connection's release (draining its shared completion queue)",
        make_error(errc::nomem, ENOMEM, "std::vector::push_back",
                   "out of memory parking completions: {} of other connections were dropped", lost));
  return true;
}

RPMAPP_DECL int CompletionRoutes::poll(const Provider& p, ibv_cq* cq, std::span<ibv_wc> out,
                                       ConnId* conns) noexcept {
  std::lock_guard lock(mutex_);
  std::size_t n = 0;
  while (n < out.size() && parked_head_ < parked_.size()) out[n++] = parked_[parked_head_++];
  if (parked_head_ == parked_.size()) {
    parked_.clear();
    parked_head_ = 0;
  }
  if (n < out.size()) {
    const int polled = p.poll_cq(cq, static_cast<int>(out.size() - n), out.data() + n);
    if (polled < 0 || static_cast<std::size_t>(polled) > out.size() - n) {
      if (n == 0) return polled;  // the failure; a parked batch is returned first
    } else {
      n += static_cast<std::size_t>(polled);
    }
  }
  for (std::size_t i = 0; i < n; ++i) {
    const auto route = routes_.find(out[i].qp_num);
    if (conns != nullptr) conns[i] = route != routes_.end() ? route->second.conn() : ConnId{};
    if (route != routes_.end()) watch_path(route->second.path(), out.subspan(i, 1));
  }
  return static_cast<int>(n);
}

RPMAPP_DECL std::size_t CompletionRoutes::size() noexcept {
  std::lock_guard lock(mutex_);
  return routes_.size();
}

}  // namespace detail
RPMAPP_END_NAMESPACE
