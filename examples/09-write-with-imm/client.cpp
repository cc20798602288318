// 09-write-with-imm, client: writes a text into the server's region with immediate data
// (Conn::write_with_imm), which also completes a receive on the server.
#include "../common/common.hpp"
#include "../common/librpma_data.hpp"

#include <rpmapp/rpmapp.hpp>

#include <fmt/core.h>

#include <array>
#include <cstdint>

constexpr std::string_view text = "hello from the 09-write-with-imm client";
constexpr std::uint32_t imm = 0x12345678;  // the server reads it in host order too

int main(int argc, char** argv) {
  std::string_view addr, port;
  if (!example::parse_args(argc, argv, addr, port)) return 2;

  auto peer = rpmapp::Peer::from_address(addr, rpmapp::AddressKind::remote);
  if (!peer) return example::fail(peer.error());
  std::array<std::byte, 64> memory{};
  std::memcpy(memory.data(), text.data(), text.size());
  const std::size_t len = text.size() + 1;
  auto mr = rpmapp::MrLocal::reg(*peer, memory, rpmapp::MrUsage::write_src);
  if (!mr) return example::fail(mr.error());

  auto conn = example::connect_with_retry(*peer, addr, port, {});
  if (!conn) return example::fail(conn.error());
  auto server = example::server_region(*conn);
  if (!server) return example::fail(server.error());
  const auto& [data, region] = *server;

  if (auto ok = conn->write_with_imm(region, data.data_offset, *mr, 0, len, imm); !ok)
    return example::fail(ok.error());
  auto cq = conn->cq();
  if (!cq) return example::fail(cq.error());
  if (auto wc = example::next_completion(*cq, IBV_WC_RDMA_WRITE); !wc) return example::fail(wc.error());
  fmt::print("wrote \"{}\" ({} bytes with its NUL) with immediate data {:#010x}\n", text, len, imm);

  if (auto ok = example::disconnect_and_close(*conn); !ok) return example::fail(ok.error());
  return 0;
}
