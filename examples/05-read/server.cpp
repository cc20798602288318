// 05-read, server: takes the client's request on a protection domain of its own
// (ConnConfig::own_protection_domain), registers a region holding a text there as a read
// source, sends its descriptor in the accept's private data (librpma's common_data, so
// that librpma's read client can use it too) and waits while the client reads it and
// disconnects. The region's key reaches nothing through any other connection.
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

  auto endpoint = example::listen_and_print(*peer, addr, port);
  if (!endpoint) return example::fail(endpoint.error());

  // The request's own domain: its region is registered there, before accepting, so the
  // descriptor can go in the accept's private data as librpma's clients expect.
  rpmapp::ConnConfig isolated;
  isolated.own_protection_domain = true;
  auto req = endpoint->next_conn_req_for(example::wait_bound, isolated);
  if (!req) return example::fail(req.error());
  auto domain = req->peer();
  if (!domain) return example::fail(domain.error());

  // The region is exactly the text and its NUL: the client reads the whole region.
  std::array<char, text.size() + 1> memory{};
  text.copy(memory.data(), text.size());
  auto mr = rpmapp::MrLocal::reg(*domain, memory.data(), memory.size(), rpmapp::MrUsage::read_src);
  if (!mr) return example::fail(mr.error());
  auto data = rpmapp::CommonData::describe(*mr);
  if (!data) return example::fail(data.error());

  auto conn = std::move(*req).connect(data->bytes());
  if (!conn) return example::fail(conn.error());
  if (auto ok = example::expect_event(*conn, rpmapp::ConnEvent::established); !ok) return example::fail(ok.error());
  fmt::print("connection established: the client may read {} bytes\n", memory.size());

  // The client reads and then disconnects; the region must stay registered until then.
  if (auto ok = example::wait_closed_by_client(*conn); !ok) return example::fail(ok.error());

  if (auto ok = example::close_server(std::move(*conn), std::move(*mr), std::move(*endpoint)); !ok)
    return example::fail(ok.error());
  return 0;
}
