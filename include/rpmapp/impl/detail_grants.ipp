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

RPMAPP_DECL expected<detail::GrantRegistry::Lists*> detail::GrantRegistry::lists() noexcept {
  if (Lists* made = lists_.load(std::memory_order_acquire)) return made;
  auto* fresh = new (std::nothrow) Lists;
  if (fresh == nullptr) return fail(Error(errc::nomem, ENOMEM, "operator new", "memory allocation failed"));
  Lists* expected_null = nullptr;
  if (lists_.compare_exchange_strong(expected_null, fresh, std::memory_order_acq_rel)) return fresh;
  delete fresh;  // another thread's first add made them
  return expected_null;
}

RPMAPP_DECL expected<void> detail::GrantRegistry::add(std::shared_ptr<GrantState> grant,
                                                      bool bind_posted_next) noexcept {
  auto made = lists();
  if (!made) return fail(made.error());
  Lists& l = **made;
  std::lock_guard lock(l.mutex);
  std::erase_if(l.grants, [](const std::shared_ptr<GrantState>& g) { return !g->holds(); });
  try {
    l.grants.reserve(l.grants.size() + 1);
    if (bind_posted_next) l.binding.push_back(grant);  // no effect when it throws
  } catch (const std::bad_alloc&) {
    return fail(Error(errc::nomem, ENOMEM, "std::vector::reserve", "memory allocation failed"));
  }
  l.grants.push_back(std::move(grant));  // reserved: cannot throw
  pending.store(l.binding.size(), std::memory_order_relaxed);
  return {};
}

RPMAPP_DECL void detail::GrantRegistry::bind_not_posted() noexcept {
  Lists* l = lists_.load(std::memory_order_acquire);
  if (l == nullptr) return;
  std::lock_guard lock(l->mutex);
  if (!l->binding.empty()) l->binding.pop_back();
  pending.store(l->binding.size(), std::memory_order_relaxed);
}

RPMAPP_DECL void detail::GrantRegistry::completed(std::span<const ibv_wc> completions, Teardown by) noexcept {
  Lists* l = lists_.load(std::memory_order_acquire);
  if (l == nullptr) return;
  std::lock_guard lock(l->mutex);
  auto& binding = l->binding;
  for (const ibv_wc& wc : completions) {
    if (binding.empty()) break;
    const bool failed = wc.status != IBV_WC_SUCCESS;
    if (!failed && wc.opcode != IBV_WC_BIND_MW) continue;
    do {
      if (auto released = binding.front()->settle(by); !released) [[unlikely]]
        log(by.level, by.where, released.error());
      binding.pop_front();
    } while (failed && !binding.empty());
  }
  pending.store(binding.size(), std::memory_order_relaxed);
}

RPMAPP_DECL void detail::GrantRegistry::revoke_all(FirstError& first) noexcept {
  Lists* l = lists_.load(std::memory_order_acquire);
  if (l == nullptr) return;  // never granted
  std::vector<std::shared_ptr<GrantState>> all;
  {
    std::lock_guard lock(l->mutex);
    all.swap(l->grants);
    l->binding.clear();
    pending.store(0, std::memory_order_relaxed);
  }
  for (auto& grant : all)
    if (auto revoked = grant->revoke(first.by, true); !revoked) first.note(revoked.error());
}

RPMAPP_END_NAMESPACE
