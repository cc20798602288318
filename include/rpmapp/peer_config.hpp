// rpmapp::PeerConfig: what a peer declares about its memory (librpma's rpma_peer_cfg), and
// its 1-byte descriptor.
#pragma once

#include <rpmapp/detail/errors.hpp>
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
  static expected<PeerConfig> from_descriptor(std::span<const std::byte> descriptor) noexcept {
    constexpr const char* call = "PeerConfig::from_descriptor";
    if (descriptor.size() != peer_config_descriptor_size)
      return detail::fail(detail::invalid(call, "a peer configuration descriptor is 1 byte, not {}",
                                          descriptor.size()));
    const auto value = std::to_integer<unsigned>(descriptor[0]);
    if (value > 1)
      return detail::fail(detail::invalid(call, "direct_write_to_pmem byte is {}, not 0 or 1", value));
    return PeerConfig{value == 1};
  }

  friend bool operator==(const PeerConfig&, const PeerConfig&) = default;
};

RPMAPP_END_NAMESPACE
