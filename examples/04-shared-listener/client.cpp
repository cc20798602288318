// 04-shared-listener, client: an ordinary client; it prints which server handle served it.
#include "../common/common.hpp"

#include <rpmapp/rpmapp.hpp>

#include <fmt/core.h>

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
  if (int status = example::check_server_data(*conn, "served through the "); status != 0)
    return status;

  if (auto ok = example::disconnect_and_close(*conn); !ok) return example::fail(ok.error());
  return 0;
}
