// 02-port-zero, server: listens on port "0" so that the CM picks a free port, and reports
// what was bound: port(), local_address() and service_id(). Serves one client.
#include "../common/common.hpp"

#include <rpmapp/rpmapp.hpp>

#include <fmt/core.h>

int main(int argc, char** argv) {
  std::string_view addr, port;
  if (!example::parse_args(argc, argv, addr, port)) return 2;  // PORT is normally "0"

  auto peer = rpmapp::Peer::from_address(addr, rpmapp::AddressKind::local);
  if (!peer) return example::fail(peer.error());
  auto endpoint = rpmapp::Endpoint::listen(*peer, addr, port);
  if (!endpoint) return example::fail(endpoint.error());

  // The IB service ID rdma_cm derived from the port (RDMA_PS_TCP << 16 | port), in
  // network byte order: its bytes read in memory order are the big-endian value.
  auto service_id = endpoint->service_id();
  if (!service_id) return example::fail(service_id.error());
  fmt::print("asked for port \"{}\", the CM assigned port {} (service ID {:#018x} in network byte order)\n",
             port, endpoint->port().value_or(0), *service_id);
  if (auto ok = example::print_listening(*endpoint); !ok) return example::fail(ok.error());

  auto req = endpoint->next_conn_req_for(example::wait_bound);
  if (!req) return example::fail(req.error());
  auto from = req->peer_address();
  if (!from) return example::fail(from.error());
  fmt::print("connection request from {} port {}\n", *from, req->peer_port().value_or(0));

  auto conn = std::move(*req).connect();
  if (!conn) return example::fail(conn.error());
  if (auto ok = example::expect_event(*conn, rpmapp::ConnEvent::established); !ok)
    return example::fail(ok.error());
  if (auto ok = example::expect_event(*conn, rpmapp::ConnEvent::closed); !ok)
    return example::fail(ok.error());
  fmt::print("served one client on the assigned port\n");
  if (auto ok = std::move(*conn).close(); !ok) return example::fail(ok.error());
  if (auto ok = std::move(*endpoint).shutdown(); !ok) return example::fail(ok.error());
  return 0;
}
