// Private data: the protocol's size limits, and viewing text (with or without its NUL) as bytes.
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

/// Private data limit of iWARP for a connect, an accept and a reject alike. MPA v2 puts a
/// 4-byte IRD/ORD block in front of the data, and siw (its source in Linux 6.1 and 6.12)
/// counts both in one byte: 255 - 4. Measured on siw: 251 bytes arrive; 252 end the
/// connection (lost) or never reach the listener. iWARP delivers private data at its exact length, unpadded.
inline constexpr std::size_t max_iwarp_private_data = 251;

/// The private data limits of one transport, in bytes.
struct PrivateDataLimits {
  std::size_t connect;
  std::size_t accept;
  std::size_t reject;
  /// Whether the transport pads what it delivers with zeros to these sizes (IB CM does,
  /// iWARP does not): a receiver must not rely on the length either way.
  bool padded;
  friend constexpr bool operator==(const PrivateDataLimits&, const PrivateDataLimits&) = default;
};

/// The limits of IB and RoCE (iwarp false) or of iWARP (Peer::private_data_limits gives a
/// device's). Thread safety: pure.
constexpr PrivateDataLimits private_data_limits(bool iwarp) noexcept {
  if (iwarp) return {max_iwarp_private_data, max_iwarp_private_data, max_iwarp_private_data, false};
  return {max_connect_private_data, max_accept_private_data, max_reject_private_data, true};
}

/// The bytes of `text` (without a terminating NUL), for connect/accept/reject private data.
inline std::span<const std::byte> as_bytes(std::string_view text) noexcept {
  return {reinterpret_cast<const std::byte*>(text.data()), text.size()};
}

/// The bytes of the C string `text` including its terminating NUL (strlen(text) + 1 bytes;
/// empty for a null pointer), for connect/accept/reject private data read by a peer that
/// expects a C string, as librpma programs do (`printf("%s", pdata.ptr)`). Without the NUL
/// such a peer still finds one in rdma_cm's zero padding, except when the text fills the
/// whole limit (the limits above count the NUL) or on a transport that does not pad
/// (iWARP).
/// Thread safety: reads `text` only.
inline std::span<const std::byte> as_bytes_with_nul(const char* text) noexcept {
  if (text == nullptr) return {};
  return {reinterpret_cast<const std::byte*>(text), std::char_traits<char>::length(text) + 1};
}

/// The bytes of `data` as text, up to the first NUL (rdma_cm zero-pads private data).
inline std::string_view as_text(std::span<const std::byte> data) noexcept {
  std::string_view text(reinterpret_cast<const char*>(data.data()), data.size());
  return text.substr(0, text.find('\0'));
}

RPMAPP_END_NAMESPACE
