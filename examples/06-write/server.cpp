// 06-write, server: grants its client writes of a region (rpmapp::Grant: good on this
// connection only, revoked when it ends), sends the grant's descriptor in a message
// (librpma's examples' common_data) and, once the client has disconnected, prints what the
// client wrote there.
#include "../common/common.hpp"
#include "../common/librpma_data.hpp"

#include <rpmapp/rpmapp.hpp>

#include <fmt/core.h>

#include <array>

constexpr std::string_view expected_text = "hello from the 06-write client";

int main(int argc, char** argv) {
  std::string_view addr, port;
  if (!example::parse_args(argc, argv, addr, port)) return 2;

  auto peer = rpmapp::Peer::from_address(addr, rpmapp::AddressKind::local);
  if (!peer) return example::fail(peer.error());

  // Zeroed, so that whatever the client writes reads back as a NUL-terminated text. Its own
  // key reaches nothing (MrScope::grants): only a grant opens it, to one connection.
  std::array<std::byte, 1024> memory{};
  auto mr = rpmapp::MrLocal::reg(*peer, memory, rpmapp::MrUsage::write_dst, rpmapp::MrScope::grants);
  if (!mr) return example::fail(mr.error());

  auto endpoint = example::listen_and_print(*peer, addr, port);
  if (!endpoint) return example::fail(endpoint.error());

  auto conn = example::accept_next(*endpoint);
  if (!conn) return example::fail(conn.error());
  // Writes of the whole region, for this connection only: ended by its release below.
  auto grant = rpmapp::Grant::make(*conn, *mr, 0, memory.size(), rpmapp::MrUsage::write_dst);
  if (!grant) return example::fail(grant.error());
  if (auto ok = example::send_grant(*peer, *conn, *mr, *grant); !ok) return example::fail(ok.error());
  fmt::print("connection established, region of {} bytes granted for writing\n", memory.size());

  // The server takes no part in the write: it learns that the client is done from the
  // disconnection (the client disconnects only after its write completed).
  if (auto ok = example::wait_closed_by_client(*conn); !ok) return example::fail(ok.error());

  const std::string_view text = rpmapp::as_text(memory);
  fmt::print("the client wrote: \"{}\"\n", text);
  if (text != expected_text) {
    fmt::print(stderr, "error: expected \"{}\"\n", expected_text);
    return 1;
  }

  if (auto ok = example::close_server(std::move(*conn), std::move(*mr), std::move(*endpoint)); !ok)
    return example::fail(ok.error());
  return 0;
}
