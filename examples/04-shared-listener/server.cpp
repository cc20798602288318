// 04-shared-listener, server: two listen_shared calls on the same address and port give
// two handles to ONE listener. Clients are served through both handles; dropping one
// handle leaves the listener working; dropping the last one stops it.
#include "../common/common.hpp"

#include <rpmapp/rpmapp.hpp>

#include <fmt/core.h>

namespace {

// Takes one request from `endpoint`, accepts it and waits until the client leaves.
rpmapp::expected<void> serve_one(rpmapp::Endpoint& endpoint, std::string_view handle) {
  auto req = endpoint.next_conn_req_for(example::wait_bound);
  if (!req) return rpmapp::unexpected(req.error());
  auto received = req->private_data();
  if (!received) return rpmapp::unexpected(received.error());
  fmt::print("{} handle: request \"{}\"\n", handle, rpmapp::as_text(*received));
  const std::string reply = fmt::format("served through the {} handle", handle);
  auto conn = std::move(*req).connect(rpmapp::as_bytes(reply));
  if (!conn) return rpmapp::unexpected(conn.error());
  if (auto ok = example::expect_event(*conn, rpmapp::ConnEvent::established); !ok) return ok;
  if (auto ok = example::expect_event(*conn, rpmapp::ConnEvent::closed); !ok) return ok;
  return std::move(*conn).close();
}

}  // namespace

int main(int argc, char** argv) {
  std::string_view addr, port;
  if (!example::parse_args(argc, argv, addr, port)) return 2;

  auto peer = rpmapp::Peer::from_address(addr, rpmapp::AddressKind::local);
  if (!peer) return example::fail(peer.error());

  // The second call finds the first one's listener (same device and port) and shares it.
  auto first = rpmapp::Endpoint::listen_shared(*peer, addr, port);
  if (!first) return example::fail(first.error());
  auto second = rpmapp::Endpoint::listen_shared(*peer, addr, port);
  if (!second) return example::fail(second.error());
  auto count = second->share_count();
  if (!count) return example::fail(count.error());
  const bool one_listener = first->fd().value_or(-1) == second->fd().value_or(-2);
  fmt::print("two handles, share_count {}, one event channel: {}\n", *count, one_listener);
  if (*count != 2 || !one_listener) {
    fmt::print(stderr, "error: the handles do not share one listener\n");
    return 1;
  }
  if (auto ok = example::print_listening(*first); !ok) return example::fail(ok.error());

  if (auto ok = serve_one(*first, "first"); !ok) return example::fail(ok.error());
  if (auto ok = serve_one(*second, "second"); !ok) return example::fail(ok.error());

  // Dropping one handle does not stop the listener: the other one still gets requests.
  if (auto ok = std::move(*first).shutdown(); !ok) return example::fail(ok.error());
  count = second->share_count();
  if (!count) return example::fail(count.error());
  fmt::print("first handle dropped, share_count {}\n", *count);
  if (auto ok = serve_one(*second, "second"); !ok) return example::fail(ok.error());

  // The last handle's release stops listening: the port is free again.
  if (auto ok = std::move(*second).shutdown(); !ok) return example::fail(ok.error());
  auto again = rpmapp::Endpoint::listen(*peer, addr, port);
  if (!again) return example::fail(again.error());
  fmt::print("last handle dropped: the listener is gone, port {} could be bound again\n",
             again->port().value_or(0));
  if (auto ok = std::move(*again).shutdown(); !ok) return example::fail(ok.error());
  return 0;
}
