// 02-port-zero, client: connects to the port the server printed (given on the command
// line; port "0" itself cannot be connected to: ConnReq::to reports inval).
#include "../common/common.hpp"

#include <rpmapp/rpmapp.hpp>

#include <fmt/core.h>

int main(int argc, char** argv) {
  std::string_view addr, port;
  if (!example::parse_args(argc, argv, addr, port)) return 2;

  auto peer = rpmapp::Peer::from_address(addr, rpmapp::AddressKind::remote);
  if (!peer) return example::fail(peer.error());
  auto conn = example::connect_with_retry(*peer, addr, port, {});
  if (!conn) return example::fail(conn.error());
  fmt::print("connected to {} port {} (qp {})\n", addr, port, conn->qp_num().value_or(0));

  if (auto ok = example::disconnect_and_close(*conn); !ok) return example::fail(ok.error());
  return 0;
}
