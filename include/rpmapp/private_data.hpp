// Private data: the protocol's size limits, and viewing text as bytes.
#pragma once

#include <rpmapp/version.hpp>

#include <cstddef>
#include <span>
#include <string_view>

RPMAPP_BEGIN_NAMESPACE

/// Private data limits of RDMA_PS_TCP on InfiniBand and RoCE, checked before anything is
/// sent. They are the IB CM's private data sizes: REQ 92 bytes less rdma_cm's 36-byte
/// header (56), REP 196 and REJ 148 (rdma_cm adds no header to either; the kernel refuses
/// a longer reject with EINVAL). rdma_cm delivers private data padded with zeros to these
/// sizes.
inline constexpr std::size_t max_connect_private_data = 56;
inline constexpr std::size_t max_accept_private_data = 196;
inline constexpr std::size_t max_reject_private_data = 148;

/// The bytes of `text` (without a terminating NUL), for connect/accept/reject private data.
inline std::span<const std::byte> as_bytes(std::string_view text) noexcept {
  return {reinterpret_cast<const std::byte*>(text.data()), text.size()};
}

/// The bytes of `data` as text, up to the first NUL (rdma_cm zero-pads private data).
inline std::string_view as_text(std::span<const std::byte> data) noexcept {
  std::string_view text(reinterpret_cast<const char*>(data.data()), data.size());
  return text.substr(0, text.find('\0'));
}

RPMAPP_END_NAMESPACE
