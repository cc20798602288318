// rpmapp::PeerConfig's definitions: the parsing of a peer's descriptor.
#pragma once

#include <rpmapp/peer_config.hpp>

#include <rpmapp/detail/errors.hpp>

#include <cstddef>
#include <span>

RPMAPP_BEGIN_NAMESPACE

RPMAPP_DECL expected<PeerConfig>
PeerConfig::from_descriptor(std::span<const std::byte> descriptor) noexcept {
  constexpr const char* call = "PeerConfig::from_descriptor";
  if (descriptor.size() != peer_config_descriptor_size)
    return detail::fail(detail::invalid(call, "a peer configuration descriptor is 1 byte, not {}",
                                        descriptor.size()));
  const auto value = std::to_integer<unsigned>(descriptor[0]);
  if (value > 1)
    return detail::fail(detail::invalid(call, "direct_write_to_pmem byte is {}, not 0 or 1", value));
  return PeerConfig{value == 1};
}

RPMAPP_END_NAMESPACE
