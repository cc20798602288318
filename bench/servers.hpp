// The accepting side of the connection benchmarks. Each server runs in its own thread: it
// accepts every request (a CQ and a QP per connection, sizes as ConnConfig's defaults),
// waits for the client's disconnect and releases the connection. established() counts
// connections established, closed() those released. One per implementation (rpmapp,
// librpma, raw librdmacm), and, for the server comparison (bench_connect serve), rpmapp's
// EventLoop servers (handlers, coroutines): see make_server() at the end.
#pragma once

#include "common.hpp"

#include <rpmapp/event_loop.hpp>
#include <rpmapp/task.hpp>

#include <librpma.h>
#include <rdma/rdma_cma.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <list>
#include <memory>
#include <string_view>
#include <thread>
#include <unordered_map>
#include <vector>

namespace bench {

/// A server under test: listening once constructed, serving in its own thread between
/// start() and stop().
class Server {
 public:
  virtual ~Server() = default;
  long closed() const { return closed_.load(std::memory_order_acquire); }
  /// Connections the server saw established (bench_memory waits for them).
  long established() const { return established_.load(std::memory_order_acquire); }
  /// Before start(): the server thread reads its CPU time (CLOCK_THREAD_CPUTIME_ID) when
  /// it counts the counts[i]-th connection established (counts ascending).
  void time_cpu_at(std::vector<long> counts) {
    cpu_counts_ = std::move(counts);
    cpu_ns_.assign(cpu_counts_.size(), -1);
  }
  /// The CPU time read at counts[i], in ns; valid once established() >= counts[i].
  long cpu_ns_at(std::size_t i) const { return cpu_ns_[i]; }
  virtual void start() = 0;
  /// Returns when the server thread has ended (connections still open stay open).
  virtual void stop() = 0;

 protected:
  /// Called on the server thread for each connection established.
  void count_established() {
    const long count = established_.load(std::memory_order_relaxed) + 1;
    if (next_cpu_ < cpu_counts_.size() && cpu_counts_[next_cpu_] == count) {
      timespec t{};
      clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
      cpu_ns_[next_cpu_++] = t.tv_sec * 1'000'000'000L + t.tv_nsec;
    }
    established_.store(count, std::memory_order_release);  // publishes the CPU time too
  }
  std::atomic<long> closed_{0};

 private:
  std::atomic<long> established_{0};
  std::vector<long> cpu_counts_;
  std::vector<long> cpu_ns_;
  std::size_t next_cpu_ = 0;
};

/// The epoll loop and the stop signal; Derived::on_ready(epoll_event) handles readiness.
class ServerBase : public Server {
 public:
  ServerBase() : epfd_(epoll_create1(0)), stopfd_(eventfd(0, EFD_NONBLOCK)) {
    if (epfd_ < 0 || stopfd_ < 0) die("epoll/eventfd", std::strerror(errno));
    add(stopfd_, 0);
  }
  ~ServerBase() override {
    ::close(epfd_);
    ::close(stopfd_);
  }
  void start() override {
    thread_ = std::thread([this] { loop(); });
  }
  void stop() override {
    std::uint64_t one = 1;
    if (write(stopfd_, &one, sizeof one) != sizeof one) die("eventfd write", std::strerror(errno));
    thread_.join();
  }

 protected:
  void add(int fd, std::uint64_t key) {
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.u64 = key;
    if (epoll_ctl(epfd_, EPOLL_CTL_ADD, fd, &ev) != 0) die("epoll_ctl add", std::strerror(errno));
  }
  void del(int fd) {
    if (epoll_ctl(epfd_, EPOLL_CTL_DEL, fd, nullptr) != 0) die("epoll_ctl del", std::strerror(errno));
  }
  virtual void on_ready(std::uint64_t key) = 0;

 private:
  void loop() {
    epoll_event events[64];
    for (;;) {
      int n = epoll_wait(epfd_, events, 64, -1);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) die("epoll_wait", std::strerror(errno));
      for (int i = 0; i < n; ++i) {
        if (events[i].data.u64 == 0) return;
        on_ready(events[i].data.u64);
      }
    }
  }
  int epfd_;
  int stopfd_;
  std::thread thread_;
};

/// rpmapp: the Endpoint's fd and each Conn's fd (rpmapp makes them non-blocking) in epoll
/// (level-triggered), one try_next_conn_req() / try_next_event() per readiness, as the
/// librpma server below: a connection's fd mostly holds one event, so draining it until
/// no_event would cost an empty read per event. Each request is accepted with `config`.
/// Key: 1 = listener, else fd + 2.
class RpmappServer : public ServerBase {
 public:
  RpmappServer(const rpmapp::Peer& peer, const char* ip, const char* port,
               const rpmapp::ConnConfig& config = {})
      : ep_(must(rpmapp::Endpoint::listen(peer, ip, port), "Endpoint::listen")), config_(config) {
    add(must(ep_.fd(), "Endpoint::fd"), 1);
  }
  ~RpmappServer() override { (void)std::move(ep_).shutdown(); }

 private:
  void on_ready(std::uint64_t key) override {
    if (key == 1) {
      auto req = ep_.try_next_conn_req(config_);
      if (!req && req.error() == rpmapp::errc::no_event) return;
      auto conn = must(must(std::move(req), "next_conn_req").connect(), "ConnReq::connect");
      int fd = must(conn.fd(), "Conn::fd");
      conns_.emplace(fd, std::move(conn));
      add(fd, static_cast<std::uint64_t>(fd) + 2);
      return;
    }
    const int fd = static_cast<int>(key - 2);
    auto it = conns_.find(fd);
    if (it == conns_.end()) return;
    auto ev = it->second.try_next_event();
    if (!ev && ev.error() == rpmapp::errc::no_event) return;  // e.g. a TIMEWAIT_EXIT taken
    const auto what = must(std::move(ev), "Conn::next_event");
    if (what == rpmapp::ConnEvent::established) count_established();
    if (what == rpmapp::ConnEvent::closed) {
      del(fd);
      must(std::move(it->second).close(), "Conn::close");
      conns_.erase(it);
      closed_.fetch_add(1, std::memory_order_release);
    }
  }
  rpmapp::Endpoint ep_;
  rpmapp::ConnConfig config_;
  std::unordered_map<int, rpmapp::Conn> conns_;
};

/// librpma: rpma_ep_get_fd and rpma_conn_get_event_fd in epoll (level-triggered), one
/// blocking call per readiness (librpma has no "drain until empty" on a blocking fd).
class LibrpmaServer : public ServerBase {
 public:
  LibrpmaServer(rpma_peer* peer, const char* ip, const char* port) {
    check(rpma_ep_listen(peer, ip, port, &ep_), "rpma_ep_listen");
    int fd = -1;
    check(rpma_ep_get_fd(ep_, &fd), "rpma_ep_get_fd");
    add(fd, 1);
  }
  ~LibrpmaServer() override { (void)rpma_ep_shutdown(&ep_); }

 private:
  void on_ready(std::uint64_t key) override {
    if (key == 1) {
      rpma_conn_req* req = nullptr;
      check(rpma_ep_next_conn_req(ep_, nullptr, &req), "rpma_ep_next_conn_req");
      rpma_conn* conn = nullptr;
      check(rpma_conn_req_connect(&req, nullptr, &conn), "rpma_conn_req_connect");
      int fd = -1;
      check(rpma_conn_get_event_fd(conn, &fd), "rpma_conn_get_event_fd");
      conns_.emplace(fd, conn);
      add(fd, static_cast<std::uint64_t>(fd) + 2);
      return;
    }
    const int fd = static_cast<int>(key - 2);
    auto it = conns_.find(fd);
    if (it == conns_.end()) return;
    rpma_conn_event ev{};
    check(rpma_conn_next_event(it->second, &ev), "rpma_conn_next_event");
    if (ev == RPMA_CONN_ESTABLISHED) count_established();
    if (ev == RPMA_CONN_CLOSED) {
      del(fd);
      check(rpma_conn_delete(&it->second), "rpma_conn_delete");
      conns_.erase(it);
      closed_.fetch_add(1, std::memory_order_release);
    }
  }
  rpma_ep* ep_ = nullptr;
  std::unordered_map<int, rpma_conn*> conns_;
};

/// What the raw servers share: one non-blocking event channel for the listener and every
/// accepted id (no migration), listening on ip:port, and a protection domain.
class RawListeningServer : public ServerBase {
 protected:
  RawListeningServer(const char* ip, const char* port) {
    ch_ = check_ptr(rdma_create_event_channel(), "rdma_create_event_channel");
    check(rdma_create_id(ch_, &listen_id_, nullptr, RDMA_PS_TCP), "rdma_create_id");
    rdma_addrinfo hints{};
    hints.ai_flags = RAI_PASSIVE | RAI_NUMERICHOST;
    hints.ai_port_space = RDMA_PS_TCP;
    hints.ai_qp_type = IBV_QPT_RC;
    rdma_addrinfo* ai = nullptr;
    check(rdma_getaddrinfo(ip, port, &hints, &ai), "rdma_getaddrinfo");
    check(rdma_bind_addr(listen_id_, ai->ai_src_addr), "rdma_bind_addr");
    rdma_freeaddrinfo(ai);
    pd_ = check_ptr(ibv_alloc_pd(listen_id_->verbs), "ibv_alloc_pd");
    check(rdma_listen(listen_id_, 0), "rdma_listen");
    set_nonblocking(ch_->fd);
    add(ch_->fd, 1);
  }
  ~RawListeningServer() override {
    rdma_destroy_id(listen_id_);
    ibv_dealloc_pd(pd_);
    rdma_destroy_event_channel(ch_);
  }
  rdma_event_channel* ch_ = nullptr;
  rdma_cm_id* listen_id_ = nullptr;
  ibv_pd* pd_ = nullptr;
};

/// Raw librdmacm: a CQ without completion channel and a QP per connection; or, `shared`
/// (bench_memory's "hand-shared", the hand-written counterpart of rpmapp's shared mode),
/// one CQ and one SRQ for every connection's QP, of SharedCqConfig's and SrqConfig's
/// default sizes.
class RawServer : public RawListeningServer {
 public:
  RawServer(const char* ip, const char* port, bool shared = false) : RawListeningServer(ip, port) {
    if (!shared) return;
    shared_cq_ = check_ptr(ibv_create_cq(listen_id_->verbs, 4096, nullptr, nullptr, 0), "ibv_create_cq");
    ibv_srq_init_attr srq_attr{};
    srq_attr.attr.max_wr = 100;
    srq_attr.attr.max_sge = 1;
    srq_ = check_ptr(ibv_create_srq(pd_, &srq_attr), "ibv_create_srq");
  }
  ~RawServer() override {
    if (srq_ != nullptr) check(ibv_destroy_srq(srq_), "ibv_destroy_srq");
    if (shared_cq_ != nullptr) check(ibv_destroy_cq(shared_cq_), "ibv_destroy_cq");
  }

 private:
  void on_ready(std::uint64_t) override {
    for (;;) {
      rdma_cm_event* e = nullptr;
      if (rdma_get_cm_event(ch_, &e) != 0) {
        if (errno == EAGAIN || errno == EWOULDBLOCK) return;
        die("rdma_get_cm_event", std::strerror(errno));
      }
      rdma_cm_id* id = e->id;
      switch (e->event) {
        case RDMA_CM_EVENT_CONNECT_REQUEST: {
          ibv_cq* cq = shared_cq_ != nullptr
                           ? shared_cq_
                           : check_ptr(ibv_create_cq(id->verbs, 10, nullptr, nullptr, 0), "ibv_create_cq");
          ibv_qp_init_attr attr = raw_qp_attr(cq);
          if (srq_ != nullptr) {
            attr.srq = srq_;
            attr.cap.max_recv_wr = 0;
            attr.cap.max_recv_sge = 0;
          }
          check(rdma_create_qp(id, pd_, &attr), "rdma_create_qp");
          id->context = shared_cq_ != nullptr ? nullptr : cq;
          rdma_conn_param param = raw_conn_param();
          check(rdma_accept(id, &param), "rdma_accept");
          rdma_ack_cm_event(e);
          break;
        }
        case RDMA_CM_EVENT_ESTABLISHED:
          rdma_ack_cm_event(e);
          count_established();
          break;
        case RDMA_CM_EVENT_DISCONNECTED: {
          rdma_ack_cm_event(e);
          auto* own_cq = static_cast<ibv_cq*>(id->context);
          rdma_destroy_qp(id);
          if (own_cq != nullptr) check(ibv_destroy_cq(own_cq), "ibv_destroy_cq");
          check(rdma_destroy_id(id), "rdma_destroy_id");
          closed_.fetch_add(1, std::memory_order_release);
          break;
        }
        default:
          rdma_ack_cm_event(e);
      }
    }
  }

  ibv_cq* shared_cq_ = nullptr;
  ibv_srq* srq_ = nullptr;
};

/// Raw librdmacm as RawServer, but each connection takes a CQ and a QP from a pool and gives
/// them back (RESET) when it is closed: INIT, RTR and RTS before rdma_accept, as rdma_accept
/// does for a QP of rdma_create_qp (bench_connect pool: what a pool of queues saves; not in
/// server_names).
class PooledRawServer : public RawListeningServer {
 public:
  PooledRawServer(const char* ip, const char* port) : RawListeningServer(ip, port) {
    mr_ = check_ptr(ibv_reg_mr(pd_, buffer_, sizeof buffer_, local_write), "ibv_reg_mr");
  }
  /// Connections whose client's 8-byte send arrived (each one's QP carried data).
  long received() const { return received_.load(std::memory_order_acquire); }
  ~PooledRawServer() override {
    for (PooledQueues q : pool_) free_pooled_queues(q);
    ibv_dereg_mr(mr_);
  }

 private:
  void on_ready(std::uint64_t) override {
    for (;;) {
      rdma_cm_event* e = nullptr;
      if (rdma_get_cm_event(ch_, &e) != 0) {
        if (errno == EAGAIN || errno == EWOULDBLOCK) return;
        die("rdma_get_cm_event", std::strerror(errno));
      }
      rdma_cm_id* id = e->id;
      const rdma_cm_event_type type = e->event;
      rdma_ack_cm_event(e);
      switch (type) {
        case RDMA_CM_EVENT_CONNECT_REQUEST: {
          PooledQueues q;
          if (pool_.empty()) {
            q = make_pooled_queues(id->verbs, pd_);
          } else {
            q = pool_.back();
            pool_.pop_back();
          }
          move_qp(id, q.qp, IBV_QPS_INIT);
          move_qp(id, q.qp, IBV_QPS_RTR);
          move_qp(id, q.qp, IBV_QPS_RTS);  // as rdma_accept does for a QP of rdma_create_qp
          ibv_sge sge{reinterpret_cast<std::uintptr_t>(buffer_), sizeof buffer_, mr_->lkey};
          ibv_recv_wr wr{}, *bad = nullptr;
          wr.sg_list = &sge;
          wr.num_sge = 1;
          check(ibv_post_recv(q.qp, &wr, &bad), "ibv_post_recv");
          id->context = new PooledQueues(q);
          rdma_conn_param param = raw_conn_param();
          param.qp_num = q.qp->qp_num;
          check(rdma_accept(id, &param), "rdma_accept");
          break;
        }
        case RDMA_CM_EVENT_ESTABLISHED:
          count_established();
          break;
        case RDMA_CM_EVENT_DISCONNECTED: {
          auto* q = static_cast<PooledQueues*>(id->context);
          ibv_wc wc{};
          if (ibv_poll_cq(q->cq, 1, &wc) == 1 && wc.status == IBV_WC_SUCCESS && wc.byte_len == 8)
            received_.fetch_add(1, std::memory_order_release);
          reset_qp(*q);
          pool_.push_back(*q);
          delete q;
          check(rdma_destroy_id(id), "rdma_destroy_id");
          closed_.fetch_add(1, std::memory_order_release);
          break;
        }
        default:
          break;
      }
    }
  }
  ibv_mr* mr_ = nullptr;
  char buffer_[64] = {};
  std::atomic<long> received_{0};
  std::vector<PooledQueues> pool_;
};

/// rpmapp's EventLoop on the server thread, with handlers: EventLoop::serve accepts each
/// request (with `config`), EventLoop::watch on each Conn releases it when it is closed.
/// The loop runs until stop() (EventLoop::stop is the one call made from another thread).
class CallbackServer : public Server {
 public:
  CallbackServer(const rpmapp::Peer& peer, const char* ip, const char* port, const rpmapp::ConnConfig& config = {})
      : loop_(must(rpmapp::EventLoop::create(), "EventLoop::create")),
        ep_(must(rpmapp::Endpoint::listen(peer, ip, port), "Endpoint::listen")) {
    serving_ = must(loop_.serve(ep_, [this](rpmapp::expected<rpmapp::ConnReq> req) { on_request(std::move(req)); },
                                config),
                    "EventLoop::serve");
  }
  ~CallbackServer() override {
    conns_.clear();
    serving_.reset();
    (void)std::move(ep_).shutdown();
  }
  void start() override {
    thread_ = std::thread([this] { must(loop_.run(), "EventLoop::run"); });
  }
  void stop() override {
    loop_.stop();
    thread_.join();
  }

 private:
  struct Served {
    rpmapp::Conn conn;
    rpmapp::Registration watching;
  };
  using Slot = std::list<Served>::iterator;

  void on_request(rpmapp::expected<rpmapp::ConnReq> req) {
    auto conn = must(must(std::move(req), "EventLoop::serve handler").connect(), "ConnReq::connect");
    Slot at = conns_.insert(conns_.end(), Served{std::move(conn), {}});
    at->watching = must(loop_.watch(at->conn, [this, at](rpmapp::expected<rpmapp::ConnEvent> ev) { on_event(at, std::move(ev)); }),
                        "EventLoop::watch");
  }
  void on_event(Slot at, rpmapp::expected<rpmapp::ConnEvent> ev) {
    const auto what = must(std::move(ev), "EventLoop::watch handler");
    if (what == rpmapp::ConnEvent::established) count_established();
    if (what != rpmapp::ConnEvent::closed) return;
    at->watching.reset();  // inside its own handler: not called again
    must(std::move(at->conn).close(), "Conn::close");
    conns_.erase(at);
    closed_.fetch_add(1, std::memory_order_release);
  }

  rpmapp::EventLoop loop_;
  rpmapp::Endpoint ep_;
  rpmapp::Registration serving_;
  std::list<Served> conns_;
  std::thread thread_;
};

/// rpmapp's EventLoop on the server thread, with coroutines (task.hpp): one Task
/// co_awaits next_conn_req and spawns a Task per connection, which co_awaits next_event
/// until closed and releases the Conn. stop() stops the loop, which resumes every
/// suspended coroutine with no_event: they return.
class CoroutineServer : public Server {
 public:
  CoroutineServer(const rpmapp::Peer& peer, const char* ip, const char* port)
      : loop_(must(rpmapp::EventLoop::create(), "EventLoop::create")),
        ep_(must(rpmapp::Endpoint::listen(peer, ip, port), "Endpoint::listen")) {}
  ~CoroutineServer() override { (void)std::move(ep_).shutdown(); }
  void start() override {
    thread_ = std::thread([this] {
      must(rpmapp::spawn(loop_, accept_all()), "spawn");
      must(loop_.run(), "EventLoop::run");
    });
  }
  void stop() override {
    loop_.stop();
    thread_.join();
  }

 private:
  /// True for the error stop() resumes an await with (no timeout is ever given).
  static bool stopped(const rpmapp::Error& e) { return e.code() == rpmapp::errc::no_event; }

  rpmapp::Task<void> accept_all() {
    for (;;) {
      auto req = co_await loop_.next_conn_req(ep_);
      if (!req && stopped(req.error())) co_return;
      auto conn = must(must(std::move(req), "EventLoop::next_conn_req").connect(), "ConnReq::connect");
      must(rpmapp::spawn(loop_, serve(std::move(conn))), "spawn");
    }
  }
  rpmapp::Task<void> serve(rpmapp::Conn conn) {
    for (;;) {
      auto ev = co_await loop_.next_event(conn);
      if (!ev && stopped(ev.error())) co_return;
      const auto what = must(std::move(ev), "EventLoop::next_event");
      if (what == rpmapp::ConnEvent::established) count_established();
      if (what == rpmapp::ConnEvent::closed) {
        must(std::move(conn).close(), "Conn::close");
        closed_.fetch_add(1, std::memory_order_release);
        co_return;
      }
    }
  }

  rpmapp::EventLoop loop_;
  rpmapp::Endpoint ep_;
  std::thread thread_;
};

// ---------------------------------------------------------------- servers by name

/// The servers `bench_connect serve` compares with the same client, in this order; the
/// first is the reference the others' ratios are taken against.
///   raw           RawServer: hand-written async librdmacm (one channel, no migration)
///   rpmapp-epoll  RpmappServer: rpmapp's Endpoint and Conns in a hand-written epoll loop
///   callback      CallbackServer: rpmapp's EventLoop with handlers
///   coroutine     CoroutineServer: rpmapp's EventLoop with a coroutine per connection
/// Another server goes in as a class above, a name here and a case in make_server().
inline constexpr std::array<const char*, 4> server_names = {"raw", "rpmapp-epoll", "callback", "coroutine"};

/// The server called `name` (see server_names), listening on ip:port; nullptr for an
/// unknown name.
inline std::unique_ptr<Server> make_server(std::string_view name, const rpmapp::Peer& peer, const char* ip,
                                           const char* port) {
  if (name == "raw") return std::make_unique<RawServer>(ip, port);
  if (name == "rpmapp-epoll") return std::make_unique<RpmappServer>(peer, ip, port);
  if (name == "callback") return std::make_unique<CallbackServer>(peer, ip, port);
  if (name == "coroutine") return std::make_unique<CoroutineServer>(peer, ip, port);
  return nullptr;
}

}  // namespace bench
