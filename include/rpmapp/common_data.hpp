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
#include <cstring>
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
                                       std::optional<PeerConfig> config = std::nullopt) noexcept {
    auto region = mr.descriptor();
    if (!region) return detail::named("CommonData::describe", expected<CommonData>(detail::fail(region.error())));
    return describe(*region, data_offset, config);
  }

  /// As above, for a region's descriptor already made, e.g. a Grant's (Grant::descriptor(),
  /// sent in a message once the connection is established). Cannot fail.
  static CommonData describe(const MrDescriptor& region, std::uint16_t data_offset = 0,
                             std::optional<PeerConfig> config = std::nullopt) noexcept {
    CommonData data;
    data.data_offset = data_offset;
    std::memcpy(data.descriptors.data(), region.data(), region.size());
    data.mr_desc_size = static_cast<std::uint8_t>(region.size());
    if (config) {
      const auto pcfg = config->descriptor();
      std::memcpy(data.descriptors.data() + region.size(), pcfg.data(), pcfg.size());
      data.pcfg_desc_size = static_cast<std::uint8_t>(pcfg.size());
    }
    return data;
  }

  /// Reads one from a peer's private data (untrusted bytes; rdma_cm pads private data with
  /// zeros, so it may be longer than 28 bytes). Errors: inval when `private_data` is shorter
  /// than 28 bytes, or its descriptor sizes add up to more than `descriptors` holds.
  static expected<CommonData> from_private_data(std::span<const std::byte> private_data) noexcept {
    constexpr const char* call = "CommonData::from_private_data";
    if (private_data.size() < sizeof(CommonData))
      return detail::fail(detail::invalid(call, "private data of {} bytes is shorter than librpma's {}-byte common_data",
                                          private_data.size(), sizeof(CommonData)));
    CommonData parsed;
    std::memcpy(&parsed, private_data.data(), sizeof parsed);
    if (auto ok = parsed.check_sizes(call); !ok) return detail::fail(ok.error());
    return parsed;
  }

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
  expected<std::optional<PeerConfig>> peer_config() const noexcept {
    if (auto ok = check_sizes("CommonData::peer_config"); !ok) return detail::fail(ok.error());
    if (pcfg_desc_size == 0) return std::optional<PeerConfig>();
    auto config = PeerConfig::from_descriptor(
        std::span<const std::byte>(descriptors).subspan(mr_desc_size, pcfg_desc_size));
    if (!config) return detail::fail(config.error());
    return std::optional<PeerConfig>(*config);
  }

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
