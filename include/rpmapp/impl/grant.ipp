// rpmapp::Grant's definitions: making (by windows or by registrations) and revoking a grant.
#pragma once

#include <rpmapp/grant.hpp>

#include <rpmapp/detail/errors.hpp>

#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <utility>

RPMAPP_BEGIN_NAMESPACE

RPMAPP_DECL expected<Grant> Grant::make(Conn& conn, const MrLocal& region, std::size_t offset,
                                        std::size_t len,
                                        MrUsage usage, std::uint64_t context) noexcept {
  constexpr const char* call = "Grant::make";
  if (!conn) return detail::fail(detail::moved_from(call));
  if (!region) return detail::fail(detail::invalid(call, "the region is empty (moved from or deregistered)"));
  detail::ConnectionCore& core = *conn.core_;
  ibv_mr* raw = region.mr_.get();
  if (!region.grants_)
    return detail::fail(detail::invalid(call, "the region is registered with MrScope::peer: register it "
                                              "with MrScope::grants to grant it"));
  if (raw->pd != core.peer->pd.get())
    return detail::fail(detail::invalid(call, "the region is registered on another Peer"));
  if (len == 0 || !detail::in_bounds(offset, len, raw->length))
    return detail::fail(detail::invalid(call, "range [{}, +{}) is not within the {}-byte region", offset, len,
                                        raw->length));
  if (to_underlying(usage) == 0 || (to_underlying(usage) & ~to_underlying(detail::remote_usages)) != 0)
    return detail::fail(detail::invalid(call, "usage 0x{:02x} is not a set of remote usages (read_src, "
                                              "write_dst, flush_visibility, flush_persistent)",
                                        to_underlying(usage)));
  if (!has(region.usage_, usage))
    return detail::fail(detail::invalid(call, "the region is not registered for usage 0x{:02x}",
                                        to_underlying(usage)));
  return detail::no_throw(call, [&]() -> expected<Grant> {
    auto state = std::make_shared<detail::GrantState>();
    auto made = region.by_windows_
                    ? bind(core, *region.grants_, state, raw, region.usage_, offset, len, usage, context)
                    : register_range(core, *region.grants_, state, raw, offset, len, usage);
    if (!made) {  // nothing was posted: the grant goes now
      if (auto revoked = state->revoke({call, LogLevel::notice}, true); !revoked)
        detail::log(LogLevel::notice, call, revoked.error());
      return detail::fail(made.error());
    }
    return Grant(std::move(state));
  });
}

RPMAPP_DECL Grant& Grant::operator=(Grant&& other) noexcept {
  if (this != &other) {
    revoke_logged("Grant::operator=");
    state_ = std::move(other.state_);
  }
  return *this;
}

RPMAPP_DECL expected<MrDescriptor> Grant::descriptor() const noexcept {
  constexpr const char* call = "Grant::descriptor";
  if (!*this) return detail::fail(Error(errc::inval, 0, call, "the grant is empty or revoked"));
  return detail::encode_descriptor(state_->addr, state_->length, state_->rkey, state_->usage);
}

RPMAPP_DECL expected<std::size_t> Grant::write_descriptor(std::span<std::byte> out) const noexcept {
  constexpr const char* call = "Grant::write_descriptor";
  if (!*this) return detail::fail(Error(errc::inval, 0, call, "the grant is empty or revoked"));
  return detail::copy_descriptor(call, *descriptor(), out);
}

RPMAPP_DECL expected<void> Grant::revoke() && noexcept {
  constexpr const char* call = "Grant::revoke";
  if (!state_) return detail::fail(detail::moved_from(call));
  auto state = std::move(state_);
  auto revoked = state->revoke({call, LogLevel::notice}, false);
  detail::name_in(revoked, call);
  return revoked;
}

RPMAPP_DECL expected<void> Grant::register_range(detail::ConnectionCore& core,
                                                 detail::GrantRegistry& region_grants,
                                                 const std::shared_ptr<detail::GrantState>& state, ibv_mr* region,
                                                 std::size_t offset, std::size_t len, MrUsage usage) noexcept {
  const std::uint64_t addr = reinterpret_cast<std::uintptr_t>(region->addr) + offset;
  // access_for of remote usages: exactly their remote rights (and LOCAL_WRITE under a
  // remote write, which verbs require)
  auto range = detail::register_memory(*core.peer, reinterpret_cast<void*>(addr), len, usage);
  if (!range) return detail::fail(range.error());
  state->range_mr = range->release();
  state->settled = true;
  state->addr = addr;
  state->length = len;
  state->rkey = state->range_mr->rkey;
  state->usage = usage;
  if (auto added = region_grants.add(state); !added) return detail::fail(added.error());
  return core.grants.add(state);
}

RPMAPP_DECL expected<void> Grant::bind(detail::ConnectionCore& core,
                                       detail::GrantRegistry& region_grants,
                                       const std::shared_ptr<detail::GrantState>& state, ibv_mr* region,
                                       MrUsage region_usage, std::size_t offset, std::size_t len, MrUsage usage,
                                       std::uint64_t context) noexcept {
  const detail::Provider& p = *state->seam;
  const detail::PeerState& peer = *core.peer;
  ibv_mr* target = region;
  const std::uint64_t addr = reinterpret_cast<std::uintptr_t>(region->addr) + offset;
  if (offset != 0 || len != region->length) {
    auto part = detail::register_memory(peer, reinterpret_cast<void*>(addr), len, region_usage,
                                        detail::Rights::for_windows);
    if (!part) return detail::fail(part.error());
    state->range_mr = target = part->release();
  }
  errno = 0;
  ibv_mw* window = p.alloc_mw(peer.pd.get(), IBV_MW_TYPE_2);
  if (window == nullptr) return detail::fail(detail::provider_error("ibv_alloc_mw", errno));
  state->window = window;
  // in both registries before the bind is posted: from then on only revocation undoes it
  if (auto added = region_grants.add(state); !added) return detail::fail(added.error());
  if (auto added = core.grants.add(state, true); !added) return detail::fail(added.error());
  std::uint8_t key = 0;
  errno = 0;
  if (p.getrandom(&key, 1, 0) != 1) {
    const int e = errno;
    core.grants.bind_not_posted();
    return detail::fail(detail::provider_error("getrandom", e, "no random byte for the window's key"));
  }
  const std::uint32_t rkey = (window->rkey & ~std::uint32_t{0xff}) | key;
  ibv_send_wr wr{};
  wr.wr_id = context;
  wr.opcode = IBV_WR_BIND_MW;
  wr.send_flags = IBV_SEND_SIGNALED;
  wr.bind_mw.mw = window;
  wr.bind_mw.rkey = rkey;
  wr.bind_mw.bind_info.mr = target;
  wr.bind_mw.bind_info.addr = addr;
  wr.bind_mw.bind_info.length = len;
  wr.bind_mw.bind_info.mw_access_flags = static_cast<unsigned>(detail::window_access_for(usage, peer.native_flush));
  ibv_send_wr* bad = nullptr;
  // the grant's fields before the post: its completion may be read on another thread
  state->addr = addr;
  state->length = len;
  state->rkey = rkey;
  state->usage = usage;
  if (int rc = p.post_send(core.qp->qp, &wr, &bad); rc != 0) {
    core.grants.bind_not_posted();
    return detail::fail(detail::provider_error("ibv_post_send", rc, "binding the grant's memory window"));
  }
  window->rkey = rkey;  // as ibv_bind_mw does: a later bind names the window by its key
  return {};
}

RPMAPP_DECL void Grant::revoke_logged(const char* where) noexcept {
  if (!state_) return;
  auto state = std::move(state_);
  if (auto revoked = state->revoke({where, LogLevel::warning}, false); !revoked) [[unlikely]]
    detail::log(LogLevel::warning, where, revoked.error());
}

RPMAPP_DECL expected<std::size_t> Grant::write_descriptor(std::span<char> out) const noexcept {
  return write_descriptor(std::as_writable_bytes(out));
}

RPMAPP_END_NAMESPACE
