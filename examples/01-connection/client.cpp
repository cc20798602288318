// 01-connection, client: sends private data with the connection request and reads the
// server's private data from the established connection.
#include "../common/common.hpp"

#include <rpmapp/rpmapp.hpp>

#include <fmt/core.h>

constexpr std::string_view client_hello = "hello from the 01-connection client";
constexpr std::string_view server_hello = "welcome from the 01-connection server";

int main(int argc, char** argv) {
  std::string_view addr, port;
  if (!example::parse_args(argc, argv, addr, port)) return 2;

  // A protection domain on the device that reaches `addr`.
  auto peer = rpmapp::Peer::from_address(addr, rpmapp::AddressKind::remote);
  if (!peer) return example::fail(peer.error());

  // ConnReq::to + connect + wait for established, retried if the server is not ready.
  auto conn = example::connect_with_retry(*peer, addr, port, rpmapp::as_bytes(client_hello));
  if (!conn) return example::fail(conn.error());

  // After established, private_data() holds the accept's data (zero-padded to 196 bytes).
  auto received = conn->private_data();
  if (!received) return example::fail(received.error());
  fmt::print("received from the server: \"{}\" ({} bytes as delivered)\n",
             rpmapp::as_text(*received), received->size());
  if (!example::has_prefix(*received, server_hello)) {
    fmt::print(stderr, "error: unexpected private data from the server\n");
    return 1;
  }

  if (auto ok = example::disconnect_and_close(*conn); !ok) return example::fail(ok.error());
  return 0;
}
