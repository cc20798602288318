// 05-read, client: takes the server's region from the accept's private data (librpma's
// common_data), reads it with one RDMA READ into its own registered region and prints the
// text it holds.
#include "../common/common.hpp"
#include "../common/librpma_data.hpp"

#include <rpmapp/rpmapp.hpp>

#include <fmt/core.h>

#include <array>
#include <cstring>

// The most this client reads: a server's region must fit.
constexpr std::size_t buffer_size = 1024;

int main(int argc, char** argv) {
  std::string_view addr, port;
  if (!example::parse_args(argc, argv, addr, port)) return 2;

  auto peer = rpmapp::Peer::from_address(addr, rpmapp::AddressKind::remote);
  if (!peer) return example::fail(peer.error());

  // Where the READ lands. Registered before connecting, as it does not depend on the server.
  std::array<char, buffer_size> memory{};
  auto dst = rpmapp::MrLocal::reg(*peer, memory.data(), memory.size(), rpmapp::MrUsage::read_dst);
  if (!dst) return example::fail(dst.error());

  auto conn = example::connect_with_retry(*peer, addr, port, {});
  if (!conn) return example::fail(conn.error());

  // The server's descriptor: untrusted bytes, parsed and checked before any use.
  auto server = example::server_region(*conn);
  if (!server) return example::fail(server.error());
  const rpmapp::MrRemote& src = server->region;
  if (src.size() > memory.size())
    return example::fail(rpmapp::Error(
        rpmapp::errc::inval, 0, "05-read client",
        fmt::format("the server's region of {} bytes does not fit in {} bytes", src.size(), memory.size())));
  const auto size = static_cast<std::size_t>(src.size());

  // One READ of the whole region; Conn::read checks that the server registered it as a
  // read source and that it fits in `dst`.
  if (auto ok = conn->read(*dst, 0, src, 0, size); !ok) return example::fail(ok.error());
  auto cq = conn->cq();
  if (!cq) return example::fail(cq.error());
  if (auto wc = example::next_completion(*cq, IBV_WC_RDMA_READ); !wc) return example::fail(wc.error());

  // The server promised a NUL-terminated text; do not trust it to keep the promise.
  if (std::memchr(memory.data(), '\0', size) == nullptr)
    return example::fail(rpmapp::Error(rpmapp::errc::inval, 0, "05-read client",
                                       "the server's region holds no NUL-terminated text"));
  fmt::print("read: \"{}\"\n", memory.data());

  if (auto ok = example::disconnect_and_close(*conn); !ok) return example::fail(ok.error());
  return 0;
}
