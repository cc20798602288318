// Opens a Peer on 127.0.0.1. Without an RDMA device that fails with a provider error
// (ENODEV) or inval, which is the expected outcome: exit 0. Any other error: exit 1.
#include <rpmapp/rpmapp.hpp>

#include <fmt/format.h>

int main() {
  fmt::print("rpmapp {} ({} expected back end)\n", RPMAPP_VERSION_STRING,
             rpmapp::expected_backend);
  auto peer = rpmapp::Peer::from_address("127.0.0.1", rpmapp::AddressKind::local);
  if (peer) {
    fmt::print("opened a Peer on 127.0.0.1\n");
    return 0;
  }
  const auto code = peer.error().code();
  fmt::print("{}\n", peer.error());
  return code == rpmapp::errc::provider || code == rpmapp::errc::inval ? 0 : 1;
}
