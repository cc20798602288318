// rpmapp::Grant: remote access to a range of a region, for one connection, while it lives.
#pragma once

#include <rpmapp/conn.hpp>
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
                              std::uint64_t context = bind_wr_id) noexcept;

  /// An empty Grant, as a moved-from one.
  Grant() noexcept = default;
  Grant(Grant&&) noexcept = default;
  /// Revokes this grant as the destructor does (a failure logged under "Grant::operator="),
  /// then takes `other`'s.
  Grant& operator=(Grant&& other) noexcept;
  /// Revokes the grant; a failure is logged (warning, "Grant::~Grant"; use revoke() to get it).
  ~Grant() { revoke_logged("Grant::~Grant"); }

  /// False when moved from or revoked (also by its connection or region).
  explicit operator bool() const noexcept { return state_ && state_->live(); }

  /// The descriptor to send the peer (librpma's format: the range's address and length, the
  /// window's key, the usages granted). Errors: inval when empty or revoked.
  expected<MrDescriptor> descriptor() const noexcept;
  /// Writes the descriptor into `out` and returns its size. Errors: as descriptor(); inval
  /// when `out` is shorter than mr_descriptor_size (nothing is written then).
  expected<std::size_t> write_descriptor(std::span<std::byte> out) const noexcept;
  /// As above, into a char buffer.
  expected<std::size_t> write_descriptor(std::span<char> out) const noexcept;

  /// Revokes the grant now (the Grant is empty afterwards, whatever the result): the window
  /// is deallocated at once when its bind's completion has been read, else when it is (see
  /// the class comment). One its connection or region already revoked gives success.
  /// Errors: inval when empty (moved from); provider: ibv_dealloc_mw or ibv_dereg_mr failed
  /// (both are still attempted; the first failure is returned).
  expected<void> revoke() && noexcept;

 private:
  explicit Grant(std::shared_ptr<detail::GrantState> state) noexcept : state_(std::move(state)) {}

  /// GrantMode::registrations: registers the range with the granted rights and enters the
  /// grant in the region's and the connection's registries (settled: nothing is posted).
  /// On failure `state` holds what the caller must release.
  static expected<void> register_range(detail::ConnectionCore& core, detail::GrantRegistry& region_grants,
                                       const std::shared_ptr<detail::GrantState>& state, ibv_mr* region,
                                       std::size_t offset, std::size_t len, MrUsage usage) noexcept;

  /// Registers the range (a part of the region), allocates the window, enters the grant in
  /// the connection's (as its next bind) and the region's registries, then posts the bind,
  /// signaled. On failure `state` holds what the caller must release (nothing was posted);
  /// nothing can fail after the bind is posted.
  static expected<void> bind(detail::ConnectionCore& core, detail::GrantRegistry& region_grants,
                             const std::shared_ptr<detail::GrantState>& state, ibv_mr* region,
                             MrUsage region_usage, std::size_t offset, std::size_t len,
                             MrUsage usage, std::uint64_t context) noexcept;

  void revoke_logged(const char* where) noexcept;

  std::shared_ptr<detail::GrantState> state_;
};

RPMAPP_END_NAMESPACE

#if !defined(RPMAPP_SEPARATE_COMPILATION)
#  include <rpmapp/impl/grant.ipp>
#endif
