// 09-write-with-imm, server: exposes a region for writing and posts a receive before
// accepting. The client's write with immediate data consumes that receive: its completion
// tells the server that the data has arrived, how long it is and the immediate value.
// A device without immediate data (iWARP: Peer::capabilities) gets the value and the length
// in a message the client sends after its write; the connection's ordering delivers it
// once the write has landed.
#include "../common/common.hpp"
#include "../common/librpma_data.hpp"
#include "note.hpp"

#include <rpmapp/rpmapp.hpp>

#include <fmt/core.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstring>

constexpr std::string_view expected_text = "hello from the 09-write-with-imm client";
constexpr std::uint32_t expected_imm = 0x12345678;
constexpr std::size_t note_offset = 512;  // where the message lands without immediate data

int main(int argc, char** argv) {
  std::string_view addr, port;
  if (!example::parse_args(argc, argv, addr, port)) return 2;

  auto peer = rpmapp::Peer::from_address(addr, rpmapp::AddressKind::local);
  if (!peer) return example::fail(peer.error());
  // write_dst for the client's write; recv for the (empty) receive its immediate data
  // completes: the written bytes go to the write's address, not to the receive.
  std::array<std::byte, 1024> memory{};
  auto mr = rpmapp::MrLocal::reg(*peer, memory, rpmapp::MrUsage::write_dst | rpmapp::MrUsage::recv);
  if (!mr) return example::fail(mr.error());
  auto data = rpmapp::CommonData::describe(*mr);
  if (!data) return example::fail(data.error());

  auto caps = peer->capabilities();
  if (!caps) return example::fail(caps.error());
  const bool with_imm = caps->immediate_data;

  auto endpoint = example::listen_and_print(*peer, addr, port);
  if (!endpoint) return example::fail(endpoint.error());

  // The receive the immediate data (or the client's note) completes is posted on the
  // request, before accepting.
  auto post_recv = [&](rpmapp::ConnReq& req) {
    return with_imm ? req.recv(*mr, 0, 0) : req.recv(*mr, note_offset, sizeof(ImmNote));
  };
  auto conn = example::accept_next(*endpoint, data->bytes(), post_recv);
  if (!conn) return example::fail(conn.error());

  auto cq = conn->cq();
  if (!cq) return example::fail(cq.error());
  auto wc = example::next_completion(*cq, with_imm ? IBV_WC_RECV_RDMA_WITH_IMM : IBV_WC_RECV);
  if (!wc) return example::fail(wc.error());
  std::uint32_t imm = 0, written = 0;
  if (with_imm) {
    if ((wc->wc_flags & IBV_WC_WITH_IMM) == 0) {
      fmt::print(stderr, "error: the completion carries no immediate data\n");
      return 1;
    }
    imm = rpmapp::immediate(*wc);
    written = wc->byte_len;
  } else {
    ImmNote note{};
    if (wc->byte_len != sizeof note) {
      fmt::print(stderr, "error: the client's note is {} bytes, not {}\n", wc->byte_len, sizeof note);
      return 1;
    }
    std::memcpy(&note, memory.data() + note_offset, sizeof note);
    imm = note.value;
    written = note.length;
  }
  const std::string_view text =
      rpmapp::as_text(std::span(memory).first(std::min<std::size_t>(written, note_offset)));
  if (with_imm)
    fmt::print("immediate data {:#010x} with a write of {} bytes: \"{}\"\n", imm, written, text);
  else
    fmt::print("{:#010x} in a message after a write of {} bytes ({} has no immediate data): \"{}\"\n", imm,
               written, *peer->device_name(), text);
  if (imm != expected_imm || text != expected_text) {
    fmt::print(stderr, "error: expected {:#010x} and \"{}\"\n", expected_imm, expected_text);
    return 1;
  }

  if (auto ok = example::wait_closed_by_client(*conn); !ok) return example::fail(ok.error());
  if (auto ok = example::close_server(std::move(*conn), std::move(*mr), std::move(*endpoint)); !ok)
    return example::fail(ok.error());
  return 0;
}
