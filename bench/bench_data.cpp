// Benchmark 6: the data path on $SOFTROCE_IP, the same work done three ways in one process:
//   rpmapp   Conn::read/write/send/recv + Cq::get (busy) or Cq::next (event)
//   librpma  rpma_read/write/send/recv + rpma_cq_get_wc (busy) or rpma_cq_wait (event)
//   hand     ibv_post_send/ibv_post_recv + ibv_poll_cq (busy) or ibv_get_cq_event (event),
//            on a connection made with librdmacm
// Each implementation has its own connection (client and server side in this process, a
// CQ with a completion channel, sq = rq = cq = 32, as rpmapp and librpma make them) and its
// own two registered buffers. Rows:
//   read/write 64 B, 1 in flight   latency: post (completion always), busy-poll the CQ until
//                                  that completion, check its status; µs per operation
//   read/write 64 KiB, 16 in flight throughput: 16 posted, each completion (busy-polled, up
//                                  to 16 at once) replaced by a new post; MB/s (10^6 B/s)
//   send/recv 64 B ping-pong       a server thread (same implementation) echoes each
//                                  message; µs per round trip; busy-polled on both sides, and
//                                  once more waiting for completion events on both sides
// Benchmark 9, grants (scoped remote access), on the same connections:
//   read/write 64 B through a grant  as the latency rows, through a memory window bound to
//                                  the server's queue pair: rpmapp's Grant, a window bound
//                                  by hand; librpma has no windows (its region's own key)
//   grant + revoke, by window       rpmapp Grant::make + its bind completion + revoke;
//                                  by hand ibv_alloc_mw + bind + completion + ibv_dealloc_mw;
//                                  librpma rpma_mr_reg + rpma_mr_dereg (a registration per
//                                  client is the nearest it has); µs per grant
//   grant + revoke, by registration rpmapp (MrScope::grants_by_registration); by hand
//                                  ibv_reg_mr + ibv_dereg_mr; librpma as above
// every grant of the whole server buffer (1 MiB + 8 KiB), read_src | write_dst. A device
// without memory windows (siw) has only the rows by registration.
// Bytes are checked after every repetition (what was read / written / received is the
// peer's pattern). Usage: bench_data [reps] [lat_n] [tput_n] [pp_n] [pp_event_n] [grant_n]
// (operations per repetition: latency, throughput, busy ping-pong, event ping-pong,
// grants).
#include "anchors.hpp"

#include <librpma.h>

#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <thread>
#include <vector>

namespace bench {
namespace {

constexpr std::size_t small = 64;
constexpr std::size_t big = 64 * 1024;
constexpr int depth = 16;
constexpr std::uint32_t queue_size = 32;
// Per side: 16 slots of 64 KiB (reads/writes), then a send and a receive message buffer.
constexpr std::size_t send_off = depth * big;
constexpr std::size_t recv_off = send_off + 4096;
constexpr std::size_t buffer_size = recv_off + 4096;

enum class Op { read, write };
enum class Poll { busy, event };

/// Page-aligned memory of one side, filled with a pattern.
struct Buffer {
  std::unique_ptr<std::byte, decltype(&std::free)> mem{
      static_cast<std::byte*>(std::aligned_alloc(4096, buffer_size)), &std::free};
  std::byte* data() { return mem.get(); }
  void fill(unsigned char seed) {
    for (std::size_t i = 0; i < buffer_size; ++i) mem.get()[i] = std::byte(static_cast<unsigned char>(seed + i * 7));
  }
};

void expect_same(const std::byte* a, const std::byte* b, std::size_t n, const char* what) {
  if (std::memcmp(a, b, n) != 0) die(what, "the bytes differ from the peer's");
}

// Teardown waits at most this long for a disconnect's events (the results are out by
// then): a missing one is reported on stderr and the connection is released anyway.
constexpr int teardown_wait_ms = 10000;

bool readable_within(int fd, int ms) {
  pollfd p{fd, POLLIN, 0};
  return ::poll(&p, 1, ms) > 0;
}

void late(const char* who, const char* what) {
  std::fprintf(stderr, "bench_data: %s: no %s within %d ms; released anyway\n", who, what, teardown_wait_ms);
}

void check_wc(const ibv_wc& wc, const char* who) {
  if (wc.status != IBV_WC_SUCCESS) die(who, std::string("completion failed: ") + ibv_wc_status_str(wc.status));
}

// ------------------------------------------------------------------------ rpmapp

struct RpmappImpl {
  static constexpr const char* port = "7481";
  rpmapp::Endpoint ep;
  rpmapp::Conn client, server;
  Buffer cmem, smem;
  rpmapp::MrLocal cmr, smr;
  rpmapp::MrRemote remote;  // the server's region, from its descriptor
  rpmapp::Cq ccq, scq;
  // benchmark 9: the server's buffer again, for grants by window and by registration, and
  // the grant the data rows go through
  rpmapp::MrLocal by_window, by_registration;
  rpmapp::Grant data_grant;
  rpmapp::MrRemote granted;
  const rpmapp::MrRemote* target = &remote;  // what post() reads and writes
  bool windows = false;  // the device has type 2 memory windows (siw has none)

  static rpmapp::ConnConfig config() {
    rpmapp::ConnConfig cfg;
    cfg.sq_size = cfg.rq_size = cfg.cq_size = queue_size;
    return cfg;
  }
  static rpmapp::MrLocal reg(const rpmapp::Peer& peer, Buffer& b, rpmapp::MrUsage usage) {
    return must(rpmapp::MrLocal::reg(peer, b.data(), buffer_size, usage), "MrLocal::reg");
  }
  explicit RpmappImpl(const rpmapp::Peer& peer, const char* ip)
      : ep(must(rpmapp::Endpoint::listen(peer, ip, port), "Endpoint::listen")),
        client(must(must(rpmapp::ConnReq::to(peer, ip, port, config()), "ConnReq::to").connect(),
                    "ConnReq::connect")),
        server(must(must(ep.next_conn_req(config()), "next_conn_req").connect(), "ConnReq::connect")),
        cmr(reg(peer, cmem, rpmapp::MrUsage::read_dst | rpmapp::MrUsage::write_src |
                                rpmapp::MrUsage::send | rpmapp::MrUsage::recv)),
        smr(reg(peer, smem, rpmapp::MrUsage::read_src | rpmapp::MrUsage::write_dst |
                                rpmapp::MrUsage::send | rpmapp::MrUsage::recv)),
        remote(must(rpmapp::MrRemote::from_descriptor(must(smr.descriptor(), "descriptor")),
                    "MrRemote::from_descriptor")),
        ccq(must(client.cq(), "Conn::cq")),
        scq(must(server.cq(), "Conn::cq")) {
    if (must(client.next_event(), "Conn::next_event") != rpmapp::ConnEvent::established ||
        must(server.next_event(), "Conn::next_event") != rpmapp::ConnEvent::established)
      die("rpmapp", "not established");
    constexpr auto both = rpmapp::MrUsage::read_src | rpmapp::MrUsage::write_dst;
    by_window = must(rpmapp::MrLocal::reg(peer, smem.data(), buffer_size, both, rpmapp::MrScope::grants),
                     "MrLocal::reg");
    by_registration = must(rpmapp::MrLocal::reg(peer, smem.data(), buffer_size, both,
                                                rpmapp::MrScope::grants_by_registration),
                           "MrLocal::reg");
    windows = must(by_window.grant_mode(), "grant_mode") == rpmapp::GrantMode::windows;
    if (!windows) return;
    data_grant = grant(by_window);
    granted = must(rpmapp::MrRemote::from_descriptor(must(data_grant.descriptor(), "Grant::descriptor")),
                   "MrRemote::from_descriptor");
  }
  /// A grant of all of `region` to the client, settled (its bind's completion read).
  rpmapp::Grant grant(const rpmapp::MrLocal& region) {
    auto g = must(rpmapp::Grant::make(server, region, 0, buffer_size,
                                      rpmapp::MrUsage::read_src | rpmapp::MrUsage::write_dst),
                  "Grant::make");
    if (must(region.grant_mode(), "grant_mode") == rpmapp::GrantMode::windows) {
      ibv_wc wc;
      while (poll(scq, &wc, 1, Poll::busy) == 0) {}
      if (wc.opcode != IBV_WC_BIND_MW) die("rpmapp", "not the bind's completion");
    }
    return g;
  }
  double grant_cycle_us(int n, bool windows) {
    const double t0 = now_s();
    for (int i = 0; i < n; ++i) must(grant(windows ? by_window : by_registration).revoke(), "Grant::revoke");
    return (now_s() - t0) / n * 1e6;
  }
  void through_grant(bool on) { target = on ? &granted : &remote; }
  // The server side's closed event first: releasing it answers the disconnect (DREP),
  // which the client side's closed event waits for.
  ~RpmappImpl() {
    must(client.disconnect(), "Conn::disconnect");
    for (rpmapp::Conn* c : {&server, &client}) {
      auto ev = c->next_event_for(std::chrono::milliseconds(teardown_wait_ms));
      if (!ev && ev.error().code() == rpmapp::errc::no_event) late("rpmapp", "closed event");
      else if (must(std::move(ev), "Conn::next_event_for") != rpmapp::ConnEvent::closed) die("rpmapp", "not closed");
      if (c == &server) {
        must(std::move(smr).dereg(), "dereg");
        must(std::move(server).close(), "Conn::close");
      }
    }
    must(std::move(cmr).dereg(), "dereg");
    must(std::move(client).close(), "Conn::close");
    must(std::move(ep).shutdown(), "Endpoint::shutdown");
  }

  void post(Op op, std::size_t off, std::size_t len, std::uint64_t ctx) {
    if (op == Op::read)
      must(client.read(cmr, off, *target, off, len, rpmapp::Completion::always, ctx), "Conn::read");
    else
      must(client.write(*target, off, cmr, off, len, rpmapp::Completion::always, ctx), "Conn::write");
  }
  static int poll(rpmapp::Cq& cq, ibv_wc* wc, int n, Poll how) {
    auto got = how == Poll::busy ? cq.get({wc, static_cast<std::size_t>(n)})
                                 : cq.next({wc, static_cast<std::size_t>(n)});
    if (got) {
      for (const ibv_wc& w : *got) must(rpmapp::check(w), "completion");
      return static_cast<int>(got->size());
    }
    if (got.error().code() != rpmapp::errc::no_completion) must(got, "Cq::get");
    return 0;
  }
  int poll_client(ibv_wc* wc, int n, Poll how) { return poll(ccq, wc, n, how); }
  int poll_server(ibv_wc* wc, int n, Poll how) { return poll(scq, wc, n, how); }
  void client_send() { must(client.send(cmr, send_off, small), "Conn::send"); }
  void client_recv() { must(client.recv(cmr, recv_off, small), "Conn::recv"); }
  void server_send() { must(server.send(smr, send_off, small), "Conn::send"); }
  void server_recv() { must(server.recv(smr, recv_off, small), "Conn::recv"); }
};

// ------------------------------------------------------------------------ librpma

struct LibrpmaImpl {
  static constexpr const char* port = "7482";
  rpma_ep* ep = nullptr;
  rpma_conn* client = nullptr;
  rpma_conn* server = nullptr;
  Buffer cmem, smem;
  rpma_mr_local* cmr = nullptr;
  rpma_mr_local* smr = nullptr;
  rpma_mr_remote* remote = nullptr;
  rpma_cq* ccq = nullptr;
  rpma_cq* scq = nullptr;

  LibrpmaImpl(rpma_peer* peer, const char* ip) {
    rpma_conn_cfg* cfg = nullptr;
    check(rpma_conn_cfg_new(&cfg), "rpma_conn_cfg_new");
    check(rpma_conn_cfg_set_sq_size(cfg, queue_size), "rpma_conn_cfg_set_sq_size");
    check(rpma_conn_cfg_set_rq_size(cfg, queue_size), "rpma_conn_cfg_set_rq_size");
    check(rpma_conn_cfg_set_cq_size(cfg, queue_size), "rpma_conn_cfg_set_cq_size");
    check(rpma_ep_listen(peer, ip, port, &ep), "rpma_ep_listen");
    rpma_conn_req* req = nullptr;
    check(rpma_conn_req_new(peer, ip, port, cfg, &req), "rpma_conn_req_new");
    check(rpma_conn_req_connect(&req, nullptr, &client), "rpma_conn_req_connect");
    check(rpma_ep_next_conn_req(ep, cfg, &req), "rpma_ep_next_conn_req");
    check(rpma_conn_req_connect(&req, nullptr, &server), "rpma_conn_req_connect");
    rpma_conn_event ev{};
    check(rpma_conn_next_event(client, &ev), "rpma_conn_next_event");
    if (ev != RPMA_CONN_ESTABLISHED) die("librpma", "not established");
    check(rpma_conn_next_event(server, &ev), "rpma_conn_next_event");
    if (ev != RPMA_CONN_ESTABLISHED) die("librpma", "not established");
    check(rpma_conn_cfg_delete(&cfg), "rpma_conn_cfg_delete");
    check(rpma_mr_reg(peer, cmem.data(), buffer_size,
                      RPMA_MR_USAGE_READ_DST | RPMA_MR_USAGE_WRITE_SRC | RPMA_MR_USAGE_SEND | RPMA_MR_USAGE_RECV,
                      &cmr),
          "rpma_mr_reg");
    check(rpma_mr_reg(peer, smem.data(), buffer_size,
                      RPMA_MR_USAGE_READ_SRC | RPMA_MR_USAGE_WRITE_DST | RPMA_MR_USAGE_SEND | RPMA_MR_USAGE_RECV,
                      &smr),
          "rpma_mr_reg");
    std::size_t size = 0;
    check(rpma_mr_get_descriptor_size(smr, &size), "rpma_mr_get_descriptor_size");
    std::vector<unsigned char> desc(size);
    check(rpma_mr_get_descriptor(smr, desc.data()), "rpma_mr_get_descriptor");
    check(rpma_mr_remote_from_descriptor(desc.data(), size, &remote), "rpma_mr_remote_from_descriptor");
    check(rpma_conn_get_cq(client, &ccq), "rpma_conn_get_cq");
    check(rpma_conn_get_cq(server, &scq), "rpma_conn_get_cq");
  }
  ~LibrpmaImpl() {  // the server side first, as RpmappImpl's
    check(rpma_conn_disconnect(client), "rpma_conn_disconnect");
    for (rpma_conn** c : {&server, &client}) {
      int fd = -1;
      check(rpma_conn_get_event_fd(*c, &fd), "rpma_conn_get_event_fd");
      if (readable_within(fd, teardown_wait_ms)) {
        rpma_conn_event ev{};
        check(rpma_conn_next_event(*c, &ev), "rpma_conn_next_event");
        if (ev != RPMA_CONN_CLOSED) die("librpma", "not closed");
      } else {
        late("librpma", "closed event");
      }
      check(rpma_conn_delete(c), "rpma_conn_delete");
    }
    check(rpma_mr_remote_delete(&remote), "rpma_mr_remote_delete");
    check(rpma_mr_dereg(&cmr), "rpma_mr_dereg");
    check(rpma_mr_dereg(&smr), "rpma_mr_dereg");
    check(rpma_ep_shutdown(&ep), "rpma_ep_shutdown");
  }

  void post(Op op, std::size_t off, std::size_t len, std::uint64_t ctx) {
    const void* context = reinterpret_cast<const void*>(ctx);
    if (op == Op::read)
      check(rpma_read(client, cmr, off, remote, off, len, RPMA_F_COMPLETION_ALWAYS, context), "rpma_read");
    else
      check(rpma_write(client, remote, off, cmr, off, len, RPMA_F_COMPLETION_ALWAYS, context), "rpma_write");
  }
  static int poll(rpma_cq* cq, ibv_wc* wc, int n, Poll how) {
    for (;;) {
      int got = 0;
      const int rc = rpma_cq_get_wc(cq, n, wc, &got);
      if (rc == 0) {
        for (int i = 0; i < got; ++i) check_wc(wc[i], "rpma_cq_get_wc");
        return got;
      }
      if (rc != RPMA_E_NO_COMPLETION) check(rc, "rpma_cq_get_wc");
      if (how == Poll::busy) return 0;
      check(rpma_cq_wait(cq), "rpma_cq_wait");
    }
  }
  /// librpma's nearest to a grant: a registration of the buffer, its descriptor, gone again.
  double grant_cycle_us(rpma_peer* peer, int n) {
    const double t0 = now_s();
    for (int i = 0; i < n; ++i) {
      rpma_mr_local* mr = nullptr;
      check(rpma_mr_reg(peer, smem.data(), buffer_size, RPMA_MR_USAGE_READ_SRC | RPMA_MR_USAGE_WRITE_DST, &mr),
            "rpma_mr_reg");
      unsigned char desc[21];
      check(rpma_mr_get_descriptor(mr, desc), "rpma_mr_get_descriptor");
      check(rpma_mr_dereg(&mr), "rpma_mr_dereg");
    }
    return (now_s() - t0) / n * 1e6;
  }
  int poll_client(ibv_wc* wc, int n, Poll how) { return poll(ccq, wc, n, how); }
  int poll_server(ibv_wc* wc, int n, Poll how) { return poll(scq, wc, n, how); }
  void client_send() { check(rpma_send(client, cmr, send_off, small, RPMA_F_COMPLETION_ALWAYS, nullptr), "rpma_send"); }
  void client_recv() { check(rpma_recv(client, cmr, recv_off, small, nullptr), "rpma_recv"); }
  void server_send() { check(rpma_send(server, smr, send_off, small, RPMA_F_COMPLETION_ALWAYS, nullptr), "rpma_send"); }
  void server_recv() { check(rpma_recv(server, smr, recv_off, small, nullptr), "rpma_recv"); }
};

// ------------------------------------------------------------------------ by hand

struct HandImpl {
  static constexpr const char* port = "7483";
  struct Side {
    rdma_cm_id* id = nullptr;
    ibv_comp_channel* channel = nullptr;
    ibv_cq* cq = nullptr;
  };
  rdma_event_channel* lch = nullptr;  // the listener's (and the accepted id's) events
  rdma_event_channel* cch = nullptr;  // the client id's
  rdma_cm_id* listener = nullptr;
  ibv_pd* pd;
  Side client, server;
  Buffer cmem, smem;
  ibv_mr* cmr = nullptr;
  ibv_mr* smr = nullptr;
  std::uint64_t raddr = 0;  // what the server's descriptor would carry
  std::uint32_t rkey = 0;
  // benchmark 9: the server's buffer for windows, and the window the data rows go through
  ibv_mr* bind_mr = nullptr;
  ibv_mw* data_mw = nullptr;
  std::uint32_t window_rkey = 0;

  static rdma_cm_event* wait_event(rdma_event_channel* ch, rdma_cm_event_type want) {
    rdma_cm_event* e = nullptr;
    check(rdma_get_cm_event(ch, &e), "rdma_get_cm_event");
    if (e->event != want) die("hand", std::string("unexpected ") + rdma_event_str(e->event));
    return e;
  }
  static void next_event(rdma_event_channel* ch, rdma_cm_event_type want) {
    check(rdma_ack_cm_event(wait_event(ch, want)), "rdma_ack_cm_event");
  }
  void make_queues(Side& s) {
    s.channel = check_ptr(ibv_create_comp_channel(s.id->verbs), "ibv_create_comp_channel");
    s.cq = check_ptr(ibv_create_cq(s.id->verbs, queue_size, nullptr, s.channel, 0), "ibv_create_cq");
    check(ibv_req_notify_cq(s.cq, 0), "ibv_req_notify_cq");
    ibv_qp_init_attr attr = raw_qp_attr(s.cq);
    attr.cap.max_send_wr = attr.cap.max_recv_wr = queue_size;
    check(rdma_create_qp(s.id, pd, &attr), "rdma_create_qp");
  }

  /// `windows`: bind the window the grant rows go through (the device has them).
  HandImpl(ibv_pd* pd_, const char* ip, bool windows) : pd(pd_) {
    lch = check_ptr(rdma_create_event_channel(), "rdma_create_event_channel");
    cch = check_ptr(rdma_create_event_channel(), "rdma_create_event_channel");
    rdma_addrinfo hints{};
    hints.ai_flags = RAI_NUMERICHOST | RAI_PASSIVE;
    hints.ai_port_space = RDMA_PS_TCP;
    rdma_addrinfo* ai = nullptr;
    check(rdma_getaddrinfo(ip, port, &hints, &ai), "rdma_getaddrinfo");
    check(rdma_create_id(lch, &listener, nullptr, RDMA_PS_TCP), "rdma_create_id");
    check(rdma_bind_addr(listener, ai->ai_src_addr), "rdma_bind_addr");
    rdma_freeaddrinfo(ai);
    check(rdma_listen(listener, 0), "rdma_listen");

    hints.ai_flags = RAI_NUMERICHOST;
    check(rdma_getaddrinfo(ip, port, &hints, &ai), "rdma_getaddrinfo");
    check(rdma_create_id(cch, &client.id, nullptr, RDMA_PS_TCP), "rdma_create_id");
    check(rdma_resolve_addr(client.id, ai->ai_src_addr, ai->ai_dst_addr, 2000), "rdma_resolve_addr");
    rdma_freeaddrinfo(ai);
    next_event(cch, RDMA_CM_EVENT_ADDR_RESOLVED);
    check(rdma_resolve_route(client.id, 2000), "rdma_resolve_route");
    next_event(cch, RDMA_CM_EVENT_ROUTE_RESOLVED);
    make_queues(client);
    rdma_conn_param param = raw_conn_param();
    check(rdma_connect(client.id, &param), "rdma_connect");

    rdma_cm_event* e = wait_event(lch, RDMA_CM_EVENT_CONNECT_REQUEST);
    server.id = e->id;
    check(rdma_ack_cm_event(e), "rdma_ack_cm_event");
    make_queues(server);
    check(rdma_accept(server.id, &param), "rdma_accept");
    // The client's first: librdmacm answers the accept (RTU) while reading that event.
    next_event(cch, RDMA_CM_EVENT_ESTABLISHED);
    next_event(lch, RDMA_CM_EVENT_ESTABLISHED);

    cmr = check_ptr(ibv_reg_mr(pd, cmem.data(), buffer_size, local_write), "ibv_reg_mr");
    smr = check_ptr(ibv_reg_mr(pd, smem.data(), buffer_size,
                               local_write | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ),
                    "ibv_reg_mr");
    raddr = reinterpret_cast<std::uintptr_t>(smem.data());
    rkey = smr->rkey;
    if (!windows) return;
    bind_mr = check_ptr(ibv_reg_mr(pd, smem.data(), buffer_size, local_write | IBV_ACCESS_MW_BIND), "ibv_reg_mr");
    data_mw = check_ptr(ibv_alloc_mw(pd, IBV_MW_TYPE_2), "ibv_alloc_mw");
    window_rkey = bind(data_mw);
  }
  /// Binds `mw` over the server's buffer on the server's queue pair (reads and writes),
  /// waits for the bind's completion and returns the window's key.
  std::uint32_t bind(ibv_mw* mw) {
    ibv_send_wr wr{};
    wr.opcode = IBV_WR_BIND_MW;
    wr.send_flags = IBV_SEND_SIGNALED;
    wr.bind_mw.mw = mw;
    wr.bind_mw.rkey = ibv_inc_rkey(mw->rkey);
    wr.bind_mw.bind_info.mr = bind_mr;
    wr.bind_mw.bind_info.addr = raddr;
    wr.bind_mw.bind_info.length = buffer_size;
    wr.bind_mw.bind_info.mw_access_flags = IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_WRITE;
    ibv_send_wr* bad = nullptr;
    if (int rc = ibv_post_send(server.id->qp, &wr, &bad); rc != 0) die("ibv_post_send", std::strerror(rc));
    ibv_wc wc;
    while (poll(server, &wc, 1, Poll::busy) == 0) {}
    if (wc.opcode != IBV_WC_BIND_MW) die("hand", "not the bind's completion");
    mw->rkey = wr.bind_mw.rkey;
    return mw->rkey;
  }
  double window_cycle_us(int n) {
    const double t0 = now_s();
    for (int i = 0; i < n; ++i) {
      ibv_mw* mw = check_ptr(ibv_alloc_mw(pd, IBV_MW_TYPE_2), "ibv_alloc_mw");
      bind(mw);
      check(ibv_dealloc_mw(mw), "ibv_dealloc_mw");
    }
    return (now_s() - t0) / n * 1e6;
  }
  double registration_cycle_us(int n) {
    const double t0 = now_s();
    for (int i = 0; i < n; ++i) {
      ibv_mr* mr = check_ptr(ibv_reg_mr(pd, smem.data(), buffer_size,
                                        local_write | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_WRITE),
                             "ibv_reg_mr");
      check(ibv_dereg_mr(mr), "ibv_dereg_mr");
    }
    return (now_s() - t0) / n * 1e6;
  }
  void through_window(bool on) { rkey = on ? window_rkey : smr->rkey; }
  void release(Side& s) {
    rdma_destroy_qp(s.id);
    check(ibv_destroy_cq(s.cq), "ibv_destroy_cq");
    check(ibv_destroy_comp_channel(s.channel), "ibv_destroy_comp_channel");
    check(rdma_destroy_id(s.id), "rdma_destroy_id");
  }
  ~HandImpl() {  // the server side first, as RpmappImpl's
    check(rdma_disconnect(client.id), "rdma_disconnect");
    for (rdma_event_channel* ch : {lch, cch}) {
      if (readable_within(ch->fd, teardown_wait_ms)) next_event(ch, RDMA_CM_EVENT_DISCONNECTED);
      else late("hand-written", "DISCONNECTED event");
      release(ch == lch ? server : client);
    }
    if (data_mw != nullptr) check(ibv_dealloc_mw(data_mw), "ibv_dealloc_mw");
    if (bind_mr != nullptr) check(ibv_dereg_mr(bind_mr), "ibv_dereg_mr");
    check(ibv_dereg_mr(cmr), "ibv_dereg_mr");
    check(ibv_dereg_mr(smr), "ibv_dereg_mr");
    check(rdma_destroy_id(listener), "rdma_destroy_id");
    rdma_destroy_event_channel(cch);
    rdma_destroy_event_channel(lch);
  }

  void post(Op op, std::size_t off, std::size_t len, std::uint64_t ctx) {
    ibv_sge sge;
    sge.addr = reinterpret_cast<std::uintptr_t>(cmem.data()) + off;
    sge.length = static_cast<std::uint32_t>(len);
    sge.lkey = cmr->lkey;
    ibv_send_wr wr{};
    wr.wr_id = ctx;
    wr.opcode = op == Op::read ? IBV_WR_RDMA_READ : IBV_WR_RDMA_WRITE;
    wr.sg_list = &sge;
    wr.num_sge = 1;
    wr.send_flags = IBV_SEND_SIGNALED;
    wr.wr.rdma.remote_addr = raddr + off;
    wr.wr.rdma.rkey = rkey;
    ibv_send_wr* bad = nullptr;
    if (int rc = ibv_post_send(client.id->qp, &wr, &bad); rc != 0) die("ibv_post_send", std::strerror(rc));
  }
  static int poll(Side& s, ibv_wc* wc, int n, Poll how) {
    for (;;) {
      const int got = ibv_poll_cq(s.cq, n, wc);
      if (got < 0) die("ibv_poll_cq", std::to_string(got));
      if (got > 0) {
        for (int i = 0; i < got; ++i) check_wc(wc[i], "ibv_poll_cq");
        return got;
      }
      if (how == Poll::busy) return 0;
      ibv_cq* cq = nullptr;
      void* context = nullptr;
      check(ibv_get_cq_event(s.channel, &cq, &context), "ibv_get_cq_event");
      ibv_ack_cq_events(cq, 1);
      check(ibv_req_notify_cq(cq, 0), "ibv_req_notify_cq");
    }
  }
  int poll_client(ibv_wc* wc, int n, Poll how) { return poll(client, wc, n, how); }
  int poll_server(ibv_wc* wc, int n, Poll how) { return poll(server, wc, n, how); }
  void send(Side& s, ibv_mr* mr, std::byte* mem) {
    ibv_sge sge{reinterpret_cast<std::uintptr_t>(mem) + send_off, small, mr->lkey};
    ibv_send_wr wr{};
    wr.opcode = IBV_WR_SEND;
    wr.sg_list = &sge;
    wr.num_sge = 1;
    wr.send_flags = IBV_SEND_SIGNALED;
    ibv_send_wr* bad = nullptr;
    if (int rc = ibv_post_send(s.id->qp, &wr, &bad); rc != 0) die("ibv_post_send", std::strerror(rc));
  }
  void recv(Side& s, ibv_mr* mr, std::byte* mem) {
    ibv_sge sge{reinterpret_cast<std::uintptr_t>(mem) + recv_off, small, mr->lkey};
    ibv_recv_wr wr{};
    wr.sg_list = &sge;
    wr.num_sge = 1;
    ibv_recv_wr* bad = nullptr;
    if (int rc = ibv_post_recv(s.id->qp, &wr, &bad); rc != 0) die("ibv_post_recv", std::strerror(rc));
  }
  void client_send() { send(client, cmr, cmem.data()); }
  void client_recv() { recv(client, cmr, cmem.data()); }
  void server_send() { send(server, smr, smem.data()); }
  void server_recv() { recv(server, smr, smem.data()); }
};

// ------------------------------------------------------------------------ the work

/// `n` operations of `len` bytes, at most `inflight` at once (slot k at offset k * big),
/// each completion busy-polled and checked. Returns the elapsed seconds.
template <class Impl> double run_ops(Impl& impl, Op op, std::size_t len, int inflight, int n) {
  ibv_wc wc[depth];
  int posted = 0, done = 0;
  const double t0 = now_s();
  for (; posted < inflight && posted < n; ++posted)
    impl.post(op, static_cast<std::size_t>(posted) * big, len, static_cast<std::uint64_t>(posted));
  while (done < n) {
    const int got = impl.poll_client(wc, inflight, Poll::busy);
    for (int i = 0; i < got; ++i, ++done) {
      if (posted < n) {
        impl.post(op, wc[i].wr_id * big, len, wc[i].wr_id);  // the slot just completed
        ++posted;
      }
    }
  }
  return now_s() - t0;
}

/// Fills both sides, runs, and checks that the bytes moved: a read's destination holds
/// the server's bytes, a write's destination the client's.
template <class Impl> double measure_ops(Impl& impl, Op op, std::size_t len, int inflight, int n) {
  impl.cmem.fill(1);
  impl.smem.fill(2);
  const double s = run_ops(impl, op, len, inflight, n);
  const std::size_t span = static_cast<std::size_t>(std::min(inflight, n)) * big;
  for (std::size_t off = 0; off < span; off += big)
    expect_same(impl.cmem.data() + off, impl.smem.data() + off, len, op == Op::read ? "read" : "write");
  return s;
}

/// `n` round trips: the client sends, the server thread's receive completes and it sends
/// back, the client's receive completes. Each side re-posts its receive before sending.
/// Returns the elapsed seconds (the server thread is running before the clock starts).
template <class Impl> double ping_pong(Impl& impl, int n, Poll how) {
  impl.cmem.fill(3);
  impl.smem.fill(4);
  impl.server_recv();
  impl.client_recv();
  std::atomic<bool> ready{false};
  std::thread server([&] {
    ibv_wc wc[4];
    int received = 0, sent = 0;
    ready.store(true, std::memory_order_release);
    while (received < n || sent < n) {
      const int got = impl.poll_server(wc, 4, how);
      for (int i = 0; i < got; ++i) {
        if (wc[i].opcode == IBV_WC_RECV) {
          if (++received < n) impl.server_recv();
          impl.server_send();
        } else {
          ++sent;
        }
      }
    }
  });
  while (!ready.load(std::memory_order_acquire)) std::this_thread::yield();
  ibv_wc wc[4];
  const double t0 = now_s();
  for (int i = 0; i < n; ++i) {
    impl.client_send();
    int sent = 0, received = 0;
    while (sent == 0 || received == 0) {
      const int got = impl.poll_client(wc, 4, how);
      for (int k = 0; k < got; ++k) (wc[k].opcode == IBV_WC_RECV ? received : sent)++;
    }
    if (i + 1 < n) impl.client_recv();
  }
  const double s = now_s() - t0;
  server.join();
  expect_same(impl.cmem.data() + recv_off, impl.smem.data() + send_off, small, "recv (client)");
  expect_same(impl.smem.data() + recv_off, impl.cmem.data() + send_off, small, "recv (server)");
  return s;
}

}  // namespace
}  // namespace bench

int main(int argc, char** argv) {
  using namespace bench;
  const int reps = argc > 1 ? std::atoi(argv[1]) : 7;
  const int lat_n = argc > 2 ? std::atoi(argv[2]) : 2000;
  const int tput_n = argc > 3 ? std::atoi(argv[3]) : 400;
  const int pp_n = argc > 4 ? std::atoi(argv[4]) : 1000;
  const int ppe_n = argc > 5 ? std::atoi(argv[5]) : 200;
  const int grant_n = argc > 6 ? std::atoi(argv[6]) : 100;
  if (reps < 1 || lat_n < 1 || tput_n < depth || pp_n < 1 || ppe_n < 1 || grant_n < 1)
    die("usage", "bench_data [reps >= 1] [lat_n >= 1] [tput_n >= 16] [pp_n >= 1] [pp_event_n >= 1] "
                 "[grant_n >= 1]");
  // A hang fails the run: every row (and the setup) must finish within the bound.
  auto step = [](const char* what) {
    std::fprintf(stderr, "bench_data: %s\n", what);
    alarm(120);
  };
  step("setup");
  // (names, not a structured binding: lambdas use them, and clang before 16 cannot
  // capture a structured binding)
  Anchors anchors = open_anchors();
  auto& ip = anchors.ip;
  auto& peer = anchors.peer;
  auto& ctx = anchors.ctx;
  auto& rpeer = anchors.rpeer;
  ibv_pd* pd = check_ptr(ibv_alloc_pd(ctx), "ibv_alloc_pd");
  {
    RpmappImpl r(peer, ip);
    step("rpmapp connected");
    LibrpmaImpl l(rpeer, ip);
    step("librpma connected");
    HandImpl h(pd, ip, r.windows);
    step("hand-written connected");

    auto per_op_us = [](auto& impl, Op op, int n) {
      return [&impl, op, n] { return measure_ops(impl, op, small, 1, n) / n * 1e6; };
    };
    auto mb_per_s = [](auto& impl, Op op, int n) {
      return [&impl, op, n] { return static_cast<double>(n) * big / measure_ops(impl, op, big, depth, n) / 1e6; };
    };
    auto round_trip_us = [](auto& impl, int n, Poll how) {
      return [&impl, n, how] { return ping_pong(impl, n, how) / n * 1e6; };
    };
    for (Op op : {Op::read, Op::write}) {
      const std::string name = op == Op::read ? "read" : "write";
      step("latency");
      interleave("data", name + " 64 B, 1 in flight, busy-poll", "µs/op", reps,
                 {per_op_us(r, op, lat_n), per_op_us(l, op, lat_n), per_op_us(h, op, lat_n)}, data_variants);
    }
    for (Op op : {Op::read, Op::write}) {
      const std::string name = op == Op::read ? "read" : "write";
      step("throughput");
      interleave("data", name + " 64 KiB, 16 in flight, busy-poll", "MB/s", reps,
                 {mb_per_s(r, op, tput_n), mb_per_s(l, op, tput_n), mb_per_s(h, op, tput_n)}, data_variants);
    }
    step("ping-pong, busy-poll");
    interleave("data", "send/recv 64 B ping-pong, busy-poll", "µs/round trip", reps,
               {round_trip_us(r, pp_n, Poll::busy), round_trip_us(l, pp_n, Poll::busy),
                round_trip_us(h, pp_n, Poll::busy)},
               data_variants);
    step("ping-pong, completion events");
    interleave("data", "send/recv 64 B ping-pong, completion events", "µs/round trip", reps,
               {round_trip_us(r, ppe_n, Poll::event), round_trip_us(l, ppe_n, Poll::event),
                round_trip_us(h, ppe_n, Poll::event)},
               data_variants);
    // 9: grants. The data rows through a window (librpma: its region's own key); a device
    // without windows (siw) has only the rows by registration
    if (r.windows) {
      r.through_grant(true);
      h.through_window(true);
      for (Op op : {Op::read, Op::write}) {
        const std::string name = op == Op::read ? "read" : "write";
        step("through a grant");
        interleave("grant", name + " 64 B through a grant, 1 in flight, busy-poll", "µs/op", reps,
                   {per_op_us(r, op, lat_n), per_op_us(l, op, lat_n), per_op_us(h, op, lat_n)}, data_variants);
      }
      r.through_grant(false);
      h.through_window(false);
      step("grant + revoke");
      interleave("grant", "grant + revoke of 1 MiB, by memory window", "µs/grant", reps,
                 {[&] { return r.grant_cycle_us(grant_n, true); }, [&] { return l.grant_cycle_us(rpeer, grant_n); },
                  [&] { return h.window_cycle_us(grant_n); }},
                 data_variants);
    } else {
      std::fprintf(stderr, "bench_data: the device has no memory windows: no rows through a grant or by window\n");
      step("grant + revoke");
    }
    interleave("grant", "grant + revoke of 1 MiB, by registration", "µs/grant", reps,
               {[&] { return r.grant_cycle_us(grant_n, false); }, [&] { return l.grant_cycle_us(rpeer, grant_n); },
                [&] { return h.registration_cycle_us(grant_n); }},
               data_variants);
    step("teardown");
  }
  std::fprintf(stderr, "bench_data: released\n");
  alarm(0);
  check(ibv_dealloc_pd(pd), "ibv_dealloc_pd");
  check(rpma_peer_delete(&rpeer), "rpma_peer_delete");
  return 0;
}
