// rpmapp::PeerConfig: what a peer declares about its memory (librpma's rpma_peer_cfg), and
// its 1-byte descriptor.
#pragma once

#include <rpmapp/error.hpp>

#include <array>
#include <cstddef>
#include <span>

RPMAPP_BEGIN_NAMESPACE

/// Size of a peer configuration's descriptor (librpma's: one byte, direct_write_to_pmem).
inline constexpr std::size_t peer_config_descriptor_size = 1;

/// A peer's configuration: whether writes reach its persistent memory directly (DDIO off),
/// so that a persistent flush is meaningful. The server sends its descriptor; the client
/// applies it with Conn::apply_remote_peer_config. A plain value type.
/// Thread safety: a const PeerConfig may be read from several threads.
struct PeerConfig {
  bool direct_write_to_pmem = false;

  /// The 1-byte descriptor (0 or 1), as librpma's rpma_peer_cfg_get_descriptor.
  std::array<std::byte, peer_config_descriptor_size> descriptor() const noexcept {
    return {static_cast<std::byte>(direct_write_to_pmem ? 1 : 0)};
  }

  /// Parses a peer's descriptor. Stricter than librpma (which takes any non-empty buffer and
  /// any byte value): it must be exactly 1 byte, 0 or 1.
  /// Errors: inval otherwise.
  static expected<PeerConfig> from_descriptor(std::span<const std::byte> descriptor) noexcept;

  friend bool operator==(const PeerConfig&, const PeerConfig&) = default;
};

RPMAPP_END_NAMESPACE

#if !defined(RPMAPP_SEPARATE_COMPILATION)
#  include <rpmapp/impl/peer_config.ipp>
#endif
