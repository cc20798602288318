// Benchmark 1: listen + shutdown cycles on $SOFTROCE_IP, port "0" (the CM picks a free
// port) in all three implementations: rpmapp, librpma 1.2 and raw librdmacm.
// Usage: bench_listen [reps] [cycles per rep]          prints R lines (see common.hpp)
#include "anchors.hpp"

#include <rdma/rdma_cma.h>

int main(int argc, char** argv) {
  using namespace bench;
  const int reps = argc > 1 ? std::atoi(argv[1]) : 9;
  const int cycles = argc > 2 ? std::atoi(argv[2]) : 200;
  auto [ip, peer, ctx, rpeer] = open_anchors();

  auto timed = [cycles](auto&& cycle) {
    return [cycles, cycle]() {
      const double t0 = now_s();
      for (int i = 0; i < cycles; ++i) cycle();
      return (now_s() - t0) * 1e9 / cycles;
    };
  };

  auto with_rpmapp = [&] {
    auto ep = must(rpmapp::Endpoint::listen(peer, ip, "0"), "Endpoint::listen");
    must(std::move(ep).shutdown(), "Endpoint::shutdown");
  };
  auto with_librpma = [&] {
    rpma_ep* ep = nullptr;
    check(rpma_ep_listen(rpeer, ip, "0", &ep), "rpma_ep_listen");
    check(rpma_ep_shutdown(&ep), "rpma_ep_shutdown");
  };
  auto with_raw = [&] {
    rdma_event_channel* ch = check_ptr(rdma_create_event_channel(), "rdma_create_event_channel");
    rdma_cm_id* id = nullptr;
    check(rdma_create_id(ch, &id, nullptr, RDMA_PS_TCP), "rdma_create_id");
    rdma_addrinfo hints{};
    hints.ai_flags = RAI_PASSIVE | RAI_NUMERICHOST;
    hints.ai_port_space = RDMA_PS_TCP;
    hints.ai_qp_type = IBV_QPT_RC;
    rdma_addrinfo* ai = nullptr;
    check(rdma_getaddrinfo(ip, "0", &hints, &ai), "rdma_getaddrinfo");
    check(rdma_bind_addr(id, ai->ai_src_addr), "rdma_bind_addr");
    rdma_freeaddrinfo(ai);
    check(rdma_listen(id, 0), "rdma_listen");
    check(rdma_destroy_id(id), "rdma_destroy_id");
    rdma_destroy_event_channel(ch);
  };

  interleave("listen", "-", "ns/cycle", reps,
             {timed(with_rpmapp), timed(with_librpma), timed(with_raw)});

  check(rpma_peer_delete(&rpeer), "rpma_peer_delete");
  return 0;
}
