// rpmapp write client, for the interop tests (the counterpart of librpma_write_client):
// takes the server's region from librpma's common_data, writes a NUL-terminated text to
// its start (Conn::write, then Conn::flush to visibility, whose completion says both are
// done), prints `wrote: "<text>"` and disconnects.
#include "../../../examples/common/common.hpp"
#include "../../../examples/common/librpma_data.hpp"

#include <rpmapp/rpmapp.hpp>

#include <fmt/format.h>

#include <array>

constexpr std::string_view text = "Written by the rpmapp write client";

int main(int argc, char** argv) {
  std::string_view addr, port;
  if (!example::parse_args(argc, argv, addr, port)) return 2;

  auto peer = rpmapp::Peer::from_address(addr, rpmapp::AddressKind::remote);
  if (!peer) return example::fail(peer.error());

  std::array<char, text.size() + 1> memory{};  // the text and its NUL
  text.copy(memory.data(), text.size());
  auto src = rpmapp::MrLocal::reg(*peer, memory.data(), memory.size(), rpmapp::MrUsage::write_src);
  if (!src) return example::fail(src.error());

  auto conn = example::connect_with_retry(*peer, addr, port, {});
  if (!conn) return example::fail(conn.error());
  auto received = conn->private_data();
  if (!received) return example::fail(received.error());
  auto data = example::parse_common_data(*received);
  if (!data) return example::fail(data.error());
  auto dst = example::remote_region(*data);
  if (!dst) return example::fail(dst.error());

  // Conn::write and Conn::flush check the region's size and usages before posting.
  if (auto ok = conn->write(*dst, 0, *src, 0, memory.size(), rpmapp::Completion::on_error); !ok)
    return example::fail(ok.error());
  if (auto ok = conn->flush(*dst, 0, memory.size(), rpmapp::FlushType::visibility); !ok)
    return example::fail(ok.error());
  auto cq = conn->cq();
  if (!cq) return example::fail(cq.error());
  std::array<ibv_wc, 1> wc{};
  auto done = cq->next_for(wc, example::wait_bound);
  if (!done) return example::fail(done.error());
  if (auto ok = rpmapp::check(done->front()); !ok) return example::fail(ok.error());
  // The flush is an RDMA READ (librpma's emulation).
  if (done->front().opcode != IBV_WC_RDMA_READ)
    return example::fail(rpmapp::Error(rpmapp::errc::unknown, 0, "rpmapp write client",
                                       fmt::format("expected the flush's read completion, got {}",
                                                   rpmapp::to_string(done->front().opcode))));
  fmt::print("wrote: \"{}\"\n", memory.data());

  if (auto ok = example::disconnect_and_close(*conn); !ok) return example::fail(ok.error());
  return 0;
}
