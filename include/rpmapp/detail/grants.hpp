// What revokes a grant (rpmapp::Grant): its memory window, and the registration of its range
// when it has one. A grant is reachable from the Grant itself, from its connection and from
// its region, and whichever of the three ends first revokes it; the other two find it
// revoked.
//
// A window's bind is a work request the device executes later; deallocating the window
// before that makes the bind fail, and with it the connection (rxe: IBV_WC_MW_BIND_ERR, the
// queue pair in the error state). So a grant is released only once it is *settled*: its
// bind's completion was read (rpmapp sees every completion read through Cq and the event
// loop: watch_path), or the connection failed (its binds will never run), or the
// connection or region is going away (`force`).
#pragma once

#include <rpmapp/detail/errors.hpp>
#include <rpmapp/detail/handles.hpp>
#include <rpmapp/detail/provider.hpp>
#include <rpmapp/mr_usage.hpp>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <list>
#include <memory>
#include <mutex>
#include <span>
#include <vector>

RPMAPP_BEGIN_NAMESPACE
namespace detail {

/// A grant's provider objects and its descriptor's fields. The mutex makes revocation
/// happen once and makes a concurrent revoker wait until the window is gone (a connection
/// must not destroy its queue pair while a window bound to it still exists: rxe then waits
/// for the window's reference, up to 50 s).
struct GrantState {
  const Provider* seam = current_provider;
  std::mutex mutex;
  ibv_mw* window = nullptr;    // until released
  ibv_mr* range_mr = nullptr;  // the registration of a part of a region, or null
  bool revoked = false;        // by its Grant, its connection or its region
  bool settled = false;        // its bind ran, or never will
  std::uint64_t addr = 0;
  std::uint64_t length = 0;
  std::uint32_t rkey = 0;
  MrUsage usage{};

  GrantState() = default;
  GrantState(const GrantState&) = delete;
  GrantState& operator=(const GrantState&) = delete;

  /// Not revoked: its descriptor is still good.
  bool live() noexcept {
    std::lock_guard lock(mutex);
    return !revoked;
  }
  /// Still holds a window or a registration.
  bool holds() noexcept {
    std::lock_guard lock(mutex);
    return window != nullptr || range_mr != nullptr;
  }

  /// Revokes the grant: releases it now when it is settled or `force` is set (its
  /// connection or region is going: a bind still pending then fails, which only that
  /// connection sees), else when it settles. The first release failure is returned.
  expected<void> revoke(Teardown by, bool force) noexcept;
  /// Its bind ran (or never will): releases it when it was revoked meanwhile.
  expected<void> settle(Teardown by) noexcept;

 private:
  /// Deallocates the window (after which the peer's accesses through its key fail), then
  /// deregisters the range's registration (mutex held). A failed ibv_dealloc_mw is
  /// reported, never retried: the provider has released or kept the window by then.
  expected<void> release(Teardown by) noexcept;
};

/// The grants of a connection or of a region. Released entries are dropped when the next
/// one is added. A connection's also keeps its grants whose binds have not completed, in
/// the order they were posted (a send queue completes in order). Its lists are made by the
/// first grant: most connections and regions never grant, and every one has a registry.
struct GrantRegistry {
  /// How many binds are pending, read without a lock by every poll of the connection's
  /// queues.
  std::atomic<std::size_t> pending{0};

  GrantRegistry() = default;
  GrantRegistry(const GrantRegistry&) = delete;
  GrantRegistry& operator=(const GrantRegistry&) = delete;
  ~GrantRegistry() { delete lists_.load(std::memory_order_acquire); }

  /// Adds `grant`; with `bind_posted_next`, also as the next bind to complete. Errors: nomem.
  expected<void> add(std::shared_ptr<GrantState> grant, bool bind_posted_next = false) noexcept;
  /// The bind of the last grant added could not be posted: it will not complete.
  void bind_not_posted() noexcept;

  /// Settles the grants whose binds `completions` (just read from the connection's queues)
  /// show done: each successful IBV_WC_BIND_MW completes the oldest pending bind; a failed
  /// completion means the queue pair is in the error state, where no pending bind will run.
  /// A failure to release a grant revoked meanwhile is logged under `by`.
  void completed(std::span<const ibv_wc> completions, Teardown by) noexcept;

  /// Revokes and releases every grant (`force`: the connection or region is going),
  /// reporting the first failure through `first`.
  void revoke_all(FirstError& first) noexcept;

 private:
  struct Lists {
    std::mutex mutex;
    std::vector<std::shared_ptr<GrantState>> grants;
    /// A list: libstdc++'s empty deque allocates 576 bytes.
    std::list<std::shared_ptr<GrantState>> binding;
  };
  /// Null until the first add; then set once (two first adds race for it) and kept.
  std::atomic<Lists*> lists_{nullptr};

  /// The lists, made if need be. Errors: nomem.
  expected<Lists*> lists() noexcept;
};

}  // namespace detail
RPMAPP_END_NAMESPACE

#if !defined(RPMAPP_SEPARATE_COMPILATION)
#  include <rpmapp/impl/detail_grants.ipp>
#endif
