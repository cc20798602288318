// rpmapp write server, for the interop tests (the counterpart of librpma_write_server):
// exposes a zeroed region as a write destination, flushable to visibility, in librpma's
// common_data, waits for the client to write a NUL-terminated text and disconnect, and
// then prints `written: "<text>"`.
#include "../../../examples/common/common.hpp"
#include "../../../examples/common/librpma_data.hpp"

#include <rpmapp/rpmapp.hpp>

#include <fmt/format.h>

#include <array>
#include <cstring>

int main(int argc, char** argv) {
  std::string_view addr, port;
  if (!example::parse_args(argc, argv, addr, port)) return 2;

  auto peer = rpmapp::Peer::from_address(addr, rpmapp::AddressKind::local);
  if (!peer) return example::fail(peer.error());

  std::array<char, 1024> memory{};
  auto mr = rpmapp::MrLocal::reg(*peer, memory.data(), memory.size(),
                                 rpmapp::MrUsage::write_dst | rpmapp::MrUsage::flush_visibility);
  if (!mr) return example::fail(mr.error());
  auto data = rpmapp::CommonData::describe(*mr);
  if (!data) return example::fail(data.error());

  auto endpoint = example::listen_and_print(*peer, addr, port);
  if (!endpoint) return example::fail(endpoint.error());

  auto conn = example::accept_next(*endpoint, data->bytes());
  if (!conn) return example::fail(conn.error());
  fmt::print("connection established: the client may write {} bytes\n", memory.size());
  if (auto ok = example::wait_closed_by_client(*conn); !ok) return example::fail(ok.error());

  // The client's write and flush completed before it disconnected.
  if (std::memchr(memory.data(), '\0', memory.size()) == nullptr)
    return example::fail(rpmapp::Error(rpmapp::errc::inval, 0, "rpmapp write server",
                                       "the region holds no NUL-terminated text"));
  fmt::print("written: \"{}\"\n", memory.data());

  if (auto ok = example::close_server(std::move(*conn), std::move(*mr), std::move(*endpoint)); !ok)
    return example::fail(ok.error());
  return 0;
}
