// Benchmark 1: listen + shutdown cycles on $SOFTROCE_IP, port "0" (the CM picks a free
// port) in all three implementations: rpmapp, librpma 1.2 and raw librdmacm.
// Usage: bench_listen [reps] [cycles per rep]          prints R lines (see common.hpp)
//        bench_listen calls [reps] [cycles per rep]    the per-call breakdown: R lines
//          "listen-calls <call> ns/cycle <variant>", one per librdmacm call (and poll) the
//          cycle makes, and "(rest)" for the time outside them (listen_calls.hpp)
#include "anchors.hpp"
#include "listen_calls.hpp"

#include <rdma/rdma_cma.h>

int main(int argc, char** argv) {
  using namespace bench;
  const bool by_call = argc > 1 && std::string(argv[1]) == "calls";
  if (by_call) {
    --argc;
    ++argv;
  }
  const int reps = argc > 1 ? std::atoi(argv[1]) : 9;
  const int cycles = argc > 2 ? std::atoi(argv[2]) : 200;
  // (names, not a structured binding: lambdas use them, and clang before 16 cannot
  // capture a structured binding)
  Anchors anchors = open_anchors();
  auto& ip = anchors.ip;
  auto& peer = anchors.peer;
  auto& rpeer = anchors.rpeer;

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

  if (!by_call) {
    interleave("listen", "-", "ns/cycle", reps,
               {timed(with_rpmapp), timed(with_librpma), timed(with_raw)});
  } else {
    // Each repetition runs one variant's cycles with the wrappers timing, then prints its
    // rows; interleave_named (whose own line is the whole cycle) rotates the order.
    auto by_calls = [&](const char* variant, auto cycle) {
      return [=, whole = timed(cycle)]() {
        listen_calls::reset();
        listen_calls::timing = true;
        const double ns = whole();
        listen_calls::timing = false;
        double inside = 0;
        for (int c = 0; c < listen_calls::call_count; ++c) inside += listen_calls::rows[c].ns;
        if (listen_calls::rows[listen_calls::create_id].count != cycles)
          die("bench_listen calls", std::string(variant) + ": rdma_create_id was not interposed");
        return std::make_pair(ns, inside);
      };
    };
    const std::array<const char*, 3> names = variants;
    std::array<std::function<std::pair<double, double>()>, 3> run = {
        by_calls(names[0], with_rpmapp), by_calls(names[1], with_librpma), by_calls(names[2], with_raw)};
    for (auto& f : run) (void)f();  // warm-up
    for (int rep = 0; rep < reps; ++rep) {
      for (int k = 0; k < 3; ++k) {
        const std::size_t v = static_cast<std::size_t>((rep + k) % 3);
        const auto [ns, inside] = run[v]();
        for (int c = 0; c < listen_calls::call_count; ++c) {
          const auto& row = listen_calls::rows[static_cast<std::size_t>(c)];
          if (row.count == 0) continue;
          std::printf("R\tlisten-calls\t%s\tns/cycle\t%s\t%d\t%.6g\n", listen_calls::names[c], names[v], rep,
                      row.ns / cycles);
          std::printf("R\tlisten-calls\t%s\tcalls/cycle\t%s\t%d\t%.6g\n", listen_calls::names[c], names[v],
                      rep, static_cast<double>(row.count) / cycles);
        }
        std::printf("R\tlisten-calls\t(rest)\tns/cycle\t%s\t%d\t%.6g\n", names[v], rep, ns - inside / cycles);
        std::printf("R\tlisten-calls\t(cycle)\tns/cycle\t%s\t%d\t%.6g\n", names[v], rep, ns);
        std::fflush(stdout);
      }
    }
  }

  check(rpma_peer_delete(&rpeer), "rpma_peer_delete");
  return 0;
}
