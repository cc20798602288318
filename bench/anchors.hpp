// What benchmarks 1-3 set up before measuring: the address, and a Peer for rpmapp and an
// rpma_peer for librpma on the device that owns it (raw librdmacm needs nothing more).
#pragma once

#include "common.hpp"

#include <librpma.h>

namespace bench {

struct Anchors {
  const char* ip;
  rpmapp::Peer peer;
  ibv_context* ctx;
  rpma_peer* rpeer;
};

/// Reads $SOFTROCE_IP and opens both peers; dies on failure. librpma logs at WARNING only,
/// so that its NOTICE lines (to syslog) are not part of the timing.
inline Anchors open_anchors() {
  const char* ip = std::getenv("SOFTROCE_IP");
  if (ip == nullptr) die("SOFTROCE_IP", "not set (run inside tools/rpmapp-vm)");
  rpma_log_set_threshold(RPMA_LOG_THRESHOLD, RPMA_LOG_LEVEL_WARNING);
  auto peer = must(rpmapp::Peer::from_address(ip, rpmapp::AddressKind::local), "Peer::from_address");
  ibv_context* ctx = nullptr;
  check(rpma_utils_get_ibv_context(ip, RPMA_UTIL_IBV_CONTEXT_LOCAL, &ctx), "rpma_utils_get_ibv_context");
  rpma_peer* rpeer = nullptr;
  check(rpma_peer_new(ctx, &rpeer), "rpma_peer_new");
  return {ip, std::move(peer), ctx, rpeer};
}

}  // namespace bench
