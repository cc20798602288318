// 05-read, server: registers a region holding a text as a read source, sends its
// descriptor in the accept's private data (librpma's common_data, so that librpma's read
// client can use it too) and waits while the client reads it and disconnects.
#include "../common/common.hpp"
#include "../common/librpma_data.hpp"

#include <rpmapp/rpmapp.hpp>

#include <fmt/core.h>

#include <array>

// The text the client reads, NUL-terminated (the NUL is part of the region).
constexpr std::string_view text = "Hello from the rpmapp 05-read server!";

int main(int argc, char** argv) {
  std::string_view addr, port;
  if (!example::parse_args(argc, argv, addr, port)) return 2;

  auto peer = rpmapp::Peer::from_address(addr, rpmapp::AddressKind::local);
  if (!peer) return example::fail(peer.error());

  // The region is exactly the text and its NUL: the client reads the whole region.
  std::array<char, text.size() + 1> memory{};
  text.copy(memory.data(), text.size());
  auto mr = rpmapp::MrLocal::reg(*peer, memory.data(), memory.size(), rpmapp::MrUsage::read_src);
  if (!mr) return example::fail(mr.error());
  auto data = rpmapp::CommonData::describe(*mr);
  if (!data) return example::fail(data.error());

  auto endpoint = example::listen_and_print(*peer, addr, port);
  if (!endpoint) return example::fail(endpoint.error());

  auto conn = example::accept_next(*endpoint, data->bytes());
  if (!conn) return example::fail(conn.error());
  fmt::print("connection established: the client may read {} bytes\n", memory.size());

  // The client reads and then disconnects; the region must stay registered until then.
  if (auto ok = example::wait_closed_by_client(*conn); !ok) return example::fail(ok.error());

  if (auto ok = example::close_server(std::move(*conn), std::move(*mr), std::move(*endpoint)); !ok)
    return example::fail(ok.error());
  return 0;
}
