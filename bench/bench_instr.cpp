// Benchmark 4: instructions of the control path and of the data path, counted by callgrind
// on the host, with a
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
//   data path, on a connection made before the collected region (post + poll of its
//   completion, busy-polling: the fake completes every work request at once):
//       read     Conn::read of 64 bytes (Completion::always) + Cq::get of its completion
//       write    Conn::write of 64 bytes (Completion::always) + Cq::get of its completion
//       send     Conn::send of 64 bytes (Completion::always) + Cq::get of its completion
//       recv     Conn::recv of 64 bytes + Cq::get of its completion
// Run under: valgrind --tool=callgrind --instr-atstart=no --callgrind-out-file=/dev/null
//   and read "Collected" (bench/run does this).
#include "common.hpp"
#include "fake_provider.hpp"

#include <valgrind/callgrind.h>

#include <arpa/inet.h>
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
constexpr unsigned short client_port_number = 20000;
constexpr std::size_t msg = 64;  // bytes per data-path operation
constexpr std::uint64_t op_context = 0x5eed;

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

  // ---- data path: one connection, a local region for every usage and a "remote" one
  // (its descriptor, as the peer would send it).
  alignas(64) std::byte local_mem[4096]{};
  alignas(64) std::byte remote_mem[4096]{};
  std::optional<rpmapp::Conn> conn;
  std::optional<rpmapp::MrLocal> local, remote_reg;
  rpmapp::MrRemote remote;
  rpmapp::Cq cq;
  ibv_wc wc[1];

  void open_data() {
    auto req = must(rpmapp::ConnReq::to(peer, ip, client_port), "ConnReq::to");
    conn.emplace(must(std::move(req).connect(), "ConnReq::connect"));
    if (must(conn->next_event(), "next_event") != rpmapp::ConnEvent::established) std::abort();
    using rpmapp::MrUsage;
    local.emplace(must(rpmapp::MrLocal::reg(peer, local_mem, sizeof local_mem,
                                            MrUsage::read_dst | MrUsage::write_src |
                                                MrUsage::send | MrUsage::recv),
                       "MrLocal::reg"));
    remote_reg.emplace(must(rpmapp::MrLocal::reg(peer, remote_mem, sizeof remote_mem,
                                                 MrUsage::read_src | MrUsage::write_dst),
                            "MrLocal::reg"));
    remote = must(rpmapp::MrRemote::from_descriptor(must(remote_reg->descriptor(), "descriptor")),
                  "MrRemote::from_descriptor");
    cq = must(conn->cq(), "Conn::cq");
  }
  void close_data() {
    must(std::move(*local).dereg(), "dereg");
    must(std::move(*remote_reg).dereg(), "dereg");
    must(std::move(*conn).close(), "Conn::close");
  }
  // What an application writes: post, then poll until its completion is there, check it.
  void complete_one() {
    for (;;) {
      auto got = cq.get(wc);
      if (got) {
        must(rpmapp::check(got->front()), "completion");
        return;
      }
      if (got.error().code() != rpmapp::errc::no_completion) must(got, "Cq::get");
    }
  }
  void read_cycle() {
    must(conn->read(*local, 0, remote, 0, msg, rpmapp::Completion::always, op_context), "Conn::read");
    complete_one();
  }
  void write_cycle() {
    must(conn->write(remote, 0, *local, 0, msg, rpmapp::Completion::always, op_context), "Conn::write");
    complete_one();
  }
  void send_cycle() {
    must(conn->send(*local, 0, msg, rpmapp::Completion::always, op_context), "Conn::send");
    complete_one();
  }
  void recv_cycle() {
    must(conn->recv(*local, 0, msg, op_context), "Conn::recv");
    complete_one();
  }
};

// ------------------------------------------------------------------------ by hand
// What a careful C programmer writes for the same calls: return codes checked, no
// allocation, fixed-size buffers.

// The hand-written side calls the fake through the seam's pointer, as rpmapp does (and as
// ibverbs reaches a driver: through a pointer): bound to fake::provider directly, the
// compiler would inline the fake into this side only.
const Provider& p() { return rpmapp::detail::provider(); }

[[noreturn]] void fail(const char* what) { bench::die(what, "failed"); }

/// The address of a numeric IPv4 text and port, with inet_pton (as rpmapp, no
/// rdma_getaddrinfo: it allocates).
sockaddr_in ipv4(const char* text, unsigned short port) {
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  if (inet_pton(AF_INET, text, &a.sin_addr) != 1) fail("inet_pton");
  return a;
}

struct Queues {
  ibv_comp_channel* cc;
  ibv_cq* cq;
};

Queues create_queues(rdma_cm_id* id, ibv_pd* pd) {
  Queues q{};
  q.cc = p().create_comp_channel(id->verbs);
  if (!q.cc) fail("ibv_create_comp_channel");
  q.cq = p().create_cq(id->verbs, 10, nullptr, q.cc, 0);
  if (!q.cq) fail("ibv_create_cq");
  if (p().req_notify_cq(q.cq, 0)) fail("ibv_req_notify_cq");
  ibv_qp_init_attr attr = bench::raw_qp_attr(q.cq);
  if (p().create_qp(id, pd, &attr)) fail("rdma_create_qp");
  return q;
}

void release(rdma_cm_id* id, Queues q, rdma_event_channel* ch) {
  if (p().destroy_qp(id)) fail("ibv_destroy_qp");
  if (p().destroy_cq(q.cq)) fail("ibv_destroy_cq");
  if (p().destroy_comp_channel(q.cc)) fail("ibv_destroy_comp_channel");
  if (p().destroy_id(id)) fail("rdma_destroy_id");
  p().destroy_event_channel(ch);
}

// Event channels are made non-blocking, and every wait polls before it reads, as rpmapp's
// (a look without waiting only reads).
void make_nonblocking(rdma_event_channel* ch) {
  if (p().fcntl(ch->fd, F_SETFL, O_NONBLOCK)) fail("fcntl");
}

rdma_event_channel* new_channel() {
  rdma_event_channel* ch = p().create_event_channel();
  if (!ch) fail("rdma_create_event_channel");
  make_nonblocking(ch);
  return ch;
}

rdma_cm_event* wait_event(rdma_event_channel* ch) {
  pollfd pfd{ch->fd, POLLIN, 0};
  if (p().poll(&pfd, 1, 2000) <= 0) fail("poll");
  rdma_cm_event* e = nullptr;
  if (p().get_cm_event(ch, &e)) fail("rdma_get_cm_event");
  return e;
}

rdma_cm_event_type next_event(rdma_event_channel* ch) {
  rdma_cm_event* e = wait_event(ch);
  rdma_cm_event_type type = e->event;
  if (p().ack_cm_event(e)) fail("rdma_ack_cm_event");
  return type;
}

struct HandSide {
  ibv_pd* pd = &fake::world.pd;
  rdma_event_channel* lch = nullptr;
  rdma_cm_id* lid = nullptr;
  unsigned short port = 0;

  void listen() {
    lch = new_channel();
    if (p().create_id(lch, &lid, nullptr, RDMA_PS_TCP)) fail("rdma_create_id");
    sockaddr_in addr = ipv4(ip, 0);
    if (p().bind_addr(lid, reinterpret_cast<sockaddr*>(&addr))) fail("rdma_bind_addr");
    if (p().listen(lid, 0)) fail("rdma_listen");
    port = ntohs(reinterpret_cast<sockaddr_in*>(rdma_get_local_addr(lid))->sin_port);
  }
  void shutdown() {
    for (;;) {  // reject what is still queued (non-blocking reads until an empty one)
      rdma_cm_event* e = nullptr;
      if (p().get_cm_event(lch, &e)) break;
      rdma_cm_id* req = e->event == RDMA_CM_EVENT_CONNECT_REQUEST ? e->id : nullptr;
      if (req) p().reject(req, nullptr, 0);
      p().ack_cm_event(e);
      if (req) p().destroy_id(req);
    }
    if (p().destroy_id(lid)) fail("rdma_destroy_id");
    p().destroy_event_channel(lch);
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
    if (p().ack_cm_event(e)) fail("rdma_ack_cm_event");
    rdma_event_channel* ch = new_channel();
    if (p().migrate_id(id, ch)) fail("rdma_migrate_id");
    rdma_conn_param param = bench::raw_conn_param();
    if (p().accept(id, &param)) fail("rdma_accept");
    if (next_event(ch) != RDMA_CM_EVENT_ESTABLISHED) fail("not established");
    if (p().disconnect(id)) fail("rdma_disconnect");
    if (next_event(ch) != RDMA_CM_EVENT_DISCONNECTED) fail("not closed");
    release(id, q, ch);
  }

  void connect_cycle() {
    sockaddr_in to = ipv4(ip, client_port_number);
    rdma_event_channel* ch = new_channel();
    rdma_cm_id* id = nullptr;
    if (p().create_id(ch, &id, nullptr, RDMA_PS_TCP)) fail("rdma_create_id");
    if (p().resolve_addr(id, nullptr, reinterpret_cast<sockaddr*>(&to), 1000)) fail("rdma_resolve_addr");
    rdma_cm_event* e = wait_event(ch);
    if (e->event != RDMA_CM_EVENT_ADDR_RESOLVED) fail("address");
    if (p().resolve_route(id, 1000)) fail("rdma_resolve_route");
    if (p().ack_cm_event(e)) fail("rdma_ack_cm_event");
    e = wait_event(ch);
    if (e->event != RDMA_CM_EVENT_ROUTE_RESOLVED) fail("route");
    Queues q = create_queues(id, pd);
    if (p().ack_cm_event(e)) fail("rdma_ack_cm_event");
    rdma_conn_param param = bench::raw_conn_param();
    if (p().connect(id, &param)) fail("rdma_connect");
    if (next_event(ch) != RDMA_CM_EVENT_ESTABLISHED) fail("not established");
    if (p().disconnect(id)) fail("rdma_disconnect");
    if (next_event(ch) != RDMA_CM_EVENT_DISCONNECTED) fail("not closed");
    release(id, q, ch);
  }

  // ---- data path: a connection made as connect_cycle does, two registrations.
  alignas(64) std::byte local_mem[4096]{};
  alignas(64) std::byte remote_mem[4096]{};
  rdma_event_channel* dch = nullptr;
  rdma_cm_id* did = nullptr;
  Queues dq{};
  ibv_mr* lmr = nullptr;
  ibv_mr* rmr = nullptr;
  std::uint64_t raddr = 0;
  std::uint32_t rkey = 0;

  void open_data() {
    sockaddr_in to = ipv4(ip, client_port_number);
    dch = new_channel();
    if (p().create_id(dch, &did, nullptr, RDMA_PS_TCP)) fail("rdma_create_id");
    if (p().resolve_addr(did, nullptr, reinterpret_cast<sockaddr*>(&to), 1000)) fail("rdma_resolve_addr");
    if (next_event(dch) != RDMA_CM_EVENT_ADDR_RESOLVED) fail("address");
    if (p().resolve_route(did, 1000)) fail("rdma_resolve_route");
    if (next_event(dch) != RDMA_CM_EVENT_ROUTE_RESOLVED) fail("route");
    dq = create_queues(did, pd);
    rdma_conn_param param = bench::raw_conn_param();
    if (p().connect(did, &param)) fail("rdma_connect");
    if (next_event(dch) != RDMA_CM_EVENT_ESTABLISHED) fail("not established");
    lmr = p().reg_mr(pd, local_mem, sizeof local_mem, IBV_ACCESS_LOCAL_WRITE);
    rmr = p().reg_mr(pd, remote_mem, sizeof remote_mem,
                   IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ);
    if (!lmr || !rmr) fail("ibv_reg_mr");
    raddr = reinterpret_cast<std::uintptr_t>(rmr->addr);  // what the peer's descriptor says
    rkey = rmr->rkey;
  }
  void close_data() {
    if (p().dereg_mr(lmr) || p().dereg_mr(rmr)) fail("ibv_dereg_mr");
    if (p().disconnect(did)) fail("rdma_disconnect");
    if (next_event(dch) != RDMA_CM_EVENT_DISCONNECTED) fail("not closed");
    release(did, dq, dch);
  }
  void complete_one() {
    ibv_wc wc;
    int n;
    while ((n = p().poll_cq(dq.cq, 1, &wc)) == 0) {
    }
    if (n < 0) fail("ibv_poll_cq");
    if (wc.status != IBV_WC_SUCCESS) fail("completion");
  }
  void post_rdma(ibv_wr_opcode opcode) {
    ibv_sge sge;
    sge.addr = reinterpret_cast<std::uintptr_t>(local_mem);
    sge.length = msg;
    sge.lkey = lmr->lkey;
    ibv_send_wr wr{};
    wr.wr_id = op_context;
    wr.opcode = opcode;
    wr.sg_list = &sge;
    wr.num_sge = 1;
    wr.send_flags = IBV_SEND_SIGNALED;
    wr.wr.rdma.remote_addr = raddr;
    wr.wr.rdma.rkey = rkey;
    ibv_send_wr* bad = nullptr;
    if (p().post_send(did->qp, &wr, &bad)) fail("ibv_post_send");
  }
  void read_cycle() {
    post_rdma(IBV_WR_RDMA_READ);
    complete_one();
  }
  void write_cycle() {
    post_rdma(IBV_WR_RDMA_WRITE);
    complete_one();
  }
  void send_cycle() {
    ibv_sge sge;
    sge.addr = reinterpret_cast<std::uintptr_t>(local_mem);
    sge.length = msg;
    sge.lkey = lmr->lkey;
    ibv_send_wr wr{};
    wr.wr_id = op_context;
    wr.opcode = IBV_WR_SEND;
    wr.sg_list = &sge;
    wr.num_sge = 1;
    wr.send_flags = IBV_SEND_SIGNALED;
    ibv_send_wr* bad = nullptr;
    if (p().post_send(did->qp, &wr, &bad)) fail("ibv_post_send");
    complete_one();
  }
  void recv_cycle() {
    ibv_sge sge;
    sge.addr = reinterpret_cast<std::uintptr_t>(local_mem);
    sge.length = msg;
    sge.lkey = lmr->lkey;
    ibv_recv_wr wr{};
    wr.wr_id = op_context;
    wr.sg_list = &sge;
    wr.num_sge = 1;
    ibv_recv_wr* bad = nullptr;
    if (p().post_recv(did->qp, &wr, &bad)) fail("ibv_post_recv");
    complete_one();
  }
};

// The op is parsed once: comparing strings inside the loop would cost more than a post.
enum class Op { listen, accept, connect, read, write, send, recv };

Op parse_op(const std::string& op) {
  if (op == "listen") return Op::listen;
  if (op == "accept") return Op::accept;
  if (op == "connect") return Op::connect;
  if (op == "read") return Op::read;
  if (op == "write") return Op::write;
  if (op == "send") return Op::send;
  if (op == "recv") return Op::recv;
  bench::die("op", op);
}
bool is_data_op(Op op) { return op >= Op::read; }

template <class Side> void open_for(Side& side, Op op) {
  if (op == Op::accept) side.open_listener();
  if (is_data_op(op)) side.open_data();
}
template <class Side> void close_for(Side& side, Op op) {
  if (op == Op::accept) side.close_listener();
  if (is_data_op(op)) side.close_data();
}
template <class Side> void one_cycle(Side& side, Op op) {
  switch (op) {
    case Op::listen: return side.listen_cycle();
    case Op::accept: return side.accept_cycle();
    case Op::connect: return side.connect_cycle();
    case Op::read: return side.read_cycle();
    case Op::write: return side.write_cycle();
    case Op::send: return side.send_cycle();
    case Op::recv: return side.recv_cycle();
  }
}

template <class Side> void run(Side& side, Op op, int n, bool measure) {
  open_for(side, op);
  one_cycle(side, op);  // warm up: lazy binding, first allocations
  if (measure) CALLGRIND_START_INSTRUMENTATION;
  for (int i = 0; i < n; ++i) one_cycle(side, op);
  if (measure) CALLGRIND_STOP_INSTRUMENTATION;
  close_for(side, op);
}

template <class Side> std::vector<unsigned char> trace_of(Op op) {
  fake::reset();
  Side side;
  open_for(side, op);
  fake::world.trace_len = 0;
  one_cycle(side, op);
  std::vector<unsigned char> t(fake::world.trace, fake::world.trace + fake::world.trace_len);
  close_for(side, op);
  return t;
}

}  // namespace

int main(int argc, char** argv) {
  rpmapp::detail::ProviderOverride use_fake(fake::provider);
  const std::string what = argc > 1 ? argv[1] : "check";
  if (what == "check") {
    int bad = 0;
    for (const char* op : {"listen", "accept", "connect", "read", "write", "send", "recv"}) {
      auto a = trace_of<RpmappSide>(parse_op(op));
      auto b = trace_of<HandSide>(parse_op(op));
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
  const Op op = parse_op(argv[2]);
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
