// 09-write-with-imm, server: exposes a region for writing and posts a receive before
// accepting. The client's write with immediate data consumes that receive: its completion
// tells the server that the data has arrived, how long it is and the immediate value.
#include "../common/common.hpp"
#include "../common/librpma_data.hpp"

#include <rpmapp/rpmapp.hpp>

#include <fmt/core.h>

#include <algorithm>
#include <array>
#include <cstdint>

constexpr std::string_view expected_text = "hello from the 09-write-with-imm client";
constexpr std::uint32_t expected_imm = 0x12345678;

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

  auto endpoint = example::listen_and_print(*peer, addr, port);
  if (!endpoint) return example::fail(endpoint.error());

  // The receive the immediate data completes is posted on the request, before accepting.
  auto post_recv = [&](rpmapp::ConnReq& req) { return req.recv(*mr, 0, 0); };
  auto conn = example::accept_next(*endpoint, data->bytes(), post_recv);
  if (!conn) return example::fail(conn.error());

  auto cq = conn->cq();
  if (!cq) return example::fail(cq.error());
  auto wc = example::next_completion(*cq, IBV_WC_RECV_RDMA_WITH_IMM);
  if (!wc) return example::fail(wc.error());
  if ((wc->wc_flags & IBV_WC_WITH_IMM) == 0) {
    fmt::print(stderr, "error: the completion carries no immediate data\n");
    return 1;
  }
  const std::uint32_t imm = rpmapp::immediate(*wc);
  const std::string_view text =
      rpmapp::as_text(std::span(memory).first(std::min<std::size_t>(wc->byte_len, memory.size())));
  fmt::print("immediate data {:#010x} with a write of {} bytes: \"{}\"\n", imm, wc->byte_len, text);
  if (imm != expected_imm || text != expected_text) {
    fmt::print(stderr, "error: expected {:#010x} and \"{}\"\n", expected_imm, expected_text);
    return 1;
  }

  if (auto ok = example::wait_closed_by_client(*conn); !ok) return example::fail(ok.error());
  if (auto ok = example::close_server(std::move(*conn), std::move(*mr), std::move(*endpoint)); !ok)
    return example::fail(ok.error());
  return 0;
}
