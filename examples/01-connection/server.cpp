// 01-connection, server: reads the client's private data from the connection request
// before deciding, accepts with its own private data, and waits for the client to leave.
#include "../common/common.hpp"

#include <rpmapp/rpmapp.hpp>

#include <fmt/core.h>

constexpr std::string_view client_hello = "hello from the 01-connection client";
constexpr std::string_view server_hello = "welcome from the 01-connection server";

int main(int argc, char** argv) {
  std::string_view addr, port;
  if (!example::parse_args(argc, argv, addr, port)) return 2;

  // A protection domain on the device that owns `addr`.
  auto peer = rpmapp::Peer::from_address(addr, rpmapp::AddressKind::local);
  if (!peer) return example::fail(peer.error());

  auto endpoint = rpmapp::Endpoint::listen(*peer, addr, port);
  if (!endpoint) return example::fail(endpoint.error());
  if (auto ok = example::print_listening(*endpoint); !ok) return example::fail(ok.error());

  // The request carries the client's private data (zero-padded to 56 bytes by rdma_cm).
  auto req = endpoint->next_conn_req_for(example::wait_bound);
  if (!req) return example::fail(req.error());
  auto received = req->private_data();
  if (!received) return example::fail(received.error());
  fmt::print("received from the client: \"{}\" ({} bytes as delivered)\n",
             rpmapp::as_text(*received), received->size());
  if (!example::has_prefix(*received, client_hello)) {
    fmt::print(stderr, "error: unexpected private data from the client\n");
    return 1;  // dropping `req` rejects it
  }

  // Accepting consumes the request; the Conn owns the queue pair and cm_id from now on.
  auto conn = std::move(*req).connect(rpmapp::as_bytes(server_hello));
  if (!conn) return example::fail(conn.error());
  if (auto ok = example::expect_event(*conn, rpmapp::ConnEvent::established); !ok)
    return example::fail(ok.error());
  fmt::print("connection established on {}\n", conn->device().value_or("?"));

  // The client disconnects when it has read our private data.
  if (auto ok = example::expect_event(*conn, rpmapp::ConnEvent::closed); !ok)
    return example::fail(ok.error());
  fmt::print("connection closed by the client\n");

  if (auto ok = std::move(*conn).close(); !ok) return example::fail(ok.error());
  if (auto ok = std::move(*endpoint).shutdown(); !ok) return example::fail(ok.error());
  return 0;
}
