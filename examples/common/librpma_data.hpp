// What the examples' clients read from librpma-style servers: the server's private data is
// librpma's examples' struct common_data (rpmapp::CommonData, <rpmapp/common_data.hpp>),
// describing the server's memory region, so that the examples here talk to librpma's.
// A server that grants its region (rpmapp::Grant, examples 06 and 07) sends the same
// common_data in a message once the connection is established (send_grant,
// connect_for_grant).
#pragma once

#include "common.hpp"

#include <rpmapp/common_data.hpp>
#include <rpmapp/grant.hpp>
#include <rpmapp/rpmapp.hpp>

#include <array>
#include <optional>

namespace example {

/// What a client learns from the server's private data: the common_data and the region
/// it describes.
struct ServerRegion {
  rpmapp::CommonData data;
  rpmapp::MrRemote region;
};

/// Reads the common_data the server sent when accepting `conn` (untrusted bytes: parsed
/// and checked) and the region it describes. Errors: as Conn::private_data,
/// CommonData::from_private_data and CommonData::region.
inline rpmapp::expected<ServerRegion> server_region(const rpmapp::Conn& conn) {
  auto received = conn.private_data();
  if (!received) return rpmapp::unexpected(received.error());
  auto data = rpmapp::CommonData::from_private_data(*received);
  if (!data) return rpmapp::unexpected(data.error());
  auto region = data->region();
  if (!region) return rpmapp::unexpected(region.error());
  return ServerRegion{*data, *region};
}

/// How a server hands `grant` (of `region`, on `peer`) to its client: waits for the grant's bind to
/// complete where `region` grants by memory windows (its completion comes first on the
/// connection's CQ), then sends the common_data describing the grant, with `data_offset`
/// and `config`, in a message (from a region of its own, registered for the send) and waits
/// for the send's completion.
inline rpmapp::expected<void> send_grant(const rpmapp::Peer& peer, rpmapp::Conn& conn, const rpmapp::MrLocal& region,
                                         const rpmapp::Grant& grant, std::uint16_t data_offset = 0,
                                         std::optional<rpmapp::PeerConfig> config = std::nullopt) {
  auto cq = conn.cq();
  if (!cq) return rpmapp::unexpected(cq.error());
  auto mode = region.grant_mode();
  if (!mode) return rpmapp::unexpected(mode.error());
  if (*mode == rpmapp::GrantMode::windows)
    if (auto bound = next_completion(*cq, IBV_WC_BIND_MW); !bound) return rpmapp::unexpected(bound.error());
  auto descriptor = grant.descriptor();
  if (!descriptor) return rpmapp::unexpected(descriptor.error());
  rpmapp::CommonData message = rpmapp::CommonData::describe(*descriptor, data_offset, config);
  auto message_mr = rpmapp::MrLocal::reg(peer, &message, sizeof message, rpmapp::MrUsage::send);
  if (!message_mr) return rpmapp::unexpected(message_mr.error());
  if (auto ok = conn.send(*message_mr, 0, sizeof message, rpmapp::Completion::always); !ok) return ok;
  if (auto sent = next_completion(*cq, IBV_WC_SEND); !sent) return rpmapp::unexpected(sent.error());
  return std::move(*message_mr).dereg();
}

/// What a client of a granting server holds: the connection and what the server's message
/// described.
struct GrantedRegion {
  rpmapp::Conn conn;
  ServerRegion server;
};

/// How a client reaches a server that sends its grant in a message (send_grant): a receive
/// for it (into a region of its own) is posted on the request before it connects, so that
/// the server's first message finds it; then waits for the message and reads the
/// common_data in it (untrusted bytes: parsed and checked, as server_region does).
inline rpmapp::expected<GrantedRegion> connect_for_grant(const rpmapp::Peer& peer, std::string_view addr,
                                                         std::string_view port) {
  std::array<std::byte, sizeof(rpmapp::CommonData)> message{};
  auto message_mr = rpmapp::MrLocal::reg(peer, message, rpmapp::MrUsage::recv);
  if (!message_mr) return rpmapp::unexpected(message_mr.error());
  auto conn = connect_with_retry(
      [&]() -> rpmapp::expected<rpmapp::ConnReq> {
        auto req = rpmapp::ConnReq::to(peer, addr, port);
        if (!req) return req;
        if (auto ok = req->recv(*message_mr, 0, message.size()); !ok) return rpmapp::unexpected(ok.error());
        return req;
      },
      {});
  if (!conn) return rpmapp::unexpected(conn.error());
  auto cq = conn->cq();
  if (!cq) return rpmapp::unexpected(cq.error());
  auto received = next_completion(*cq, IBV_WC_RECV);
  if (!received) return rpmapp::unexpected(received.error());
  auto data = rpmapp::CommonData::from_private_data(std::span(message).first(received->byte_len));
  if (!data) return rpmapp::unexpected(data.error());
  auto region = data->region();
  if (!region) return rpmapp::unexpected(region.error());
  return GrantedRegion{std::move(*conn), ServerRegion{*data, *region}};
}

}  // namespace example
