// rpmapp::Grant: remote access to a range of a region, for one connection, while it lives.
#pragma once

#include <rpmapp/conn.hpp>
#include <rpmapp/detail/errors.hpp>
#include <rpmapp/detail/grants.hpp>
#include <rpmapp/error.hpp>
#include <rpmapp/mr.hpp>
#include <rpmapp/mr_usage.hpp>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>

RPMAPP_BEGIN_NAMESPACE

/// A peer's access to [offset, offset + len) of a region, for the usages named, through one
/// connection only, until it is revoked (librpma has no equivalent: its descriptors are good
/// on every connection of the Peer while the region stays registered).
///
/// It is a type 2 memory window bound to the connection's queue pair, with a key whose
/// variable byte rpmapp draws from getrandom(2). A part of a region gets a registration of
/// its own under the window, so that the device's bounds are the grant's (rxe checks an
/// access through a window against its region's bounds, not the window's). Its descriptor is
/// librpma's 21-byte format: a librpma peer uses it unchanged (MrRemote here).
///
/// Where the Peer has no type 2 windows (Peer::grant_mode(), e.g. siw), or the region was
/// registered with MrScope::grants_by_registration, a grant is instead a registration of
/// its range with the granted rights only (GrantMode::registrations): good at once (no bind,
/// no completion), revoked in the same cases, its key chosen by the device; but that key
/// is good on every connection of the Peer while the grant lives, not on one only.
///
/// A grant is revoked by whichever comes first: revoke() or its destruction, the release
/// of its connection (Conn::close, ~Conn), or the deregistration of its region. Once
/// revoked the window is deallocated: an access through the old descriptor, from any
/// connection, fails at the peer with a remote access error (IBV_WC_REM_ACCESS_ERR), which
/// also moves the peer's queue pair to the error state. An access the peer has in flight
/// when the grant is revoked either completes (the device had checked the key) or fails
/// the same way.
///
/// The peer learns the descriptor from a message sent on the same connection after
/// Grant::make: the bind is posted on the connection's send queue, which the device
/// executes in order, so the window is bound before that message leaves. The bind completes
/// like any operation: a completion on the connection's CQ (opcode IBV_WC_BIND_MW, wr_id
/// `context`). Until rpmapp has seen that completion (read through Cq or an EventLoop) the
/// window cannot be deallocated without failing the bind, and the connection with it: a
/// grant revoked before then is released when the completion is read, when the connection
/// fails or when it is released, whichever is first (its descriptor() is gone at once).
///
/// Thread safety: a Grant is one thread's; it may be revoked, or destroyed, while its
/// connection or region is released on another thread (the first revocation wins, the
/// others wait for it to finish).
class Grant {
 public:
  /// The default work request id of a grant's bind completion ("rpmapp:g").
  static constexpr std::uint64_t bind_wr_id = 0x72706d6170703a67;

  /// Grants `conn`'s peer `usage` of [offset, offset + len) of `region`; the bind's
  /// completion comes on the connection's CQ with wr_id `context` (by windows; by
  /// registrations nothing is posted).
  /// Errors:
  /// - inval: `conn` or `region` is empty; `region` was registered with MrScope::peer, or
  ///   on another Peer; len 0 or the range is not within the region; `usage` is empty,
  ///   names a local usage (a grant gives read_src, write_dst, flush_visibility,
  ///   flush_persistent) or one the region was not registered for.
  /// - provider: ibv_reg_mr (a part of a region, or the range by registrations),
  ///   ibv_alloc_mw, getrandom or the bind's ibv_post_send failed (errno in the Error;
  ///   e.g. ENOMEM: the send queue is full).
  /// - nomem: any of those with ENOMEM, or out of memory.
  /// Nothing is left bound or registered after an error.
  /// Thread safety: one thread at a time per Conn (as Conn's calls); `region` may be
  /// granted on several connections at once.
  static expected<Grant> make(Conn& conn, const MrLocal& region, std::size_t offset,
                              std::size_t len, MrUsage usage,
                              std::uint64_t context = bind_wr_id) noexcept {
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

  /// An empty Grant, as a moved-from one.
  Grant() noexcept = default;
  Grant(Grant&&) noexcept = default;
  /// Revokes this grant as the destructor does (a failure logged under "Grant::operator="),
  /// then takes `other`'s.
  Grant& operator=(Grant&& other) noexcept {
    if (this != &other) {
      revoke_logged("Grant::operator=");
      state_ = std::move(other.state_);
    }
    return *this;
  }
  /// Revokes the grant; a failure is logged (warning, "Grant::~Grant"; use revoke() to get it).
  ~Grant() { revoke_logged("Grant::~Grant"); }

  /// False when moved from or revoked (also by its connection or region).
  explicit operator bool() const noexcept { return state_ && state_->live(); }

  /// The descriptor to send the peer (librpma's format: the range's address and length, the
  /// window's key, the usages granted). Errors: inval when empty or revoked.
  expected<MrDescriptor> descriptor() const noexcept {
    constexpr const char* call = "Grant::descriptor";
    if (!*this) return detail::fail(Error(errc::inval, 0, call, "the grant is empty or revoked"));
    return detail::encode_descriptor(state_->addr, state_->length, state_->rkey, state_->usage);
  }
  /// Writes the descriptor into `out` and returns its size. Errors: as descriptor(); inval
  /// when `out` is shorter than mr_descriptor_size (nothing is written then).
  expected<std::size_t> write_descriptor(std::span<std::byte> out) const noexcept {
    constexpr const char* call = "Grant::write_descriptor";
    if (!*this) return detail::fail(Error(errc::inval, 0, call, "the grant is empty or revoked"));
    return detail::copy_descriptor(call, *descriptor(), out);
  }
  /// As above, into a char buffer.
  expected<std::size_t> write_descriptor(std::span<char> out) const noexcept {
    return write_descriptor(std::as_writable_bytes(out));
  }

  /// Revokes the grant now (the Grant is empty afterwards, whatever the result): the window
  /// is deallocated at once when its bind's completion has been read, else when it is (see
  /// the class comment). One its connection or region already revoked gives success.
  /// Errors: inval when empty (moved from); provider: ibv_dealloc_mw or ibv_dereg_mr failed
  /// (both are still attempted; the first failure is returned).
  expected<void> revoke() && noexcept {
    constexpr const char* call = "Grant::revoke";
    if (!state_) return detail::fail(detail::moved_from(call));
    auto state = std::move(state_);
    auto revoked = state->revoke({call, LogLevel::notice}, false);
    detail::name_in(revoked, call);
    return revoked;
  }

 private:
  explicit Grant(std::shared_ptr<detail::GrantState> state) noexcept : state_(std::move(state)) {}

  /// GrantMode::registrations: registers the range with the granted rights and enters the
  /// grant in the region's and the connection's registries (settled: nothing is posted).
  /// On failure `state` holds what the caller must release.
  static expected<void> register_range(detail::ConnectionCore& core, detail::GrantRegistry& region_grants,
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

  /// Registers the range (a part of the region), allocates the window, enters the grant in
  /// the connection's (as its next bind) and the region's registries, then posts the bind,
  /// signaled. On failure `state` holds what the caller must release (nothing was posted);
  /// nothing can fail after the bind is posted.
  static expected<void> bind(detail::ConnectionCore& core, detail::GrantRegistry& region_grants,
                             const std::shared_ptr<detail::GrantState>& state, ibv_mr* region,
                             MrUsage region_usage, std::size_t offset, std::size_t len,
                             MrUsage usage, std::uint64_t context) noexcept {
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

  void revoke_logged(const char* where) noexcept {
    if (!state_) return;
    auto state = std::move(state_);
    if (auto revoked = state->revoke({where, LogLevel::warning}, false); !revoked) [[unlikely]]
      detail::log(LogLevel::warning, where, revoked.error());
  }

  std::shared_ptr<detail::GrantState> state_;
};

RPMAPP_END_NAMESPACE
