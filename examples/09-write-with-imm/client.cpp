// 09-write-with-imm, client: writes a text into the server's region with immediate data
// (Conn::write_with_imm), which also completes a receive on the server. A device without
// immediate data (iWARP: Peer::capabilities) writes, then sends the value and the length in
// a message, which completes that receive once the write has landed.
#include "../common/common.hpp"
#include "../common/librpma_data.hpp"
#include "note.hpp"

#include <rpmapp/rpmapp.hpp>

#include <fmt/core.h>

#include <array>
#include <cstdint>
#include <cstring>

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
  auto mr = rpmapp::MrLocal::reg(*peer, memory, rpmapp::MrUsage::write_src | rpmapp::MrUsage::send);
  if (!mr) return example::fail(mr.error());
  auto caps = peer->capabilities();
  if (!caps) return example::fail(caps.error());

  auto conn = example::connect_with_retry(*peer, addr, port, {});
  if (!conn) return example::fail(conn.error());
  auto server = example::server_region(*conn);
  if (!server) return example::fail(server.error());
  const auto& [data, region] = *server;

  auto cq = conn->cq();
  if (!cq) return example::fail(cq.error());
  if (caps->immediate_data) {
    if (auto ok = conn->write_with_imm(region, data.data_offset, *mr, 0, len, imm); !ok)
      return example::fail(ok.error());
    if (auto wc = example::next_completion(*cq, IBV_WC_RDMA_WRITE); !wc) return example::fail(wc.error());
    fmt::print("wrote \"{}\" ({} bytes with its NUL) with immediate data {:#010x}\n", text, len, imm);
  } else {
    // The write completes only on error; the message after it completes the server's receive.
    constexpr std::size_t note_offset = 48;
    const ImmNote note{imm, static_cast<std::uint32_t>(len)};
    std::memcpy(memory.data() + note_offset, &note, sizeof note);
    if (auto ok = conn->write(region, data.data_offset, *mr, 0, len, rpmapp::Completion::on_error); !ok)
      return example::fail(ok.error());
    if (auto ok = conn->send(*mr, note_offset, sizeof note); !ok) return example::fail(ok.error());
    if (auto wc = example::next_completion(*cq, IBV_WC_SEND); !wc) return example::fail(wc.error());
    fmt::print("wrote \"{}\" ({} bytes with its NUL), then sent {:#010x} in a message ({} has no immediate "
               "data)\n", text, len, imm, *peer->device_name());
  }

  if (auto ok = example::disconnect_and_close(*conn); !ok) return example::fail(ok.error());
  return 0;
}
