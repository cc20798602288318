// Benchmark 5 (compile cost): a translation unit using rpmapp for a listener and a client
// connection. bench/run compiles it (and librpma_tu.cpp) with the same flags and records
// time and peak memory; it is never linked.
#include <rpmapp/rpmapp.hpp>

int listen_and_connect(const char* ip, const char* port) {
  auto peer = rpmapp::Peer::from_address(ip, rpmapp::AddressKind::local);
  if (!peer) return 1;
  auto ep = rpmapp::Endpoint::listen(*peer, ip, "0");
  if (!ep) return 2;
  auto req = rpmapp::ConnReq::to(*peer, ip, port);
  if (!req) return 3;
  auto conn = std::move(*req).connect();
  if (!conn) return 4;
  auto ev = conn->next_event();
  if (!ev || *ev != rpmapp::ConnEvent::established) return 5;
  if (!conn->disconnect()) return 6;
  if (!std::move(*conn).close()) return 7;
  return std::move(*ep).shutdown() ? 0 : 8;
}
