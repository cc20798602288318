// rpmapp::MrLocal (a registered memory region) and rpmapp::MrRemote (a peer's region, from
// its descriptor), with librpma's 21-byte descriptor format.
#pragma once

#include <rpmapp/detail/errors.hpp>
#include <rpmapp/detail/grants.hpp>
#include <rpmapp/detail/handles.hpp>
#include <rpmapp/error.hpp>
#include <rpmapp/mr_usage.hpp>
#include <rpmapp/peer.hpp>

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>

RPMAPP_BEGIN_NAMESPACE

/// Size of a memory region's descriptor: librpma's `u64 addr, u64 len, u32 rkey, u8 usage`,
/// little-endian, packed.
inline constexpr std::size_t mr_descriptor_size = 21;

/// A memory region's descriptor, as sent to the peer.
using MrDescriptor = std::array<std::byte, mr_descriptor_size>;

namespace detail {
struct MrAccess;
void put_le(std::byte* out, std::uint64_t value, int bytes) noexcept;
std::uint64_t get_le(const std::byte* in, int bytes) noexcept;
MrDescriptor encode_descriptor(std::uint64_t addr, std::uint64_t len, std::uint32_t rkey,
                               MrUsage usage) noexcept;
/// Copies `d` into `out` for `call`'s write_descriptor. Errors: inval when `out` is
/// shorter than the descriptor (nothing is written then).
expected<std::size_t> copy_descriptor(const char* call, const MrDescriptor& d,
                                      std::span<std::byte> out) noexcept;
/// True when [offset, offset + len) lies in a region of `size` bytes (no overflow).
constexpr bool in_bounds(std::size_t offset, std::size_t len, std::uint64_t size) noexcept {
  return offset <= size && len <= size - offset;
}
}  // namespace detail

/// Who may reach a region's remote usages (read_src, write_dst, flush_*).
enum class MrScope {
  /// Every connection of its Peer whose peer has its descriptor, for as long as it stays
  /// registered: its own key carries the remote rights (librpma's model).
  peer,
  /// Only connections it is granted to (Grant::make), for the range and usages granted,
  /// while the grant lives: its own key carries no remote right. Grants are windows where
  /// the device has them, else registrations (Peer::grant_mode).
  grants,
  /// As grants, always by registrations, even where the device has windows (to compare,
  /// or where a device's windows misbehave).
  grants_by_registration,
};

class Grant;

/// A region of the caller's memory registered on a Peer for some usages (librpma's
/// rpma_mr_local). Move-only; deregistered when destroyed. It keeps its Peer's protection
/// domain alive. The memory itself stays the caller's: keep it alive while registered.
/// Thread safety: a const MrLocal may be used from several threads at once (operations
/// only read it); dereg() is one thread's.
class MrLocal {
 public:
  /// Registers `size` bytes at `ptr` on `peer` for `usage`, with the least ibverbs access
  /// rights the usages need (see MrUsage; librpma's mapping, iWARP rule included). A
  /// registration the device refuses with EOPNOTSUPP is retried with on-demand paging when
  /// the device supports it (Peer::odp_capable), as librpma does.
  /// With MrScope::grants the registration has the local rights only, and
  /// IBV_ACCESS_MW_BIND when its grants are windows: its remote usages are reached only
  /// through grants.
  /// Errors:
  /// - inval: empty `peer`; `ptr` null; `size` 0; `usage` empty; a grants scope with
  ///   read_dst on iWARP (a READ destination must be remotely writable there).
  /// - provider: ibv_reg_mr failed (errno in the Error; e.g. EFAULT for memory that is not
  ///   mapped, EPERM/ENOMEM beyond the locked-memory limit); ENODEV: `peer`'s device was
  ///   removed (nothing is called; docs/peer.md, "Device removal").
  /// - nomem: ibv_reg_mr failed with ENOMEM (often RLIMIT_MEMLOCK), or out of memory.
  /// Thread safety: may be called concurrently.
  static expected<MrLocal> reg(const Peer& peer, void* ptr, std::size_t size, MrUsage usage,
                               MrScope scope = MrScope::peer) noexcept;
  /// As above, for a span of bytes.
  static expected<MrLocal> reg(const Peer& peer, std::span<std::byte> memory, MrUsage usage,
                               MrScope scope = MrScope::peer) noexcept {
    return reg(peer, memory.data(), memory.size(), usage, scope);
  }

  /// An empty MrLocal, as a moved-from one (every call is inval): for tables of slots.
  MrLocal() noexcept = default;
  MrLocal(MrLocal&&) noexcept = default;
  /// Deregisters this region as the destructor does (a failure is logged under
  /// "MrLocal::operator="), then takes `other`'s.
  MrLocal& operator=(MrLocal&& other) noexcept;
  /// Revokes its grants and deregisters; a failure is logged (warning, "MrLocal::~MrLocal";
  /// use dereg() to get it).
  ~MrLocal() { dereg_logged("MrLocal::~MrLocal"); }

  /// False when moved from or deregistered.
  explicit operator bool() const noexcept { return mr_ != nullptr; }

  /// Revokes the region's grants (the grants scopes), then deregisters it (the MrLocal is
  /// empty afterwards, whatever the result): once it returns, no peer reaches the memory.
  /// Errors: inval when empty; provider: ibv_dealloc_mw (a grant's window) or ibv_dereg_mr
  /// failed (the rest is still released; the first failure is returned).
  expected<void> dereg() && noexcept;

  /// The registered memory's start. Errors: inval when empty.
  expected<void*> ptr() const noexcept {
    if (!mr_) return detail::fail(detail::moved_from("MrLocal::ptr"));
    return mr_->addr;
  }
  /// The registered size in bytes. Errors: inval when empty.
  expected<std::size_t> size() const noexcept {
    if (!mr_) return detail::fail(detail::moved_from("MrLocal::size"));
    return mr_->length;
  }
  /// The usages it was registered for. Errors: inval when empty.
  expected<MrUsage> usage() const noexcept {
    if (!mr_) return detail::fail(detail::moved_from("MrLocal::usage"));
    return usage_;
  }
  /// The registration itself (lkey, rkey), for raw verbs. Errors: inval when empty.
  expected<ibv_mr*> native() const noexcept {
    if (!mr_) return detail::fail(detail::moved_from("MrLocal::native"));
    return mr_.get();
  }

  /// The region's descriptor for the peer (librpma's rpma_mr_get_descriptor: 21 bytes,
  /// address, length, rkey and usage, little-endian).
  /// Errors: inval when empty, or registered with MrScope::grants (its own key carries no
  /// remote right: a peer gets a Grant's descriptor instead).
  expected<MrDescriptor> descriptor() const noexcept;
  /// Writes the descriptor into `out` (e.g. a private-data buffer) and returns its size.
  /// Errors: as descriptor(); inval when `out` is shorter than mr_descriptor_size (nothing
  /// is written then).
  expected<std::size_t> write_descriptor(std::span<std::byte> out) const noexcept;
  /// As above, into a char buffer (librpma programs keep descriptors in char arrays).
  expected<std::size_t> write_descriptor(std::span<char> out) const noexcept;
  /// The scope it was registered with. Errors: inval when empty.
  expected<MrScope> scope() const noexcept;
  /// How its grants are made (see GrantMode). Errors: inval when empty or registered with
  /// MrScope::peer.
  expected<GrantMode> grant_mode() const noexcept;

  /// Gives the device advice about [offset, offset + len) (ibv_advise_mr, e.g.
  /// IBV_ADVISE_MR_ADVICE_PREFETCH_WRITE for on-demand-paging memory; librpma's
  /// rpma_mr_advise).
  /// Errors:
  /// - inval: empty; the range is outside the region; len 0 or above 4 GiB; the device
  ///   refused the advice with EINVAL or EFAULT.
  /// - nosupp: the device does not support it (EOPNOTSUPP / ENOTSUP).
  /// - provider: ibv_advise_mr failed otherwise.
  expected<void> advise(std::size_t offset, std::size_t len, ibv_advise_mr_advice advice,
                        std::uint32_t flags = 0) const noexcept;

 private:
  friend struct detail::MrAccess;
  friend class Grant;
  MrLocal(std::shared_ptr<detail::PeerState> peer, detail::MemoryRegion mr, MrUsage usage,
          MrScope scope, bool by_windows, std::unique_ptr<detail::GrantRegistry> grants) noexcept
      : peer_(std::move(peer)), mr_(std::move(mr)), usage_(usage), scope_(scope),
        by_windows_(by_windows), grants_(std::move(grants)) {}

  /// Revokes the grants, then deregisters; the first failure is returned, later ones
  /// logged (FirstError).
  expected<void> release(detail::Teardown by) noexcept;
  static Error grants_only(const char* call) noexcept {
    return Error(errc::inval, 0, call,
                 "the region is registered for grants (MrScope::grants): hand out a Grant's descriptor");
  }
  void dereg_logged(const char* where) noexcept;

  std::shared_ptr<detail::PeerState> peer_;  // declared first: outlives the registration
  detail::MemoryRegion mr_;
  MrUsage usage_{};
  MrScope scope_ = MrScope::peer;
  bool by_windows_ = false;                        // its grants are windows
  std::unique_ptr<detail::GrantRegistry> grants_;  // the grants scopes only
};

/// A peer's memory region, described by the descriptor it sent (librpma's rpma_mr_remote).
/// A value type: copying it copies four numbers. A default-constructed MrRemote is empty
/// (size 0, no usage): every operation on it is inval.
/// A descriptor is untrusted input: from_descriptor validates it, and every operation
/// checks its offset and length against the size and the usage it needs before posting.
/// Thread safety: a const MrRemote may be read from several threads.
class MrRemote {
 public:
  constexpr MrRemote() noexcept = default;

  /// Parses a peer's descriptor (librpma's rpma_mr_remote_from_descriptor, stricter).
  /// Errors: inval when the descriptor is not exactly mr_descriptor_size bytes, its usage
  /// byte is 0 (or has bits MrUsage does not define), its length is 0, or address +
  /// length overflows 64 bits.
  static expected<MrRemote> from_descriptor(std::span<const std::byte> descriptor) noexcept;
  /// As above, from a char buffer (librpma programs keep descriptors in char arrays).
  static expected<MrRemote> from_descriptor(std::span<const char> descriptor) noexcept {
    return from_descriptor(std::as_bytes(descriptor));
  }

  /// False for an empty (default-constructed) MrRemote.
  explicit operator bool() const noexcept { return size_ != 0; }
  /// The region's size in bytes (0 when empty).
  std::uint64_t size() const noexcept { return size_; }
  /// The usages the peer registered it for.
  MrUsage usage() const noexcept { return usage_; }
  /// Its flush usages (librpma's rpma_mr_remote_get_flush_type): the flush_visibility and
  /// flush_persistent bits of usage().
  MrUsage flush_type() const noexcept {
    return usage_ & (MrUsage::flush_visibility | MrUsage::flush_persistent);
  }
  /// The peer's address of the region's start, and its remote key (for raw verbs).
  std::uint64_t address() const noexcept { return addr_; }
  std::uint32_t rkey() const noexcept { return rkey_; }
  /// The descriptor it was built from.
  MrDescriptor descriptor() const noexcept {
    return detail::encode_descriptor(addr_, size_, rkey_, usage_);
  }

 private:
  constexpr MrRemote(std::uint64_t addr, std::uint64_t size, std::uint32_t rkey, MrUsage usage) noexcept
      : addr_(addr), size_(size), rkey_(rkey), usage_(usage) {}

  std::uint64_t addr_ = 0;
  std::uint64_t size_ = 0;
  std::uint32_t rkey_ = 0;
  MrUsage usage_{};
};

RPMAPP_END_NAMESPACE

#if !defined(RPMAPP_SEPARATE_COMPILATION)
#  include <rpmapp/impl/mr.ipp>
#endif
