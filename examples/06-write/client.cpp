// 06-write, client: reads the descriptor of the server's grant from its first message,
// writes a text into that region with one RDMA WRITE (Conn::write) and waits for its
// completion.
#include "../common/common.hpp"
#include "../common/librpma_data.hpp"

#include <rpmapp/rpmapp.hpp>

#include <fmt/core.h>

#include <array>
#include <cstdint>

constexpr std::string_view text = "hello from the 06-write client";
constexpr std::uint64_t write_id = 0x06;  // comes back as the completion's wr_id

int main(int argc, char** argv) {
  std::string_view addr, port;
  if (!example::parse_args(argc, argv, addr, port)) return 2;

  auto peer = rpmapp::Peer::from_address(addr, rpmapp::AddressKind::remote);
  if (!peer) return example::fail(peer.error());

  // The text and its NUL, in a region registered as a write source.
  std::array<std::byte, 64> memory{};
  std::memcpy(memory.data(), text.data(), text.size());
  const std::size_t len = text.size() + 1;
  auto mr = rpmapp::MrLocal::reg(*peer, memory, rpmapp::MrUsage::write_src);
  if (!mr) return example::fail(mr.error());

  auto granted = example::connect_for_grant(*peer, addr, port);
  if (!granted) return example::fail(granted.error());
  rpmapp::Conn& conn = granted->conn;
  const auto& [data, region] = granted->server;
  fmt::print("the server's region: {} bytes, data at offset {}\n", region.size(),
             data.data_offset);

  // Bounds and usage are checked here, before anything is posted.
  if (auto ok = conn.write(region, data.data_offset, *mr, 0, len,
                            rpmapp::Completion::always, write_id);
      !ok)
    return example::fail(ok.error());
  auto cq = conn.cq();
  if (!cq) return example::fail(cq.error());
  auto wc = example::next_completion(*cq, IBV_WC_RDMA_WRITE);
  if (!wc) return example::fail(wc.error());
  if (wc->wr_id != write_id) {
    fmt::print(stderr, "error: completion for wr_id {:#x}, not {:#x}\n", wc->wr_id, write_id);
    return 1;
  }
  fmt::print("wrote \"{}\" ({} bytes with its NUL)\n", text, len);

  if (auto ok = example::disconnect_and_close(conn); !ok) return example::fail(ok.error());
  return 0;
}
