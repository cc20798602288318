// The revocation of grants (rpmapp::Grant): a grant's release, and the registries that hold grants.
#pragma once

#include <rpmapp/detail/grants.hpp>

#include <cerrno>
#include <memory>
#include <mutex>
#include <new>
#include <utility>
#include <vector>

RPMAPP_BEGIN_NAMESPACE

RPMAPP_DECL expected<void> detail::GrantState::revoke(Teardown by, bool force) noexcept {
  std::lock_guard lock(mutex);
  revoked = true;
  if (!settled && !force) return {};
  return release(by);
}

RPMAPP_DECL expected<void> detail::GrantState::settle(Teardown by) noexcept {
  std::lock_guard lock(mutex);
  settled = true;
  if (!revoked) return {};
  return release(by);
}

RPMAPP_DECL expected<void> detail::GrantState::release(Teardown by) noexcept {
  FirstError first{by};
  if (window != nullptr) first.value_call(seam->dealloc_mw(window), "ibv_dealloc_mw");
  window = nullptr;
  if (range_mr != nullptr) first.value_call(seam->dereg_mr(range_mr), "ibv_dereg_mr");
  range_mr = nullptr;
  return first.result();
}

RPMAPP_DECL expected<void> detail::GrantRegistry::add(std::shared_ptr<GrantState> grant,
                                                      bool bind_posted_next) noexcept {
  std::lock_guard lock(mutex);
  std::erase_if(grants, [](const std::shared_ptr<GrantState>& g) { return !g->holds(); });
  try {
    grants.reserve(grants.size() + 1);
    if (bind_posted_next) binding.push_back(grant);  // no effect when it throws
  } catch (const std::bad_alloc&) {
    return fail(Error(errc::nomem, ENOMEM, "std::vector::reserve", "memory allocation failed"));
  }
  grants.push_back(std::move(grant));  // reserved: cannot throw
  pending.store(binding.size(), std::memory_order_relaxed);
  return {};
}

RPMAPP_DECL void detail::GrantRegistry::bind_not_posted() noexcept {
  std::lock_guard lock(mutex);
  if (!binding.empty()) binding.pop_back();
  pending.store(binding.size(), std::memory_order_relaxed);
}

RPMAPP_DECL void detail::GrantRegistry::revoke_all(FirstError& first) noexcept {
  std::vector<std::shared_ptr<GrantState>> all;
  {
    std::lock_guard lock(mutex);
    all.swap(grants);
    binding.clear();
    pending.store(0, std::memory_order_relaxed);
  }
  for (auto& grant : all)
    if (auto revoked = grant->revoke(first.by, true); !revoked) first.note(revoked.error());
}

RPMAPP_END_NAMESPACE
