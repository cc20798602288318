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
  auto server = example::server_region(*conn);
  if (!server) return example::fail(server.error());
  const rpmapp::MrRemote& dst = server->region;

  // Conn::write and Conn::flush check the region's size and usages before posting.
  if (auto ok = conn->write(dst, 0, *src, 0, memory.size(), rpmapp::Completion::on_error); !ok)
    return example::fail(ok.error());
  if (auto ok = conn->flush(dst, 0, memory.size(), rpmapp::FlushType::visibility); !ok)
    return example::fail(ok.error());
  auto cq = conn->cq();
  if (!cq) return example::fail(cq.error());
  // An RDMA FLUSH where the Peer flushes natively (librpma 1.3's way), else an RDMA READ.
  auto flushed = example::flush_completion(*peer);
  if (!flushed) return example::fail(flushed.error());
  if (auto wc = example::next_completion(*cq, *flushed); !wc) return example::fail(wc.error());
  fmt::print("wrote: \"{}\"\n", memory.data());

  if (auto ok = example::disconnect_and_close(*conn); !ok) return example::fail(ok.error());
  return 0;
}
