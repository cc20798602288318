// 07-atomic-write-and-flush, client: takes the server's grant from its first message,
// writes a payload into the granted region and flushes it, then publishes it with an
// 8-byte atomic write of a "ready" marker, flushed too. Only the last flush asks for a
// completion: the others report only a failure.
#include "../common/common.hpp"
#include "../common/librpma_data.hpp"

#include <rpmapp/rpmapp.hpp>

#include <fmt/core.h>

#include <array>
#include <cstdint>

constexpr std::string_view payload = "a payload from the 07-atomic-write-and-flush client";
constexpr std::size_t marker_offset = 0;  // the server's layout: marker first, 8-byte aligned
// Work request ids, which come back in the completions (a failed one names its step).
enum : std::uint64_t { write_id = 1, payload_flush_id, marker_write_id, marker_flush_id };

int main(int argc, char** argv) {
  std::string_view addr, port;
  if (!example::parse_args(argc, argv, addr, port)) return 2;

  auto peer = rpmapp::Peer::from_address(addr, rpmapp::AddressKind::remote);
  if (!peer) return example::fail(peer.error());
  auto native = peer->native_atomic_write();
  if (!native) return example::fail(native.error());

  std::array<std::byte, 64> memory{};
  std::memcpy(memory.data(), payload.data(), payload.size());
  const std::size_t len = payload.size() + 1;
  auto mr = rpmapp::MrLocal::reg(*peer, memory, rpmapp::MrUsage::write_src);
  if (!mr) return example::fail(mr.error());

  auto granted = example::connect_for_grant(*peer, addr, port);
  if (!granted) return example::fail(granted.error());
  rpmapp::Conn& conn = granted->conn;
  const auto& [data, region] = granted->server;
  auto config = data.peer_config();
  if (!config) return example::fail(config.error());
  if (!*config) {
    fmt::print(stderr, "error: the server sent no peer configuration\n");
    return 1;
  }
  const rpmapp::PeerConfig& server_config = **config;

  // A persistent flush needs both the server's word (direct_write_to_pmem) and a region
  // registered for it; without the first the library refuses it before posting anything.
  if (auto ok = conn.apply_remote_peer_config(server_config); !ok) return example::fail(ok.error());
  const bool persistent = server_config.direct_write_to_pmem &&
                          rpmapp::has(region.flush_type(), rpmapp::MrUsage::flush_persistent);
  const auto type = persistent ? rpmapp::FlushType::persistent : rpmapp::FlushType::visibility;
  fmt::print("the server's direct_write_to_pmem is {}: flushing for {}\n",
             server_config.direct_write_to_pmem, persistent ? "persistence" : "visibility");
  if (!persistent) {
    auto refused = conn.flush(region, data.data_offset, len, rpmapp::FlushType::persistent);
    if (refused || refused.error() != rpmapp::errc::nosupp) {
      fmt::print(stderr, "error: a persistent flush was not refused\n");
      return 1;
    }
    fmt::print("a persistent flush is refused before posting (nosupp)\n");
  }

  constexpr auto on_error = rpmapp::Completion::on_error;
  if (auto ok = conn.write(region, data.data_offset, *mr, 0, len, on_error, write_id); !ok)
    return example::fail(ok.error());
  if (auto ok = conn.flush(region, data.data_offset, len, type, on_error, payload_flush_id); !ok)
    return example::fail(ok.error());
  // The marker is copied when posted: a local array will do (the emulated atomic write is
  // an inline write, the native one carries the value in the work request).
  std::array<std::byte, 8> marker{};
  std::memcpy(marker.data(), "ready", 5);
  if (auto ok = conn.atomic_write(region, marker_offset, marker, on_error, marker_write_id); !ok)
    return example::fail(ok.error());
  if (auto ok = conn.flush(region, marker_offset, marker.size(), type,
                            rpmapp::Completion::always, marker_flush_id);
      !ok)
    return example::fail(ok.error());

  // The flush completes after the writes before it: an RDMA FLUSH where the Peer flushes
  // natively (librpma 1.3's way), else an RDMA READ (librpma 1.2's emulation). A failure of
  // an earlier step would come first, with its own id.
  auto flushed = example::flush_completion(*peer);
  if (!flushed) return example::fail(flushed.error());
  auto cq = conn.cq();
  if (!cq) return example::fail(cq.error());
  auto wc = example::next_completion(*cq, *flushed);
  if (!wc) return example::fail(wc.error());
  if (wc->wr_id != marker_flush_id) {
    fmt::print(stderr, "error: completion for wr_id {}, not the marker's flush\n", wc->wr_id);
    return 1;
  }
  fmt::print("wrote and flushed \"{}\" ({} bytes with its NUL)\n", payload, len);
  fmt::print("atomic write ({}) of the marker \"ready\" flushed ({})\n", *native ? "native" : "emulated",
             *flushed == IBV_WC_RDMA_READ ? "emulated" : "native");

  if (auto ok = example::disconnect_and_close(conn); !ok) return example::fail(ok.error());
  return 0;
}
