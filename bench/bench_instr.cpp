// Benchmark 4: instructions of the control path, counted by callgrind on the host, with a
// deterministic fake provider (fake_provider.hpp): rpmapp against a hand-written sequence
// that makes exactly the same provider calls, in the same order, through the same fake
// (the program checks this before measuring). The difference is what rpmapp's checks,
// RAII, expected and bookkeeping cost per operation.
//
// Usage: bench_instr check                     compare the call traces; prints them
//        bench_instr <rpmapp|hand> <op> <N>    N iterations of op inside the collected region
//   op: listen   Endpoint::listen + shutdown
//       accept   next_conn_req, connect (accept), established, disconnect, closed, close
//       connect  ConnReq::to, connect, established, disconnect, closed, close
// Run under: valgrind --tool=callgrind --instr-atstart=no --callgrind-out-file=/dev/null
//   and read "Collected" (bench/run does this).
#include "common.hpp"
#include "fake_provider.hpp"

#include <valgrind/callgrind.h>

#include <fcntl.h>

#include <optional>
#include <string>
#include <vector>

namespace {

using bench::must;
namespace fake = bench::fake;
using rpmapp::detail::Provider;

constexpr const char* ip = "169.254.77.1";
constexpr const char* client_port = "20000";

// ------------------------------------------------------------------------ rpmapp

struct RpmappSide {
  rpmapp::Peer peer = must(rpmapp::Peer::open(&fake::world.context), "Peer::open");
  std::optional<rpmapp::Endpoint> ep;

  void listen_cycle() {
    auto e = must(rpmapp::Endpoint::listen(peer, ip, "0"), "Endpoint::listen");
    must(std::move(e).shutdown(), "Endpoint::shutdown");
  }
  void open_listener() { ep.emplace(must(rpmapp::Endpoint::listen(peer, ip, "0"), "listen")); }
  void close_listener() { must(std::move(*ep).shutdown(), "shutdown"); }
  void accept_cycle() {
    fake::incoming(fake::world.listener);
    auto conn = must(must(ep->next_conn_req(), "next_conn_req").connect(), "ConnReq::connect");
    if (must(conn.next_event(), "next_event") != rpmapp::ConnEvent::established) std::abort();
    must(conn.disconnect(), "disconnect");
    if (must(conn.next_event(), "next_event") != rpmapp::ConnEvent::closed) std::abort();
    must(std::move(conn).close(), "Conn::close");
  }
  void connect_cycle() {
    auto req = must(rpmapp::ConnReq::to(peer, ip, client_port), "ConnReq::to");
    auto conn = must(std::move(req).connect(), "ConnReq::connect");
    if (must(conn.next_event(), "next_event") != rpmapp::ConnEvent::established) std::abort();
    must(conn.disconnect(), "disconnect");
    if (must(conn.next_event(), "next_event") != rpmapp::ConnEvent::closed) std::abort();
    must(std::move(conn).close(), "Conn::close");
  }
};

// ------------------------------------------------------------------------ by hand
// What a careful C programmer writes for the same calls: return codes checked, no
// allocation, fixed-size buffers.

const Provider& p = fake::provider;

[[noreturn]] void fail(const char* what) { bench::die(what, "failed"); }

struct Queues {
  ibv_comp_channel* cc;
  ibv_cq* cq;
};

Queues create_queues(rdma_cm_id* id, ibv_pd* pd) {
  Queues q{};
  q.cc = p.create_comp_channel(id->verbs);
  if (!q.cc) fail("ibv_create_comp_channel");
  q.cq = p.create_cq(id->verbs, 10, nullptr, q.cc, 0);
  if (!q.cq) fail("ibv_create_cq");
  if (p.req_notify_cq(q.cq, 0)) fail("ibv_req_notify_cq");
  ibv_qp_init_attr attr = bench::raw_qp_attr(q.cq);
  if (p.create_qp(id, pd, &attr)) fail("rdma_create_qp");
  return q;
}

void release(rdma_cm_id* id, Queues q, rdma_event_channel* ch) {
  p.destroy_qp(id);
  if (p.destroy_cq(q.cq)) fail("ibv_destroy_cq");
  if (p.destroy_comp_channel(q.cc)) fail("ibv_destroy_comp_channel");
  if (p.destroy_id(id)) fail("rdma_destroy_id");
  p.destroy_event_channel(ch);
}

// Event channels are made non-blocking, and every wait polls before it reads, as rpmapp's.
void make_nonblocking(rdma_event_channel* ch) {
  const int flags = p.fcntl(ch->fd, F_GETFL, 0);
  if (flags < 0 || p.fcntl(ch->fd, F_SETFL, flags | O_NONBLOCK)) fail("fcntl");
}

rdma_event_channel* new_channel() {
  rdma_event_channel* ch = p.create_event_channel();
  if (!ch) fail("rdma_create_event_channel");
  make_nonblocking(ch);
  return ch;
}

rdma_cm_event* wait_event(rdma_event_channel* ch) {
  pollfd pfd{ch->fd, POLLIN, 0};
  if (p.poll(&pfd, 1, 2000) <= 0) fail("poll");
  rdma_cm_event* e = nullptr;
  if (p.get_cm_event(ch, &e)) fail("rdma_get_cm_event");
  return e;
}

rdma_cm_event_type next_event(rdma_event_channel* ch) {
  rdma_cm_event* e = wait_event(ch);
  rdma_cm_event_type type = e->event;
  if (p.ack_cm_event(e)) fail("rdma_ack_cm_event");
  return type;
}

struct HandSide {
  ibv_pd* pd = &fake::world.pd;
  rdma_event_channel* lch = nullptr;
  rdma_cm_id* lid = nullptr;
  unsigned short port = 0;

  void listen() {
    lch = new_channel();
    if (p.create_id(lch, &lid, nullptr, RDMA_PS_TCP)) fail("rdma_create_id");
    rdma_addrinfo hints{};
    hints.ai_flags = RAI_NUMERICHOST | RAI_PASSIVE;
    hints.ai_port_space = RDMA_PS_TCP;
    hints.ai_qp_type = IBV_QPT_RC;
    rdma_addrinfo* ai = nullptr;
    if (p.getaddrinfo(ip, "0", &hints, &ai)) fail("rdma_getaddrinfo");
    if (p.bind_addr(lid, ai->ai_src_addr)) fail("rdma_bind_addr");
    if (p.listen(lid, 0)) fail("rdma_listen");
    p.freeaddrinfo(ai);
    port = ntohs(reinterpret_cast<sockaddr_in*>(rdma_get_local_addr(lid))->sin_port);
  }
  void shutdown() {
    for (;;) {  // reject what is still queued
      pollfd pfd{lch->fd, POLLIN, 0};
      if (p.poll(&pfd, 1, 0) <= 0) break;
      rdma_cm_event* e = nullptr;
      if (p.get_cm_event(lch, &e)) break;
      rdma_cm_id* req = e->event == RDMA_CM_EVENT_CONNECT_REQUEST ? e->id : nullptr;
      if (req) p.reject(req, nullptr, 0);
      p.ack_cm_event(e);
      if (req) p.destroy_id(req);
    }
    if (p.destroy_id(lid)) fail("rdma_destroy_id");
    p.destroy_event_channel(lch);
  }
  void listen_cycle() {
    listen();
    shutdown();
  }
  void open_listener() { listen(); }
  void close_listener() { shutdown(); }

  void accept_cycle() {
    fake::incoming(fake::world.listener);
    rdma_cm_event* e = wait_event(lch);
    if (e->event != RDMA_CM_EVENT_CONNECT_REQUEST) fail("not a request");
    rdma_cm_id* id = e->id;
    unsigned char pdata[56];
    std::memcpy(pdata, e->param.conn.private_data, e->param.conn.private_data_len);
    Queues q = create_queues(id, pd);
    if (p.ack_cm_event(e)) fail("rdma_ack_cm_event");
    rdma_event_channel* ch = new_channel();
    if (p.migrate_id(id, ch)) fail("rdma_migrate_id");
    rdma_conn_param param = bench::raw_conn_param();
    if (p.accept(id, &param)) fail("rdma_accept");
    if (next_event(ch) != RDMA_CM_EVENT_ESTABLISHED) fail("not established");
    if (p.disconnect(id)) fail("rdma_disconnect");
    if (next_event(ch) != RDMA_CM_EVENT_DISCONNECTED) fail("not closed");
    release(id, q, ch);
  }

  void connect_cycle() {
    rdma_addrinfo hints{};
    hints.ai_flags = RAI_NUMERICHOST;
    hints.ai_port_space = RDMA_PS_TCP;
    hints.ai_qp_type = IBV_QPT_RC;
    rdma_addrinfo* ai = nullptr;
    if (p.getaddrinfo(ip, client_port, &hints, &ai)) fail("rdma_getaddrinfo");
    rdma_event_channel* ch = new_channel();
    rdma_cm_id* id = nullptr;
    if (p.create_id(ch, &id, nullptr, RDMA_PS_TCP)) fail("rdma_create_id");
    if (p.resolve_addr(id, ai->ai_src_addr, ai->ai_dst_addr, 1000)) fail("rdma_resolve_addr");
    p.freeaddrinfo(ai);
    rdma_cm_event* e = wait_event(ch);
    if (e->event != RDMA_CM_EVENT_ADDR_RESOLVED) fail("address");
    if (p.resolve_route(id, 1000)) fail("rdma_resolve_route");
    if (p.ack_cm_event(e)) fail("rdma_ack_cm_event");
    e = wait_event(ch);
    if (e->event != RDMA_CM_EVENT_ROUTE_RESOLVED) fail("route");
    Queues q = create_queues(id, pd);
    if (p.ack_cm_event(e)) fail("rdma_ack_cm_event");
    rdma_conn_param param = bench::raw_conn_param();
    if (p.connect(id, &param)) fail("rdma_connect");
    if (next_event(ch) != RDMA_CM_EVENT_ESTABLISHED) fail("not established");
    if (p.disconnect(id)) fail("rdma_disconnect");
    if (next_event(ch) != RDMA_CM_EVENT_DISCONNECTED) fail("not closed");
    release(id, q, ch);
  }
};

template <class Side> void run(Side& side, const std::string& op, int n, bool measure) {
  auto once = [&] {
    if (op == "listen") side.listen_cycle();
    else if (op == "accept") side.accept_cycle();
    else if (op == "connect") side.connect_cycle();
    else bench::die("op", op);
  };
  if (op == "accept") side.open_listener();
  once();  // warm up: lazy binding, first allocations
  if (measure) CALLGRIND_START_INSTRUMENTATION;
  for (int i = 0; i < n; ++i) once();
  if (measure) CALLGRIND_STOP_INSTRUMENTATION;
  if (op == "accept") side.close_listener();
}

template <class Side> std::vector<unsigned char> trace_of(const std::string& op) {
  fake::reset();
  Side side;
  if (op == "accept") side.open_listener();
  fake::world.trace_len = 0;
  if (op == "listen") side.listen_cycle();
  else if (op == "accept") side.accept_cycle();
  else side.connect_cycle();
  std::vector<unsigned char> t(fake::world.trace, fake::world.trace + fake::world.trace_len);
  if (op == "accept") side.close_listener();
  return t;
}

}  // namespace

int main(int argc, char** argv) {
  rpmapp::detail::ProviderOverride use_fake(fake::provider);
  const std::string what = argc > 1 ? argv[1] : "check";
  if (what == "check") {
    int bad = 0;
    for (const char* op : {"listen", "accept", "connect"}) {
      auto a = trace_of<RpmappSide>(op);
      auto b = trace_of<HandSide>(op);
      std::printf("%-8s rpmapp %zu calls, hand-written %zu calls: %s\n", op, a.size(), b.size(),
                  a == b ? "same sequence" : "DIFFERENT");
      if (a != b) {
        ++bad;
        for (auto c : a) std::printf(" %d", c);
        std::printf("\n");
        for (auto c : b) std::printf(" %d", c);
        std::printf("\n");
      }
    }
    return bad;
  }
  if (argc != 4) bench::die("usage", "bench_instr check | <rpmapp|hand> <op> <N>");
  const std::string op = argv[2];
  const int n = std::atoi(argv[3]);
  fake::reset();
  if (what == "rpmapp") {
    RpmappSide side;
    run(side, op, n, true);
  } else if (what == "hand") {
    HandSide side;
    run(side, op, n, true);
  } else {
    bench::die("variant", what);
  }
  return 0;
}
