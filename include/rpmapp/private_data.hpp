// Viewing text as private data bytes.
#pragma once

#include <rpmapp/version.hpp>

#include <cstddef>
#include <span>
#include <string_view>

RPMAPP_BEGIN_NAMESPACE

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
