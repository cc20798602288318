// 07-atomic-write-and-flush, server: grants its client writes and flushes of a region
// (rpmapp::Grant, this connection only), and tells it in the grant's message whether its
// memory takes writes directly to persistent memory (PeerConfig). After the client has
// gone it prints the payload and the marker.
#include "../common/common.hpp"
#include "../common/librpma_data.hpp"

#include <rpmapp/rpmapp.hpp>

#include <fmt/core.h>

#include <array>
#include <cstdint>

constexpr std::string_view expected_payload = "a payload from the 07-atomic-write-and-flush client";
constexpr std::string_view expected_marker = "ready";
// The region's layout: the 8-byte marker at offset 0 (atomic writes need 8-byte
// alignment), the payload from offset 8 (sent as common_data::data_offset).
constexpr std::size_t marker_offset = 0;
constexpr std::uint16_t payload_offset = 8;

int main(int argc, char** argv) {
  std::string_view addr, port;
  if (!example::parse_args(argc, argv, addr, port)) return 2;

  auto peer = rpmapp::Peer::from_address(addr, rpmapp::AddressKind::local);
  if (!peer) return example::fail(peer.error());

  // Ordinary DRAM, so writes do not reach persistent memory directly: the client may only
  // flush for visibility. A server on PMem with DDIO off would say true here and register
  // for flush_persistent too (a device that flushes natively refuses that for DRAM).
  const rpmapp::PeerConfig config{.direct_write_to_pmem = false};
  alignas(8) std::array<std::byte, 4096> memory{};
  constexpr auto usage = rpmapp::MrUsage::write_dst | rpmapp::MrUsage::flush_visibility;
  auto mr = rpmapp::MrLocal::reg(*peer, memory, usage, rpmapp::MrScope::grants);
  if (!mr) return example::fail(mr.error());

  auto endpoint = example::listen_and_print(*peer, addr, port);
  if (!endpoint) return example::fail(endpoint.error());

  auto conn = example::accept_next(*endpoint);
  if (!conn) return example::fail(conn.error());
  auto grant = rpmapp::Grant::make(*conn, *mr, 0, memory.size(), usage);
  if (!grant) return example::fail(grant.error());
  if (auto ok = example::send_grant(*peer, *conn, *mr, *grant, payload_offset, config); !ok)
    return example::fail(ok.error());
  fmt::print("connection established, direct_write_to_pmem {}\n", config.direct_write_to_pmem);

  if (auto ok = example::wait_closed_by_client(*conn); !ok) return example::fail(ok.error());

  const std::string_view marker = rpmapp::as_text(std::span(memory).subspan(marker_offset, 8));
  const std::string_view payload = rpmapp::as_text(std::span(memory).subspan(payload_offset));
  fmt::print("marker: \"{}\"\n", marker);
  fmt::print("payload: \"{}\"\n", payload);
  if (marker != expected_marker || payload != expected_payload) {
    fmt::print(stderr, "error: expected marker \"{}\" and payload \"{}\"\n", expected_marker,
               expected_payload);
    return 1;
  }

  if (auto ok = example::close_server(std::move(*conn), std::move(*mr), std::move(*endpoint)); !ok)
    return example::fail(ok.error());
  return 0;
}
