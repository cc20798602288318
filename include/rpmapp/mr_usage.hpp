// rpmapp::MrUsage: what a memory region is registered for (librpma's RPMA_MR_USAGE_*).
#pragma once

#include <rpmapp/detail/verbs_abi.hpp>
#include <rpmapp/version.hpp>

#include <infiniband/verbs.h>

#include <cstdint>

RPMAPP_BEGIN_NAMESPACE

/// Bit flags with librpma's values (they travel in the descriptor's usage byte).
/// Combine with `|`; test with `has(usage, MrUsage::...)`.
enum class MrUsage : std::uint8_t {
  read_src = 1 << 0,          ///< the peer may read it (RDMA READ source)
  read_dst = 1 << 1,          ///< a local RDMA READ may land in it
  write_src = 1 << 2,         ///< a local RDMA WRITE may send from it
  write_dst = 1 << 3,         ///< the peer may write it (RDMA WRITE / atomic write target)
  flush_visibility = 1 << 4,  ///< the peer may flush it to global visibility
  flush_persistent = 1 << 5,  ///< the peer may flush it to persistence
  send = 1 << 6,              ///< a local send may send from it
  recv = 1 << 7,              ///< a local receive may land in it
};

constexpr MrUsage operator|(MrUsage a, MrUsage b) noexcept {
  return static_cast<MrUsage>(static_cast<std::uint8_t>(a) | static_cast<std::uint8_t>(b));
}
constexpr MrUsage operator&(MrUsage a, MrUsage b) noexcept {
  return static_cast<MrUsage>(static_cast<std::uint8_t>(a) & static_cast<std::uint8_t>(b));
}
constexpr MrUsage& operator|=(MrUsage& a, MrUsage b) noexcept { return a = a | b; }
/// True when every bit of `bits` is in `usage`.
constexpr bool has(MrUsage usage, MrUsage bits) noexcept { return (usage & bits) == bits; }
/// True when `usage` has at least one bit of `bits`.
constexpr bool has_any(MrUsage usage, MrUsage bits) noexcept {
  return static_cast<std::uint8_t>(usage & bits) != 0;
}
/// The usage's byte, as in a descriptor.
constexpr std::uint8_t to_underlying(MrUsage usage) noexcept {
  return static_cast<std::uint8_t>(usage);
}

namespace detail {
/// The ibverbs access rights `usage` needs, as librpma maps them: remote readers need
/// REMOTE_READ (so do flushes: the emulated flush is a read), a READ destination needs
/// LOCAL_WRITE (and REMOTE_WRITE on iWARP, whose READ is a WRITE the other way), a WRITE
/// target REMOTE_WRITE (which requires LOCAL_WRITE), a receive LOCAL_WRITE; a send needs
/// nothing. WRITE_SRC gets LOCAL_WRITE as in librpma. On a device that flushes natively
/// (`native_flush`) a flush usage also gets IBV_ACCESS_FLUSH_GLOBAL (visibility) or
/// _PERSISTENT, as librpma 1.3 gives, and keeps REMOTE_READ (librpma 1.3 drops it) so that
/// a peer that emulates flushes (librpma 1.2, an rdma-core before 45) can still flush.
constexpr int access_for(MrUsage usage, bool iwarp, bool native_flush = false) noexcept {
  int access = 0;
  if (has_any(usage, MrUsage::read_src | MrUsage::flush_visibility | MrUsage::flush_persistent))
    access |= IBV_ACCESS_REMOTE_READ;
  if (native_flush && has(usage, MrUsage::flush_visibility)) access |= native_flush_abi::access_flush_global;
  if (native_flush && has(usage, MrUsage::flush_persistent)) access |= native_flush_abi::access_flush_persistent;
  if (has(usage, MrUsage::read_dst)) {
    access |= IBV_ACCESS_LOCAL_WRITE;
    if (iwarp) access |= IBV_ACCESS_REMOTE_WRITE;
  }
  if (has(usage, MrUsage::write_src)) access |= IBV_ACCESS_LOCAL_WRITE;
  if (has(usage, MrUsage::write_dst)) access |= IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_LOCAL_WRITE;
  if (has(usage, MrUsage::recv)) access |= IBV_ACCESS_LOCAL_WRITE;
  return access;
}

/// The usages a grant can give a peer (Grant::make): the remote ones.
inline constexpr MrUsage remote_usages =
    MrUsage::read_src | MrUsage::write_dst | MrUsage::flush_visibility | MrUsage::flush_persistent;

/// The ibverbs access rights of a region registered for grants (MrScope::grants): its own
/// key gives no remote access, so only the local rights of access_for, plus
/// IBV_ACCESS_MW_BIND. A write_dst region keeps LOCAL_WRITE, which a window that gives
/// remote write needs in its region (rxe refuses the bind otherwise). The remote rights go
/// to each grant's window (window_access_for).
constexpr int access_for_grants(MrUsage usage, bool iwarp) noexcept {
  return (access_for(usage, iwarp) & ~(IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_WRITE)) |
         IBV_ACCESS_MW_BIND;
}

/// The remote rights of a grant's window for `usage` (remote usages only): what
/// access_for gives a region for them, the flush rights too when the device flushes natively.
constexpr int window_access_for(MrUsage usage, bool native_flush) noexcept {
  return access_for(usage & remote_usages, false, native_flush) & ~IBV_ACCESS_LOCAL_WRITE;
}
}  // namespace detail

RPMAPP_END_NAMESPACE
