// Helpers for the data-path unit tests: connected connections on the fake, registered
// buffers and peers' regions built from hand-written descriptors.
#pragma once

#include "test_util.hpp"

#include <cstring>
#include <memory>
#include <vector>

namespace test {

/// A connected Conn (its queue pair in RTS): an outgoing request, connect, ESTABLISHED.
/// `addr`: a peer's address reached through `peer`'s device (169.254.78.x: device 1).
inline Conn connected(fake::FakeProvider& fake, const Peer& peer, const ConnConfig& cfg = {},
                      std::string_view addr = "169.254.77.9") {
  auto conn = outgoing(peer, addr, cfg).connect();
  INFO((conn ? std::string() : conn.error().message()));
  REQUIRE(conn);
  fake.inject_event_on_qp(*conn->qp_num(), RDMA_CM_EVENT_ESTABLISHED);  // on its channel, shared or not
  auto ev = conn->try_next_event();
  REQUIRE(ev);
  REQUIRE(*ev == ConnEvent::established);
  REQUIRE(fake.connected(*conn->qp()));
  return std::move(*conn);
}

/// Completions poisoned with 0xAB bytes: a caller's buffer, to prove a failed call did not
/// write it.
template <std::size_t N> struct PoisonedWcs {
  ibv_wc wc[N];
  PoisonedWcs() { std::memset(wc, 0xAB, sizeof wc); }
  std::span<ibv_wc> span() { return wc; }
  bool untouched() const {
    const auto* bytes = reinterpret_cast<const unsigned char*>(wc);
    for (std::size_t i = 0; i < sizeof wc; ++i)
      if (bytes[i] != 0xAB) return false;
    return true;
  }
};

/// Memory that stays put while registered (the tests compare addresses).
struct Buffer {
  std::unique_ptr<std::byte[]> bytes;
  std::size_t size;
  explicit Buffer(std::size_t n, std::byte fill = std::byte{0x5A})
      : bytes(new std::byte[n]), size(n) {
    std::memset(bytes.get(), std::to_integer<int>(fill), n);
  }
  std::byte* data() const { return bytes.get(); }
};

inline MrLocal reg(const Peer& peer, const Buffer& buf, MrUsage usage) {
  auto mr = MrLocal::reg(peer, buf.data(), buf.size, usage);
  INFO((mr ? std::string() : mr.error().message()));
  REQUIRE(mr);
  return std::move(*mr);
}

inline constexpr MrUsage all_usages = static_cast<MrUsage>(0xff);

/// A descriptor in librpma's layout, written byte by byte (independently of the library).
inline MrDescriptor descriptor_of(std::uint64_t addr, std::uint64_t len, std::uint32_t rkey,
                                  std::uint8_t usage) {
  MrDescriptor d{};
  for (int i = 0; i < 8; ++i) d[i] = static_cast<std::byte>((addr >> (8 * i)) & 0xff);
  for (int i = 0; i < 8; ++i) d[8 + i] = static_cast<std::byte>((len >> (8 * i)) & 0xff);
  for (int i = 0; i < 4; ++i) d[16 + i] = static_cast<std::byte>((rkey >> (8 * i)) & 0xff);
  d[20] = static_cast<std::byte>(usage);
  return d;
}

inline MrRemote remote(std::uint64_t addr, std::uint64_t len, std::uint32_t rkey, MrUsage usage) {
  auto r = MrRemote::from_descriptor(descriptor_of(addr, len, rkey, to_underlying(usage)));
  INFO((r ? std::string() : r.error().message()));
  REQUIRE(r);
  return *r;
}

/// A work completion for the fake's queues (fake::FakeProvider::add_completion).
inline ibv_wc completion(std::uint64_t wr_id, ibv_wc_status status = IBV_WC_SUCCESS,
                         ibv_wc_opcode opcode = IBV_WC_RDMA_WRITE) {
  ibv_wc wc{};
  wc.wr_id = wr_id;
  wc.status = status;
  wc.opcode = opcode;
  return wc;
}

/// The fake's post log since `from` entries.
inline std::vector<fake::PostedWr> posted_since(const fake::FakeProvider& fake, std::size_t from) {
  auto all = fake.posted();
  return {all.begin() + static_cast<std::ptrdiff_t>(from), all.end()};
}

inline std::uint64_t addr_of(const void* p) { return reinterpret_cast<std::uintptr_t>(p); }

}  // namespace test
