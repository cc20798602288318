// The private data librpma's examples exchange (struct common_data, examples/common/
// common-conn.h of librpma 1.2), so that the examples here talk to librpma's programs:
// a server describes its memory region (and optionally its peer configuration) in it.
#pragma once

#include <rpmapp/rpmapp.hpp>

#include <fmt/core.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <optional>
#include <span>

namespace example {

/// librpma's `struct common_data`, byte for byte (host byte order, as librpma sends it):
/// `uint16_t data_offset; uint8_t mr_desc_size; uint8_t pcfg_desc_size;
/// char descriptors[24];`, 28 bytes. `descriptors` holds the memory region's descriptor
/// (mr_desc_size bytes), then the peer configuration's (pcfg_desc_size bytes).
struct CommonData {
  std::uint16_t data_offset = 0;   ///< where the user data starts in the region
  std::uint8_t mr_desc_size = 0;   ///< bytes of the region's descriptor in `descriptors`
  std::uint8_t pcfg_desc_size = 0; ///< bytes of the peer configuration's, after it
  std::array<std::byte, 24> descriptors{};
};
static_assert(sizeof(CommonData) == 28);
static_assert(offsetof(CommonData, mr_desc_size) == 2 && offsetof(CommonData, pcfg_desc_size) == 3 &&
              offsetof(CommonData, descriptors) == 4);

/// The CommonData a server sends for `mr`: `data_offset`, and in `descriptors` the region's
/// descriptor, then, when given, `config`'s (pcfg_desc_size 1). Errors: as MrLocal::write_descriptor (inval when `mr` is
/// empty).
inline rpmapp::expected<CommonData> common_data_for(const rpmapp::MrLocal& mr,
                                                    std::uint16_t data_offset = 0,
                                                    std::optional<rpmapp::PeerConfig> config = {}) {
  CommonData data;
  data.data_offset = data_offset;
  auto size = mr.write_descriptor(data.descriptors);
  if (!size) return rpmapp::unexpected(size.error());
  data.mr_desc_size = static_cast<std::uint8_t>(*size);
  if (config) {
    const auto pcfg = config->descriptor();
    std::memcpy(data.descriptors.data() + *size, pcfg.data(), pcfg.size());
    data.pcfg_desc_size = static_cast<std::uint8_t>(pcfg.size());
  }
  return data;
}

/// Its bytes, for ConnReq::connect.
inline std::span<const std::byte> bytes_of(const CommonData& data) noexcept {
  return {reinterpret_cast<const std::byte*>(&data), sizeof data};
}

/// Reads a CommonData from the peer's private data (zero-padded by rdma_cm, so longer
/// than 28 bytes) and checks that its descriptor sizes fit in `descriptors`.
/// Errors: inval when `data` is shorter than 28 bytes or the sizes add up to more than 24.
inline rpmapp::expected<CommonData> parse_common_data(std::span<const std::byte> data) {
  constexpr const char* call = "parse_common_data";
  if (data.size() < sizeof(CommonData))
    return rpmapp::unexpected(rpmapp::Error(
        rpmapp::errc::inval, 0, call,
        fmt::format("private data of {} bytes is shorter than librpma's {}-byte common_data",
                    data.size(), sizeof(CommonData))));
  CommonData parsed;
  std::memcpy(&parsed, data.data(), sizeof parsed);
  if (parsed.mr_desc_size + parsed.pcfg_desc_size > parsed.descriptors.size())
    return rpmapp::unexpected(rpmapp::Error(
        rpmapp::errc::inval, 0, call,
        fmt::format("descriptor sizes {} + {} exceed the {} bytes of common_data's descriptors",
                    parsed.mr_desc_size, parsed.pcfg_desc_size, parsed.descriptors.size())));
  return parsed;
}

/// The peer's memory region described by `data` (its first mr_desc_size bytes of
/// descriptors). Errors: inval from MrRemote::from_descriptor (e.g. a size other than
/// rpmapp::mr_descriptor_size, an empty region, no usage).
inline rpmapp::expected<rpmapp::MrRemote> remote_region(const CommonData& data) {
  if (data.mr_desc_size > data.descriptors.size())
    return rpmapp::unexpected(rpmapp::Error(
        rpmapp::errc::inval, 0, "remote_region",
        fmt::format("descriptor size {} exceeds the {} bytes of common_data's descriptors",
                    data.mr_desc_size, data.descriptors.size())));
  return rpmapp::MrRemote::from_descriptor(
      std::span<const std::byte>(data.descriptors).first(data.mr_desc_size));
}

/// The peer configuration described by `data` (pcfg_desc_size bytes after the region's
/// descriptor); nullopt when it carries none. Errors: inval from
/// PeerConfig::from_descriptor, or when the sizes exceed `descriptors`.
inline rpmapp::expected<std::optional<rpmapp::PeerConfig>> remote_peer_config(const CommonData& data) {
  if (data.pcfg_desc_size == 0) return std::nullopt;
  if (data.mr_desc_size + data.pcfg_desc_size > data.descriptors.size())
    return rpmapp::unexpected(rpmapp::Error(
        rpmapp::errc::inval, 0, "remote_peer_config",
        fmt::format("descriptor sizes {} + {} exceed the {} bytes of common_data's descriptors",
                    data.mr_desc_size, data.pcfg_desc_size, data.descriptors.size())));
  auto config = rpmapp::PeerConfig::from_descriptor(
      std::span<const std::byte>(data.descriptors).subspan(data.mr_desc_size, data.pcfg_desc_size));
  if (!config) return rpmapp::unexpected(config.error());
  return *config;
}

/// What a client learns from the server's private data: the common_data and the region
/// it describes.
struct ServerRegion {
  CommonData data;
  rpmapp::MrRemote region;
};

/// Reads the common_data the server sent when accepting `conn` (untrusted bytes: parsed
/// and checked) and the region it describes. Errors: as Conn::private_data,
/// parse_common_data and remote_region.
inline rpmapp::expected<ServerRegion> server_region(const rpmapp::Conn& conn) {
  auto received = conn.private_data();
  if (!received) return rpmapp::unexpected(received.error());
  auto data = parse_common_data(*received);
  if (!data) return rpmapp::unexpected(data.error());
  auto region = remote_region(*data);
  if (!region) return rpmapp::unexpected(region.error());
  return ServerRegion{*data, *region};
}

}  // namespace example
