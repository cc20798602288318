// What the soak's server and clients agree on (tests/reliability/soak_*.cpp): the private
// data, the message, the region's slot layout and the content check.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string_view>

namespace soak {

// A client's request starts with this magic; anything else is garbage and is rejected.
inline constexpr std::string_view hello = "SOAK1 hello";
// The server's accept data: this magic, the slot's offset (u32 LE), the region's descriptor.
inline constexpr std::string_view welcome = "SOAK1 slot";
// The client's message after writing and reading back its slot: magic, length (u32 LE),
// hash (u64 LE) of what it wrote; the server answers with `good` or `bad`.
inline constexpr std::string_view check = "SOAK1 chk";
inline constexpr std::string_view good = "SOAK1 good";
inline constexpr std::string_view bad = "SOAK1 bad";

// The server's region: `slots` slots, each a data area and two message areas.
inline constexpr std::size_t slots = 32;
inline constexpr std::size_t data_size = 4096;
inline constexpr std::size_t message_size = 64;
inline constexpr std::size_t slot_stride = data_size + 2 * message_size;
inline constexpr std::size_t recv_offset(std::size_t slot) { return slot * slot_stride + data_size; }
inline constexpr std::size_t send_offset(std::size_t slot) { return recv_offset(slot) + message_size; }

inline void put_u32(std::byte* out, std::uint32_t v) {
  for (int i = 0; i < 4; ++i) out[i] = static_cast<std::byte>(v >> (8 * i));
}
inline std::uint32_t get_u32(const std::byte* in) {
  std::uint32_t v = 0;
  for (int i = 0; i < 4; ++i) v |= std::uint32_t(std::to_integer<std::uint8_t>(in[i])) << (8 * i);
  return v;
}
inline void put_u64(std::byte* out, std::uint64_t v) {
  for (int i = 0; i < 8; ++i) out[i] = static_cast<std::byte>(v >> (8 * i));
}
inline std::uint64_t get_u64(const std::byte* in) {
  std::uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v |= std::uint64_t(std::to_integer<std::uint8_t>(in[i])) << (8 * i);
  return v;
}

// FNV-1a over the bytes: the message carries it, the server recomputes it over its slot.
inline std::uint64_t hash(std::span<const std::byte> bytes) {
  std::uint64_t h = 1469598103934665603ULL;
  for (std::byte b : bytes) h = (h ^ std::to_integer<std::uint8_t>(b)) * 1099511628211ULL;
  return h;
}

inline bool starts_with(std::span<const std::byte> data, std::string_view magic) {
  return data.size() >= magic.size() && std::memcmp(data.data(), magic.data(), magic.size()) == 0;
}

}  // namespace soak
