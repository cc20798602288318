// What the examples' clients read from librpma-style servers: the server's private data is
// librpma's examples' struct common_data (rpmapp::CommonData, <rpmapp/common_data.hpp>),
// describing the server's memory region, so that the examples here talk to librpma's.
#pragma once

#include <rpmapp/common_data.hpp>
#include <rpmapp/rpmapp.hpp>

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

}  // namespace example
