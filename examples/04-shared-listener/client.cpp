// 04-shared-listener, client: an ordinary client; it prints which server handle served it.
#include "../common/common.hpp"

#include <rpmapp/rpmapp.hpp>

#include <fmt/format.h>

#include <unistd.h>

#include <string>

int main(int argc, char** argv) {
  std::string_view addr, port;
  if (!example::parse_args(argc, argv, addr, port)) return 2;

  auto peer = rpmapp::Peer::from_address(addr, rpmapp::AddressKind::remote);
  if (!peer) return example::fail(peer.error());
  const std::string hello = fmt::format("client pid {}", getpid());
  auto conn = example::connect_with_retry(*peer, addr, port, rpmapp::as_bytes(hello));
  if (!conn) return example::fail(conn.error());
  auto received = conn->private_data();
  if (!received) return example::fail(received.error());
  fmt::print("received from the server: \"{}\"\n", rpmapp::as_text(*received));
  if (!example::has_prefix(*received, "served through the ")) {
    fmt::print(stderr, "error: unexpected private data from the server\n");
    return 1;
  }

  if (auto ok = conn->disconnect(); !ok) return example::fail(ok.error());
  if (auto ok = example::expect_event(*conn, rpmapp::ConnEvent::closed); !ok)
    return example::fail(ok.error());
  if (auto ok = std::move(*conn).close(); !ok) return example::fail(ok.error());
  fmt::print("disconnected\n");
  return 0;
}
