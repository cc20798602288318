// Benchmarks 2 and 3: connection setup on $SOFTROCE_IP, client and server threads in one
// process, each implementation talking to its own server (servers.hpp):
//   seq  K times: connect, established, disconnect, closed, close (the blocking APIs);
//   conc max(K, 2C) connections, C in flight at once: rpmapp ConnReq::start +
//        PendingConnReq and Conn fds in epoll; raw librdmacm async ids on one event
//        channel; librpma with its blocking rpma_conn_req_new (resolution) and its conn
//        fds in epoll (the baseline).
// Benchmark 7 compares servers (servers.hpp, server_names) with one client, the raw
// librdmacm one of conc:
//   serve max(K, 2C) connections, C in flight, to each server in turn (interleaved): the
//         hand-written raw librdmacm server, rpmapp in a hand-written epoll loop, rpmapp's
//         EventLoop with handlers (and later coroutines).
// Usage: bench_connect seq  [reps] [K]
//        bench_connect conc [reps] [K] [C...]
//        bench_connect serve [reps] [K] [C...]
//        bench_connect one VARIANT K [C]  K connections with one implementation only,
//                                        untimed (for counting its system calls):
//                                        rpmapp, rpmapp-defaults, librpma or raw;
//                                        sequential, or as conc with C in flight
//        bench_connect serve-one SERVER K   K sequential raw connections to one server of
//                                        server_names, untimed (system calls, as `one`)
//        bench_connect serve-names       prints server_names, one a line
//        bench_connect queues [reps] [N]  what a QP/CQ pool could save: N times create and
//                                        destroy a CQ and a QP (raw verbs, row 2's sizes),
//                                        then N sequential raw connections; prints M lines
//                                        (medians, µs): queues_us, queues_cq_us (the CQ
//                                        alone), queues_conn_us
//        bench_connect pool [reps] [K]  K sequential raw connections against K with a CQ and
//                                        a QP kept across connections (PooledRawServer and
//                                        seq_raw_pooled): what a pool of queues gives
//                                        when a QP is reused as soon as its connection
//                                        is closed, before the CM's time-wait ends
//        bench_connect isolation [reps] [K]  K sequential rpmapp connections to a server
//                                        that accepts each on a protection domain of its
//                                        own (ConnConfig::own_protection_domain) against K
//                                        to the same server on its Peer's domain (rows
//                                        "isolation": rpmapp and rpmapp-shared)
//        bench_connect timewait [N]      N sequential raw connections whose client waits,
//                                        after DISCONNECTED, for TIMEWAIT_EXIT: prints M
//                                        lines timewait_ms (median) and timewait_range_ms,
//                                        how long a pooled QP must wait before its reuse
// Prints R lines (common.hpp): connections per second, measured from the first connect
// until the client saw every connection closed and the server released all of them.
#include "anchors.hpp"
#include "servers.hpp"

#include <algorithm>
#include <memory>
#include <optional>
#include <vector>

namespace bench {
namespace {

const char* ip = nullptr;
constexpr const char* rpmapp_port = "7471";
constexpr const char* librpma_port = "7472";
constexpr const char* raw_port = "7473";
/// serve: server_names[i] listens on serve_port_base + i.
constexpr int serve_port_base = 7474;

/// Waits until `server` has released `target` connections.
void await_server(const Server& server, long target) {
  while (server.closed() < target) std::this_thread::yield();
}

/// What rows 2 and 3 ask of rpmapp, client and server: not to pay per connection for what
/// the raw program does without. Its ids share one event channel, so rpmapp's connections
/// reuse the channels of released ones; its CQs have no completion channel, nor do
/// rpmapp's, which also reuse the CQs of released connections (the raw program makes a CQ
/// per connection: what rpmapp's options allow beyond it). `one rpmapp-defaults` counts the
/// system calls of ConnConfig's defaults.
rpmapp::ConnConfig lean_config() {
  rpmapp::ConnConfig config;
  config.reuse_event_channel = true;
  config.completion_channel = false;
  // BENCH_NO_CQ_REUSE=1: without it, for comparing runs (bench/performance-notes.md)
  const char* off = std::getenv("BENCH_NO_CQ_REUSE");
  config.reuse_completion_queues = off == nullptr || std::string_view(off) != "1";
  return config;
}
rpmapp::ConnConfig rpmapp_config = lean_config();

// ---------------------------------------------------------------- sequential clients

void seq_rpmapp(const rpmapp::Peer& peer, const char* port = rpmapp_port) {
  auto req = must(rpmapp::ConnReq::to(peer, ip, port, rpmapp_config), "ConnReq::to");
  auto conn = must(std::move(req).connect(), "ConnReq::connect");
  if (must(conn.next_event(), "Conn::next_event") != rpmapp::ConnEvent::established)
    die("rpmapp", "not established");
  must(conn.disconnect(), "Conn::disconnect");
  if (must(conn.next_event(), "Conn::next_event") != rpmapp::ConnEvent::closed)
    die("rpmapp", "not closed");
  must(std::move(conn).close(), "Conn::close");
}

void seq_librpma(rpma_peer* peer) {
  rpma_conn_req* req = nullptr;
  check(rpma_conn_req_new(peer, ip, librpma_port, nullptr, &req), "rpma_conn_req_new");
  rpma_conn* conn = nullptr;
  check(rpma_conn_req_connect(&req, nullptr, &conn), "rpma_conn_req_connect");
  rpma_conn_event ev{};
  check(rpma_conn_next_event(conn, &ev), "rpma_conn_next_event");
  if (ev != RPMA_CONN_ESTABLISHED) die("librpma", "not established");
  check(rpma_conn_disconnect(conn), "rpma_conn_disconnect");
  check(rpma_conn_next_event(conn, &ev), "rpma_conn_next_event");
  if (ev != RPMA_CONN_CLOSED) die("librpma", "not closed");
  check(rpma_conn_delete(&conn), "rpma_conn_delete");
}

rdma_cm_event_type raw_wait(rdma_event_channel* ch) {
  rdma_cm_event* e = nullptr;
  check(rdma_get_cm_event(ch, &e), "rdma_get_cm_event");
  rdma_cm_event_type type = e->event;
  rdma_ack_cm_event(e);
  return type;
}

rdma_addrinfo* raw_resolve_info(const char* port) {
  rdma_addrinfo hints{};
  hints.ai_flags = RAI_NUMERICHOST;
  hints.ai_port_space = RDMA_PS_TCP;
  hints.ai_qp_type = IBV_QPT_RC;
  rdma_addrinfo* ai = nullptr;
  check(rdma_getaddrinfo(ip, port, &hints, &ai), "rdma_getaddrinfo");
  return ai;
}

/// A new id on `ch`, its address and route to ip:port resolved (blocking).
rdma_cm_id* raw_routed_id(rdma_event_channel* ch, const char* port) {
  rdma_addrinfo* ai = raw_resolve_info(port);
  rdma_cm_id* id = nullptr;
  check(rdma_create_id(ch, &id, nullptr, RDMA_PS_TCP), "rdma_create_id");
  check(rdma_resolve_addr(id, ai->ai_src_addr, ai->ai_dst_addr, 1000), "rdma_resolve_addr");
  rdma_freeaddrinfo(ai);
  if (raw_wait(ch) != RDMA_CM_EVENT_ADDR_RESOLVED) die("raw", "address not resolved");
  check(rdma_resolve_route(id, 1000), "rdma_resolve_route");
  if (raw_wait(ch) != RDMA_CM_EVENT_ROUTE_RESOLVED) die("raw", "route not resolved");
  return id;
}

/// Raw blocking client: one event channel (created once) for every connection. With
/// `timewait_ms`, the client keeps its id after DISCONNECTED until rdma_cm reports
/// TIMEWAIT_EXIT (the queue pair may be reused from then on) and stores the time between
/// the two there (bench_connect timewait).
void seq_raw(rdma_event_channel* ch, ibv_pd* pd, const char* port = raw_port,
             double* timewait_ms = nullptr) {
  rdma_cm_id* id = raw_routed_id(ch, port);
  ibv_cq* cq = check_ptr(ibv_create_cq(id->verbs, 10, nullptr, nullptr, 0), "ibv_create_cq");
  ibv_qp_init_attr attr = raw_qp_attr(cq);
  check(rdma_create_qp(id, pd, &attr), "rdma_create_qp");
  rdma_conn_param param = raw_conn_param();
  check(rdma_connect(id, &param), "rdma_connect");
  if (raw_wait(ch) != RDMA_CM_EVENT_ESTABLISHED) die("raw", "not established");
  check(rdma_disconnect(id), "rdma_disconnect");
  if (raw_wait(ch) != RDMA_CM_EVENT_DISCONNECTED) die("raw", "not closed");
  if (timewait_ms != nullptr) {
    const double t0 = now_s();
    pollfd pfd{ch->fd, POLLIN, 0};
    if (::poll(&pfd, 1, 30000) != 1) die("timewait", "no TIMEWAIT_EXIT within 30 s");
    if (raw_wait(ch) != RDMA_CM_EVENT_TIMEWAIT_EXIT) die("timewait", "another event than TIMEWAIT_EXIT");
    *timewait_ms = (now_s() - t0) * 1e3;
  }
  rdma_destroy_qp(id);
  check(ibv_destroy_cq(cq), "ibv_destroy_cq");
  check(rdma_destroy_id(id), "rdma_destroy_id");
}

/// seq_raw with a CQ and a QP from `pool` (made on first use, kept after): INIT before
/// rdma_connect, RTR and RTS on CONNECT_RESPONSE, then rdma_establish; RESET after.
void seq_raw_pooled(rdma_event_channel* ch, ibv_pd* pd, std::vector<PooledQueues>& pool,
                    const char* port) {
  rdma_cm_id* id = raw_routed_id(ch, port);
  if (pool.empty()) pool.push_back(make_pooled_queues(id->verbs, pd));
  const PooledQueues q = pool.back();
  pool.pop_back();
  move_qp(id, q.qp, IBV_QPS_INIT);
  rdma_conn_param param = raw_conn_param();
  param.qp_num = q.qp->qp_num;
  check(rdma_connect(id, &param), "rdma_connect");
  if (raw_wait(ch) != RDMA_CM_EVENT_CONNECT_RESPONSE) die("pooled", "no connect response");
  move_qp(id, q.qp, IBV_QPS_RTR);
  move_qp(id, q.qp, IBV_QPS_RTS);
  check(rdma_establish(id), "rdma_establish");
  // 8 bytes inline: the server counts them (its recv was posted before it accepted)
  std::uint64_t payload = 0x706f6f6c6564;
  ibv_sge sge{reinterpret_cast<std::uintptr_t>(&payload), sizeof payload, 0};
  ibv_send_wr wr{}, *bad = nullptr;
  wr.opcode = IBV_WR_SEND;
  wr.send_flags = IBV_SEND_INLINE | IBV_SEND_SIGNALED;
  wr.sg_list = &sge;
  wr.num_sge = 1;
  check(ibv_post_send(q.qp, &wr, &bad), "ibv_post_send");
  ibv_wc wc{};
  while (ibv_poll_cq(q.cq, 1, &wc) == 0) {
  }
  if (wc.status != IBV_WC_SUCCESS) die("pooled", ibv_wc_status_str(wc.status));
  check(rdma_disconnect(id), "rdma_disconnect");
  if (raw_wait(ch) != RDMA_CM_EVENT_DISCONNECTED) die("pooled", "not closed");
  reset_qp(q);
  pool.push_back(q);
  check(rdma_destroy_id(id), "rdma_destroy_id");
}

// ---------------------------------------------------------------- concurrent clients

/// An epoll set whose keys are slot numbers.
struct Epoll {
  int fd = epoll_create1(0);
  ~Epoll() { ::close(fd); }
  void add(int f, std::uint64_t key) {
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.u64 = key;
    if (epoll_ctl(fd, EPOLL_CTL_ADD, f, &ev) != 0) die("epoll_ctl add", std::strerror(errno));
  }
  void del(int f) {
    if (epoll_ctl(fd, EPOLL_CTL_DEL, f, nullptr) != 0) die("epoll_ctl del", std::strerror(errno));
  }
  int wait(epoll_event* out, int n) {
    for (;;) {
      int r = epoll_wait(fd, out, n, -1);
      if (r >= 0) return r;
      if (errno != EINTR) die("epoll_wait", std::strerror(errno));
    }
  }
};

/// rpmapp: slot i holds a PendingConnReq until resolution is done, then a Conn; the fd
/// (the request's own event channel) stays the same and stays in epoll throughout; one
/// try_wait / try_next_event per readiness (level-triggered), as the librpma client.
void conc_rpmapp(const rpmapp::Peer& peer, int total, int inflight) {
  struct Slot {
    std::optional<rpmapp::PendingConnReq> pending;
    std::optional<rpmapp::Conn> conn;
    int fd = -1;
  };
  std::vector<Slot> slots(inflight);
  Epoll ep;
  int started = 0, done = 0;
  auto launch = [&](int i) {
    auto p = must(rpmapp::ConnReq::start(peer, ip, rpmapp_port, rpmapp_config), "ConnReq::start");
    slots[i].fd = must(p.fd(), "PendingConnReq::fd");
    slots[i].pending.emplace(std::move(p));
    ep.add(slots[i].fd, static_cast<std::uint64_t>(i));
    ++started;
  };
  for (int i = 0; i < inflight && started < total; ++i) launch(i);
  epoll_event events[64];
  while (done < total) {
    int n = ep.wait(events, 64);
    for (int k = 0; k < n; ++k) {
      Slot& s = slots[events[k].data.u64];
      const int i = static_cast<int>(events[k].data.u64);
      if (s.pending) {
        auto req = std::move(*s.pending).try_wait();
        if (!req && req.error() == rpmapp::errc::no_event) continue;
        s.pending.reset();
        s.conn.emplace(must(must(std::move(req), "try_wait").connect(), "ConnReq::connect"));
        continue;
      }
      if (!s.conn) continue;
      auto ev = s.conn->try_next_event();  // one per readiness: epoll is level-triggered
      if (!ev && ev.error() == rpmapp::errc::no_event) continue;
      auto what = must(std::move(ev), "Conn::try_next_event");
      if (what == rpmapp::ConnEvent::established) {
        must(s.conn->disconnect(), "Conn::disconnect");
      } else if (what == rpmapp::ConnEvent::closed) {
        ep.del(s.fd);
        must(std::move(*s.conn).close(), "Conn::close");
        s.conn.reset();
        ++done;
        if (started < total) launch(i);
      } else {
        die("rpmapp", std::string(rpmapp::to_string(what)));
      }
    }
  }
}

/// librpma: rpma_conn_req_new blocks while it resolves, so new requests are created one
/// at a time; established/closed events come through the conn fds in epoll.
void conc_librpma(rpma_peer* peer, int total, int inflight) {
  std::vector<rpma_conn*> slots(inflight, nullptr);
  Epoll ep;
  int started = 0, done = 0, open = 0;
  auto launch = [&](int i) {
    rpma_conn_req* req = nullptr;
    check(rpma_conn_req_new(peer, ip, librpma_port, nullptr, &req), "rpma_conn_req_new");
    check(rpma_conn_req_connect(&req, nullptr, &slots[i]), "rpma_conn_req_connect");
    int fd = -1;
    check(rpma_conn_get_event_fd(slots[i], &fd), "rpma_conn_get_event_fd");
    ep.add(fd, static_cast<std::uint64_t>(i));
    ++started;
    ++open;
  };
  for (int i = 0; i < inflight && started < total; ++i) launch(i);
  epoll_event events[64];
  while (done < total) {
    int n = ep.wait(events, 64);
    for (int k = 0; k < n; ++k) {
      const int i = static_cast<int>(events[k].data.u64);
      if (slots[i] == nullptr) continue;
      rpma_conn_event ev{};
      check(rpma_conn_next_event(slots[i], &ev), "rpma_conn_next_event");
      if (ev == RPMA_CONN_ESTABLISHED) {
        check(rpma_conn_disconnect(slots[i]), "rpma_conn_disconnect");
      } else if (ev == RPMA_CONN_CLOSED) {
        int fd = -1;
        check(rpma_conn_get_event_fd(slots[i], &fd), "rpma_conn_get_event_fd");
        ep.del(fd);
        check(rpma_conn_delete(&slots[i]), "rpma_conn_delete");
        ++done;
        if (started < total) launch(i);
      } else {
        die("librpma", rpma_utils_conn_event_2str(ev));
      }
    }
  }
}

/// Raw librdmacm: every id on one non-blocking event channel; the id's context is its slot.
void conc_raw(ibv_pd* pd, int total, int inflight, const char* port = raw_port) {
  rdma_event_channel* ch = check_ptr(rdma_create_event_channel(), "rdma_create_event_channel");
  set_nonblocking(ch->fd);
  int started = 0, done = 0;
  auto launch = [&] {
    rdma_addrinfo* ai = raw_resolve_info(port);  // per connection, as rpmapp and librpma
    rdma_cm_id* id = nullptr;
    check(rdma_create_id(ch, &id, nullptr, RDMA_PS_TCP), "rdma_create_id");
    check(rdma_resolve_addr(id, ai->ai_src_addr, ai->ai_dst_addr, 1000), "rdma_resolve_addr");
    rdma_freeaddrinfo(ai);
    ++started;
  };
  for (int i = 0; i < inflight && started < total; ++i) launch();
  while (done < total) {
    pollfd p{ch->fd, POLLIN, 0};
    if (::poll(&p, 1, -1) < 0 && errno != EINTR) die("poll", std::strerror(errno));
    for (;;) {
      rdma_cm_event* e = nullptr;
      if (rdma_get_cm_event(ch, &e) != 0) {
        if (errno == EAGAIN || errno == EWOULDBLOCK) break;
        die("rdma_get_cm_event", std::strerror(errno));
      }
      rdma_cm_id* id = e->id;
      const rdma_cm_event_type type = e->event;
      rdma_ack_cm_event(e);
      switch (type) {
        case RDMA_CM_EVENT_ADDR_RESOLVED:
          check(rdma_resolve_route(id, 1000), "rdma_resolve_route");
          break;
        case RDMA_CM_EVENT_ROUTE_RESOLVED: {
          ibv_cq* cq = check_ptr(ibv_create_cq(id->verbs, 10, nullptr, nullptr, 0), "ibv_create_cq");
          ibv_qp_init_attr attr = raw_qp_attr(cq);
          check(rdma_create_qp(id, pd, &attr), "rdma_create_qp");
          id->context = cq;
          rdma_conn_param param = raw_conn_param();
          check(rdma_connect(id, &param), "rdma_connect");
          break;
        }
        case RDMA_CM_EVENT_ESTABLISHED:
          check(rdma_disconnect(id), "rdma_disconnect");
          break;
        case RDMA_CM_EVENT_DISCONNECTED: {
          auto* cq = static_cast<ibv_cq*>(id->context);
          rdma_destroy_qp(id);
          check(ibv_destroy_cq(cq), "ibv_destroy_cq");
          check(rdma_destroy_id(id), "rdma_destroy_id");
          ++done;
          if (started < total) launch();
          break;
        }
        default:
          die("raw", rdma_event_str(type));
      }
    }
  }
  rdma_destroy_event_channel(ch);
}

}  // namespace
}  // namespace bench

int main(int argc, char** argv) {
  using namespace bench;
  const std::string mode = argc > 1 ? argv[1] : "seq";
  if (mode == "serve-names") {  // for bench/vm-run
    for (const char* name : server_names) std::printf("%s\n", name);
    return 0;
  }
  const int reps = argc > 2 ? std::atoi(argv[2]) : 7;
  const int total = argc > 3 ? std::atoi(argv[3]) : 20;
  std::vector<int> inflights;
  for (int i = 4; i < argc; ++i) inflights.push_back(std::atoi(argv[i]));
  if (inflights.empty()) inflights = {1, 4, 16, 64};
  if (mode != "seq" && mode != "conc" && mode != "serve" && mode != "one" && mode != "serve-one" &&
      mode != "queues" && mode != "pool" && mode != "timewait" && mode != "isolation")
    die("usage", "bench_connect seq|conc|serve [reps] [K] [C...] | one VARIANT K [C] | serve-one SERVER K | queues|pool|isolation [reps] [K] | timewait [N]");
  // (names, not a structured binding: lambdas use them, and clang before 16 cannot
  // capture a structured binding)
  Anchors anchors = open_anchors();
  auto& anchor_ip = anchors.ip;
  auto& peer = anchors.peer;
  auto& ctx = anchors.ctx;
  auto& rpeer = anchors.rpeer;
  ip = anchor_ip;
  ibv_pd* pd = check_ptr(ibv_alloc_pd(ctx), "ibv_alloc_pd");
  rdma_event_channel* raw_ch = check_ptr(rdma_create_event_channel(), "rdma_create_event_channel");

  if (mode == "one") {  // argv: one VARIANT K
    const std::string v = argc > 2 ? argv[2] : "";
    const int k = argc > 3 ? std::atoi(argv[3]) : 10;
    std::unique_ptr<Server> server;
    if (v == "rpmapp-defaults") rpmapp_config = {};
    if (v == "rpmapp" || v == "rpmapp-defaults")
      server = std::make_unique<RpmappServer>(peer, ip, rpmapp_port, rpmapp_config);
    else if (v == "librpma") server = std::make_unique<LibrpmaServer>(rpeer, ip, librpma_port);
    else if (v == "raw") server = std::make_unique<RawServer>(ip, raw_port);
    else die("variant", v);
    server->start();
    const int c = argc > 4 ? std::atoi(argv[4]) : 0;
    if (c > 0) {
      if (v == "rpmapp" || v == "rpmapp-defaults") conc_rpmapp(peer, k, c);
      else if (v == "librpma") conc_librpma(rpeer, k, c);
      else conc_raw(pd, k, c);
    }
    for (int i = 0; c == 0 && i < k; ++i) {
      if (v == "rpmapp" || v == "rpmapp-defaults") seq_rpmapp(peer);
      else if (v == "librpma") seq_librpma(rpeer);
      else seq_raw(raw_ch, pd);
    }
    await_server(*server, k);
    server->stop();
    server.reset();
    rdma_destroy_event_channel(raw_ch);
    ibv_dealloc_pd(pd);
    check(rpma_peer_delete(&rpeer), "rpma_peer_delete");
    return 0;
  }

  auto finish = [&] {
    rdma_destroy_event_channel(raw_ch);
    ibv_dealloc_pd(pd);
    check(rpma_peer_delete(&rpeer), "rpma_peer_delete");
  };
  // One rep: `work` makes `n` connections; timed until the server released them all.
  auto rate = [](Server& server, int n, auto work) {
    return [&server, n, work]() {
      const long target = server.closed() + n;
      const double t0 = now_s();
      work(n);
      await_server(server, target);
      return n / (now_s() - t0);
    };
  };

  if (mode == "serve" || mode == "serve-one") {
    std::vector<std::unique_ptr<Server>> servers;
    std::vector<std::string> ports;
    for (std::size_t i = 0; i < server_names.size(); ++i) {
      ports.push_back(std::to_string(serve_port_base + static_cast<int>(i)));
      servers.push_back(make_server(server_names[i], peer, ip, ports.back().c_str()));
      servers.back()->start();
    }
    if (mode == "serve-one") {  // argv: serve-one SERVER K
      const std::string name = argc > 2 ? argv[2] : "";
      const int k = argc > 3 ? std::atoi(argv[3]) : 10;
      std::size_t i = 0;
      while (i < server_names.size() && name != server_names[i]) ++i;
      if (i == server_names.size()) die("server", name);
      for (int n = 0; n < k; ++n) seq_raw(raw_ch, pd, ports[i].c_str());
      await_server(*servers[i], k);
    } else {
      for (int c : inflights) {
        const int n = std::max(total, 2 * c);
        std::vector<std::pair<std::string, std::function<double()>>> run;
        for (std::size_t i = 0; i < servers.size(); ++i) {
          const char* port = ports[i].c_str();
          run.emplace_back(server_names[i], rate(*servers[i], n, [pd, c, port](int k) { conc_raw(pd, k, c, port); }));
        }
        interleave_named("serve", "C=" + std::to_string(c), "conn/s", reps, run);
      }
    }
    for (auto& s : servers) s->stop();
    servers.clear();
    finish();
    return 0;
  }

  if (mode == "isolation") {  // argv: isolation [reps] [K]: a domain per connection or not
    const char* isolated_port = "7479";
    rpmapp::ConnConfig isolated_config = rpmapp_config;
    isolated_config.own_protection_domain = true;
    auto isolated = std::make_unique<RpmappServer>(peer, ip, isolated_port, isolated_config);
    auto shared = std::make_unique<RpmappServer>(peer, ip, rpmapp_port, rpmapp_config);
    isolated->start();
    shared->start();
    interleave_named("isolation", "K=" + std::to_string(total), "conn/s", reps,
                     {{"rpmapp", rate(*isolated, total, [&](int n) {
                         for (int i = 0; i < n; ++i) seq_rpmapp(peer, isolated_port);
                       })},
                      {"shared", rate(*shared, total, [&](int n) { for (int i = 0; i < n; ++i) seq_rpmapp(peer); })}});
    isolated->stop();
    shared->stop();
    isolated.reset();
    shared.reset();
    finish();
    return 0;
  }

  if (mode == "pool") {  // argv: pool [reps] [K]: seq_raw against seq_raw_pooled
    const char* pooled_port = "7480";
    auto plain = std::make_unique<RawServer>(ip, raw_port);
    auto pooled = std::make_unique<PooledRawServer>(ip, pooled_port);
    plain->start();
    pooled->start();
    std::vector<PooledQueues> pool;
    interleave_named("pool", "K=" + std::to_string(total), "conn/s", reps,
                     {{"raw", rate(*plain, total, [&](int n) { for (int i = 0; i < n; ++i) seq_raw(raw_ch, pd); })},
                      {"raw-pooled", rate(*pooled, total, [&](int n) {
                         for (int i = 0; i < n; ++i) seq_raw_pooled(raw_ch, pd, pool, pooled_port);
                       })}});
    plain->stop();
    pooled->stop();
    if (pooled->received() != pooled->closed())
      die("pool", std::to_string(pooled->received()) + " sends arrived over " +
                      std::to_string(pooled->closed()) + " pooled connections");
    std::printf("M\tpool_checked\t%ld connections on recycled queues, each carried a send\n",
                pooled->closed());
    plain.reset();
    pooled.reset();
    for (PooledQueues q : pool) free_pooled_queues(q);
    finish();
    return 0;
  }

  if (mode == "timewait") {  // argv: timewait [N]
    auto server = std::make_unique<RawServer>(ip, raw_port);
    server->start();
    const int n = argc > 2 ? std::atoi(argv[2]) : 3;
    std::vector<double> waits;
    for (int i = 0; i < n; ++i) {
      double ms = 0;
      seq_raw(raw_ch, pd, raw_port, &ms);
      waits.push_back(ms);
    }
    await_server(*server, n);
    std::sort(waits.begin(), waits.end());
    std::printf("M\ttimewait_ms\t%.0f\nM\ttimewait_range_ms\t%.0f-%.0f over %d connections\n",
                waits[waits.size() / 2], waits.front(), waits.back(), n);
    server->stop();
    server.reset();
    finish();
    return 0;
  }

  if (mode == "queues") {  // argv: queues [reps] [N]
    auto server = std::make_unique<RawServer>(ip, raw_port);
    server->start();
    std::vector<double> queues, cqs, conns;
    for (int rep = 0; rep < reps; ++rep) {
      double t0 = now_s();
      for (int i = 0; i < total; ++i) {
        ibv_cq* cq = check_ptr(ibv_create_cq(ctx, 10, nullptr, nullptr, 0), "ibv_create_cq");
        ibv_qp_init_attr attr = raw_qp_attr(cq);
        ibv_qp* qp = check_ptr(ibv_create_qp(pd, &attr), "ibv_create_qp");
        check(ibv_destroy_qp(qp), "ibv_destroy_qp");
        check(ibv_destroy_cq(cq), "ibv_destroy_cq");
      }
      queues.push_back((now_s() - t0) * 1e6 / total);
      t0 = now_s();
      for (int i = 0; i < total; ++i) {
        ibv_cq* cq = check_ptr(ibv_create_cq(ctx, 10, nullptr, nullptr, 0), "ibv_create_cq");
        check(ibv_destroy_cq(cq), "ibv_destroy_cq");
      }
      cqs.push_back((now_s() - t0) * 1e6 / total);
      const long target = server->closed() + total;
      t0 = now_s();
      for (int i = 0; i < total; ++i) seq_raw(raw_ch, pd);
      await_server(*server, target);
      conns.push_back((now_s() - t0) * 1e6 / total);
    }
    std::sort(queues.begin(), queues.end());
    std::sort(cqs.begin(), cqs.end());
    std::sort(conns.begin(), conns.end());
    std::printf("M\tqueues_us\t%.0f\nM\tqueues_cq_us\t%.0f\nM\tqueues_conn_us\t%.0f\n",
                queues[queues.size() / 2], cqs[cqs.size() / 2], conns[conns.size() / 2]);
    server->stop();
    server.reset();
    finish();
    return 0;
  }

  auto s_rpmapp = std::make_unique<RpmappServer>(peer, ip, rpmapp_port, rpmapp_config);
  auto s_librpma = std::make_unique<LibrpmaServer>(rpeer, ip, librpma_port);
  auto s_raw = std::make_unique<RawServer>(ip, raw_port);
  s_rpmapp->start();
  s_librpma->start();
  s_raw->start();

  if (mode == "seq") {
    interleave("seq", "K=" + std::to_string(total), "conn/s", reps,
               {rate(*s_rpmapp, total, [&](int n) { for (int i = 0; i < n; ++i) seq_rpmapp(peer); }),
                rate(*s_librpma, total, [&](int n) { for (int i = 0; i < n; ++i) seq_librpma(rpeer); }),
                rate(*s_raw, total, [&](int n) { for (int i = 0; i < n; ++i) seq_raw(raw_ch, pd); })});
  } else {
    for (int c : inflights) {
      const int n = std::max(total, 2 * c);  // at least two generations of C
      interleave("conc", "C=" + std::to_string(c), "conn/s", reps,
                 {rate(*s_rpmapp, n, [&, c](int k) { conc_rpmapp(peer, k, c); }),
                  rate(*s_librpma, n, [&, c](int k) { conc_librpma(rpeer, k, c); }),
                  rate(*s_raw, n, [&, c](int k) { conc_raw(pd, k, c); })});
    }
  }

  s_rpmapp->stop();
  s_librpma->stop();
  s_raw->stop();
  s_rpmapp.reset();
  s_librpma.reset();
  s_raw.reset();
  finish();
  return 0;
}
