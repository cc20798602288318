// rpmapp::CommonData: the private data librpma's examples exchange (their struct
// common_data), so that a program ported from them, or talking to them, need not declare
// it again: a memory region's descriptor and optionally a peer configuration's, with sizes.
#pragma once

#include <rpmapp/detail/errors.hpp>
#include <rpmapp/error.hpp>
#include <rpmapp/mr.hpp>
#include <rpmapp/peer_config.hpp>

#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>

RPMAPP_BEGIN_NAMESPACE

/// librpma's examples' `struct common_data`, byte for byte (host byte order, as they send
/// it): `uint16_t data_offset; uint8_t mr_desc_size; uint8_t pcfg_desc_size; char
/// descriptors[24];`, 28 bytes. `descriptors` holds a memory region's descriptor
/// (mr_desc_size bytes), then a peer configuration's (pcfg_desc_size bytes).
/// Thread safety: a value type; a const CommonData may be read from several threads.
struct CommonData {
  std::uint16_t data_offset = 0;    ///< where the user's data starts in the region
  std::uint8_t mr_desc_size = 0;    ///< bytes of the region's descriptor in `descriptors`
  std::uint8_t pcfg_desc_size = 0;  ///< bytes of the peer configuration's, after it
  std::array<std::byte, 24> descriptors{};

  /// What a server sends for `mr`: `data_offset`, and in `descriptors` the region's
  /// descriptor, then `config`'s when given (as librpma's examples do).
  /// Errors: inval when `mr` is empty.
  static expected<CommonData> describe(const MrLocal& mr, std::uint16_t data_offset = 0,
                                       std::optional<PeerConfig> config = std::nullopt) noexcept;

  /// As above, for a region's descriptor already made, e.g. a Grant's (Grant::descriptor(),
  /// sent in a message once the connection is established). Cannot fail.
  static CommonData describe(const MrDescriptor& region, std::uint16_t data_offset = 0,
                             std::optional<PeerConfig> config = std::nullopt) noexcept;

  /// Reads one from a peer's private data (untrusted bytes; rdma_cm pads private data with
  /// zeros, so it may be longer than 28 bytes). Errors: inval when `private_data` is shorter
  /// than 28 bytes, or its descriptor sizes add up to more than `descriptors` holds.
  static expected<CommonData> from_private_data(std::span<const std::byte> private_data) noexcept;

  /// Its 28 bytes, for ConnReq::connect (and librpma's rpma_conn_req_connect).
  std::span<const std::byte> bytes() const noexcept {
    return {reinterpret_cast<const std::byte*>(this), sizeof *this};
  }

  /// The region its first mr_desc_size bytes of `descriptors` describe.
  /// Errors: inval as MrRemote::from_descriptor (a size other than mr_descriptor_size, an
  /// empty region, no usage), or when the sizes exceed `descriptors`.
  expected<MrRemote> region() const noexcept {
    if (auto ok = check_sizes("CommonData::region"); !ok) return detail::fail(ok.error());
    return MrRemote::from_descriptor(std::span<const std::byte>(descriptors).first(mr_desc_size));
  }

  /// The peer configuration after the region's descriptor; nullopt when it has none
  /// (pcfg_desc_size 0). Errors: inval as PeerConfig::from_descriptor, or when the sizes
  /// exceed `descriptors`.
  expected<std::optional<PeerConfig>> peer_config() const noexcept;

 private:
  expected<void> check_sizes(const char* call) const noexcept {
    if (std::size_t{mr_desc_size} + pcfg_desc_size > descriptors.size())
      return detail::fail(detail::invalid(call, "descriptor sizes {} + {} exceed the {} bytes of common_data's descriptors",
                                          unsigned{mr_desc_size}, unsigned{pcfg_desc_size}, descriptors.size()));
    return {};
  }
};
static_assert(sizeof(CommonData) == 28);
static_assert(mr_descriptor_size + peer_config_descriptor_size <= sizeof(CommonData::descriptors));
static_assert(offsetof(CommonData, mr_desc_size) == 2 && offsetof(CommonData, pcfg_desc_size) == 3 &&
              offsetof(CommonData, descriptors) == 4);

RPMAPP_END_NAMESPACE

#if !defined(RPMAPP_SEPARATE_COMPILATION)
#  include <rpmapp/impl/common_data.ipp>
#endif
