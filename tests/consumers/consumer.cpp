// The consumer program of tests/consumers/run: what a user of rpmapp writes first. It opens
// a Peer for 127.0.0.1 and listens on it. On a machine without an RDMA device both fail
// with a provider error (ENODEV) or inval; that is the expected outcome and exits 0. Any
// other error exits 1, so a broken build, link or package shows up as a failure.
#include <rpmapp/rpmapp.hpp>

#include <fmt/format.h>

#include <cstdio>

namespace {
int report(const rpmapp::Error& e) {
  bool expected = e.code() == rpmapp::errc::provider || e.code() == rpmapp::errc::inval;
  fmt::print("{}: {}\n", expected ? "expected without an RDMA device" : "UNEXPECTED ERROR", e);
  std::fflush(stdout);
  return expected ? 0 : 1;
}
}  // namespace

int main() {
#if defined(RPMAPP_SEPARATE_COMPILATION)
  constexpr const char* mode = "compiled mode";
#else
  constexpr const char* mode = "header-only";
#endif
  fmt::print("rpmapp {} ({} expected back end, {})\n", RPMAPP_VERSION_STRING,
             rpmapp::expected_backend, mode);
  auto peer = rpmapp::Peer::from_address("127.0.0.1", rpmapp::AddressKind::local);
  if (!peer) return report(peer.error());
  auto ep = rpmapp::Endpoint::listen(*peer, "127.0.0.1", "0");
  if (!ep) return report(ep.error());
  auto port = ep->port();
  if (!port) return report(port.error());
  fmt::print("listening on 127.0.0.1 port {}\n", *port);
  return 0;
}
