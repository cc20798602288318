// rpmapp::CommonData's definitions: describing a region, and reading a peer's private data.
#pragma once

#include <rpmapp/common_data.hpp>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <optional>
#include <span>

RPMAPP_BEGIN_NAMESPACE

RPMAPP_DECL expected<CommonData> CommonData::describe(const MrLocal& mr, std::uint16_t data_offset,
                                                      std::optional<PeerConfig> config) noexcept {
  auto region = mr.descriptor();
  if (!region) return detail::named("CommonData::describe", expected<CommonData>(detail::fail(region.error())));
  return describe(*region, data_offset, config);
}

RPMAPP_DECL CommonData CommonData::describe(const MrDescriptor& region, std::uint16_t data_offset,
                                            std::optional<PeerConfig> config) noexcept {
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

RPMAPP_DECL expected<CommonData>
CommonData::from_private_data(std::span<const std::byte> private_data) noexcept {
  constexpr const char* call = "CommonData::from_private_data";
  if (private_data.size() < sizeof(CommonData))
    return detail::fail(detail::invalid(call, "private data of {} bytes is shorter than librpma's {}-byte common_data",
                                        private_data.size(), sizeof(CommonData)));
  CommonData parsed;
  std::memcpy(&parsed, private_data.data(), sizeof parsed);
  if (auto ok = parsed.check_sizes(call); !ok) return detail::fail(ok.error());
  return parsed;
}

RPMAPP_DECL expected<std::optional<PeerConfig>> CommonData::peer_config() const noexcept {
  if (auto ok = check_sizes("CommonData::peer_config"); !ok) return detail::fail(ok.error());
  if (pcfg_desc_size == 0) return std::optional<PeerConfig>();
  auto config = PeerConfig::from_descriptor(
      std::span<const std::byte>(descriptors).subspan(mr_desc_size, pcfg_desc_size));
  if (!config) return detail::fail(config.error());
  return std::optional<PeerConfig>(*config);
}

RPMAPP_END_NAMESPACE
