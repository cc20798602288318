// Benchmark 8: memory of a server holding N established connections, per connection.
// Each measurement is a fresh server process (memory a process has touched does not go
// back, so no variant may follow another in the same process) with the clients in a
// process of their own (their memory is not measured):
//   - the server listens (bench/servers.hpp: rpmapp's Endpoint + ConnReq::connect + Conn
//     in an epoll loop; rpmapp's EventLoop with handlers and every connection on one
//     SharedCq, one Srq and one SharedEventChannel ("rpmapp-shared": no CQ, completion
//     channel or event channel per connection); librpma's
//     rpma_ep_listen + rpma_conn_req_connect; hand-written librdmacm with a CQ per
//     connection, and with one CQ and one SRQ for all ("hand-shared", rpmapp-shared's
//     counterpart)), resets its peak RSS (/proc/self/clear_refs) and reads its RSS: the
//     listener alone;
//   - it spawns the client, which makes N raw librdmacm connections (C in flight) and
//     keeps them; once the server has seen all N established it reads RSS and peak again;
//   - then the client disconnects everything and the server releases it.
// Values, in KiB per connection: (RSS with N - RSS of the listener) / N, the same for the
// peak RSS (the listener's RSS is the peak's start), and for the anonymous part of RSS (the
// heap, where each library keeps its state per connection; the rest is mostly rxe's rings,
// mapped from /dev/infiniband/uverbs*, 16 KiB a connection for all three); and the open fds
// per connection; and the accept rate at 100, 1,000 and 10,000 established: a batch of
// 600 more connections on top of k, 500 of them timed on the client's clock (one raw
// client keeps `inflight` requests going), and the server thread's CPU time per
// connection over the same ones (RatePoint); and, as before, the rate between k/2 and k
// while the N are made ("conn/s filling").
// Usage: bench_memory [reps] [N]               reps rounds, the three servers in a rotating
//                                               order, each in its own process
//        bench_memory server VARIANT N REP     one measurement (prints its R lines)
//        bench_memory client PORT N READY GO VARIANT REP
//                                              the clients (spawned by the server)
#include "servers.hpp"

#include <spawn.h>
#include <sys/resource.h>
#include <sys/wait.h>

#include <dirent.h>

#include <algorithm>
#include <fstream>
#include <initializer_list>
#include <optional>

extern char** environ;

namespace bench {
namespace {

constexpr std::array<const char*, 5> memory_variants = {"rpmapp", "rpmapp-shared", "librpma", "hand", "hand-shared"};
/// Each variant on its own port, so that a late teardown of one cannot meet the next.
constexpr int port_base = 7491;
constexpr int inflight = 16;

/// The accept rate at k established (k = 100, 1,000 and 10,000, up to N): once the client
/// holds k connections it makes a batch of `size` more, `inflight` at a time, and times
/// the last `size - skipped` of them (hundreds, where the rate between k/2 and k
/// established, 50 connections at k = 100, swung 2x between repetitions); then it
/// disconnects the batch and goes on once its connections are closed. At k = N this runs
/// after the server has read its memory.
struct RatePoint {
  static constexpr int size = 600;
  static constexpr int skipped = 100;
  int k;
  /// The server's established count at the first and at the last timed one: the
  /// connections held, the ones still being set up when the batch began, and the batches
  /// of the points before.
  long server_from;
  long server_to;
};

std::vector<RatePoint> rate_points(int n) {
  std::vector<RatePoint> points;
  for (int k : {100, 1000, 10000}) {
    if (k > n) break;
    const long base = k + std::min(inflight - 1, n - k) + static_cast<long>(RatePoint::size) * static_cast<long>(points.size());
    points.push_back({k, base + RatePoint::skipped, base + RatePoint::size});
  }
  return points;
}

struct Status {
  long vm_rss_kib = 0;  // /proc/self/status: the kernel's counters
  long hwm_kib = 0;
  long rss_kib = 0;  // /proc/self/smaps_rollup: counted in the page tables
  long anon_kib = 0;  // the heap and stacks: the libraries' and the program's own state
};

/// Reads "Key: value kB" lines of a /proc file into the fields named.
void read_kib(const char* path, std::initializer_list<std::pair<const char*, long*>> fields) {
  std::ifstream f(path);
  std::string key;
  while (f >> key) {
    for (auto [name, value] : fields)
      if (key == name) f >> *value;
    f.ignore(1 << 20, '\n');
  }
  for (auto [name, value] : fields)
    if (*value == 0) die(path, std::string("no ") + name);
}

/// VmRSS and VmHWM are the kernel's counters, which each thread updates in batches of 64
/// page faults on kernels before 6.2 (the guest's is 6.1): off by up to 256 KiB per thread.
/// smaps_rollup counts what the page tables hold, exactly, so RSS and its anonymous part
/// come from there; the peak exists only as VmHWM, so it is taken as VmHWM - VmRSS (same
/// counters, same moment) above the exact RSS.
Status read_status() {
  Status s;
  read_kib("/proc/self/status", {{"VmRSS:", &s.vm_rss_kib}, {"VmHWM:", &s.hwm_kib}});
  read_kib("/proc/self/smaps_rollup", {{"Rss:", &s.rss_kib}, {"Anonymous:", &s.anon_kib}});
  return s;
}

/// "5" resets VmHWM to the current RSS (Linux 4.0): the peak counts from here on.
void reset_peak() {
  std::ofstream f("/proc/self/clear_refs");
  f << "5";
  f.flush();
  if (!f) die("/proc/self/clear_refs", "cannot reset the peak RSS");
}

int open_fds() {
  DIR* d = opendir("/proc/self/fd");
  if (d == nullptr) die("/proc/self/fd", std::strerror(errno));
  int n = 0;
  while (dirent* e = readdir(d))
    if (e->d_name[0] != '.') ++n;
  closedir(d);
  return n - 1;  // the directory's own fd
}

/// Room for `want` descriptors, as a server with many connections must ask for: the soft
/// limit up to the hard one, and the hard one too when allowed (root in the VM).
void allow_fds(rlim_t want) {
  rlimit r{};
  if (getrlimit(RLIMIT_NOFILE, &r) != 0) die("getrlimit", std::strerror(errno));
  if (r.rlim_cur >= want) return;
  rlimit more{std::max(want, r.rlim_cur), std::max(want, r.rlim_max)};
  if (setrlimit(RLIMIT_NOFILE, &more) == 0) return;
  r.rlim_cur = r.rlim_max;
  if (setrlimit(RLIMIT_NOFILE, &r) != 0) die("setrlimit", std::strerror(errno));
  if (r.rlim_cur < want)
    std::fprintf(stderr, "bench_memory: only %lu file descriptors allowed (wanted %lu)\n",
                 static_cast<unsigned long>(r.rlim_cur), static_cast<unsigned long>(want));
}

pid_t spawn(const std::vector<std::string>& args) {
  std::vector<char*> argv;
  for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  pid_t pid = -1;
  const int rc = posix_spawn(&pid, "/proc/self/exe", nullptr, nullptr, argv.data(), environ);
  if (rc != 0) die("posix_spawn", std::strerror(rc));
  return pid;
}

void await_exit(pid_t pid, const char* what) {
  int status = 0;
  if (waitpid(pid, &status, 0) != pid) die("waitpid", std::strerror(errno));
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) die(what, "failed (status " + std::to_string(status) + ")");
}

// ---------------------------------------------------------------- the clients

/// N raw librdmacm connections on one non-blocking event channel, `inflight` being set up
/// at a time; writes one byte to `ready` when all are established, waits for one byte on
/// `go`, measures the rate at N if N is a rate point, disconnects them all and releases
/// them when they are closed. Prints the rates (RatePoint) and, as before, the rate between
/// k/2 and k established while filling.
int run_client(const char* ip, const char* port, int n, int ready, int go, const char* variant, int rep) {
  allow_fds(static_cast<rlim_t>(n) + 64);
  rdma_event_channel* ch = check_ptr(rdma_create_event_channel(), "rdma_create_event_channel");
  set_nonblocking(ch->fd);
  ibv_pd* pd = nullptr;
  ibv_cq* cq = nullptr;
  std::vector<rdma_cm_id*> ids;  // the ones kept
  int started = 0, established = 0, closed = 0;
  std::vector<std::chrono::steady_clock::time_point> at(static_cast<std::size_t>(n) + 1);  // [k]: k established
  static int batch_tag;  // a batch id's context
  const std::vector<RatePoint> points = rate_points(n);
  std::size_t point = 0;  // the next rate point
  bool in_batch = false;
  int batch_started = 0, batch_established = 0, batch_closed = 0;
  std::vector<std::chrono::steady_clock::time_point> batch_at(RatePoint::size + 1);
  std::vector<rdma_cm_id*> batch_ids;
  auto launch = [&](bool batched) {
    rdma_addrinfo hints{};
    hints.ai_flags = RAI_NUMERICHOST;
    hints.ai_port_space = RDMA_PS_TCP;
    hints.ai_qp_type = IBV_QPT_RC;
    rdma_addrinfo* ai = nullptr;
    check(rdma_getaddrinfo(ip, port, &hints, &ai), "rdma_getaddrinfo");
    rdma_cm_id* id = nullptr;
    check(rdma_create_id(ch, &id, batched ? &batch_tag : nullptr, RDMA_PS_TCP), "rdma_create_id");
    check(rdma_resolve_addr(id, ai->ai_src_addr, ai->ai_dst_addr, 2000), "rdma_resolve_addr");
    rdma_freeaddrinfo(ai);
    if (batched) {
      batch_ids.push_back(id);
      ++batch_started;
    } else {
      ids.push_back(id);
      ++started;
    }
  };
  auto start_batch = [&] {
    in_batch = true;
    batch_started = batch_established = 0;
    launch(true);
  };
  // After a connection is established: keeps `inflight` going, a batch's while a rate
  // point is measured, then the rest of the N.
  auto launch_next = [&] {
    if (in_batch) {
      if (batch_started < RatePoint::size) launch(true);
    } else if (started < n) {
      launch(false);
    }
  };
  // The whole batch established: the rate; then they are disconnected.
  auto end_batch = [&] {
    const std::chrono::duration<double> took = batch_at[RatePoint::size] - batch_at[RatePoint::skipped];
    std::printf("R\tmemory\tN=%d, at %d\tconn/s\t%s\t%d\t%.6g\n", n, points[point].k, variant, rep,
                (RatePoint::size - RatePoint::skipped) / took.count());
    ++point;
    for (rdma_cm_id* id : batch_ids) check(rdma_disconnect(id), "rdma_disconnect");
    batch_ids.clear();
  };
  // Drains the channel; returns when `done()` holds.
  auto pump = [&](auto done) {
    while (!done()) {
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
        const int status = e->status;
        const bool batched = id->context == &batch_tag;
        rdma_ack_cm_event(e);
        switch (type) {
          case RDMA_CM_EVENT_ADDR_RESOLVED:
            check(rdma_resolve_route(id, 2000), "rdma_resolve_route");
            break;
          case RDMA_CM_EVENT_ROUTE_RESOLVED: {
            // One CQ for every client queue pair (they post nothing): rxe has at most 16,384
            // CQs per device, which the servers' own must fit into beside the clients'.
            if (pd == nullptr) pd = check_ptr(ibv_alloc_pd(id->verbs), "ibv_alloc_pd");
            if (cq == nullptr) cq = check_ptr(ibv_create_cq(id->verbs, 16, nullptr, nullptr, 0), "ibv_create_cq");
            ibv_qp_init_attr attr = raw_qp_attr(cq);
            check(rdma_create_qp(id, pd, &attr), "rdma_create_qp");
            rdma_conn_param param = raw_conn_param();
            check(rdma_connect(id, &param), "rdma_connect");
            break;
          }
          case RDMA_CM_EVENT_ESTABLISHED:
            if (batched) {
              batch_at[static_cast<std::size_t>(++batch_established)] = std::chrono::steady_clock::now();
              if (batch_established == RatePoint::size) {
                end_batch();
                break;
              }
            } else {
              ++established;
              at[static_cast<std::size_t>(established)] = std::chrono::steady_clock::now();
              if (point < points.size() && points[point].k == established && established < n) start_batch();
            }
            launch_next();
            break;
          case RDMA_CM_EVENT_DISCONNECTED:
            if (!batched) {
              ++closed;
              break;
            }
            rdma_destroy_qp(id);
            check(rdma_destroy_id(id), "rdma_destroy_id");
            if (++batch_closed == RatePoint::size * static_cast<int>(point)) {  // the batch is gone: the filling resumes
              in_batch = false;
              for (int i = 0; i < inflight && started < n; ++i) launch(false);
            }
            break;
          case RDMA_CM_EVENT_TIMEWAIT_EXIT:  // a disconnected QP left time-wait: nothing to do
            break;
          default:
            die("client", std::string(rdma_event_str(type)) + ", status " + std::to_string(status) + " after " +
                              std::to_string(established) + " established");
        }
      }
    }
  };
  for (int i = 0; i < inflight && started < n; ++i) launch(false);
  pump([&] { return established == n && !in_batch; });
  for (int k : {100, 1000, 10000}) {
    if (k > n) break;
    const std::chrono::duration<double> took = at[static_cast<std::size_t>(k)] - at[static_cast<std::size_t>(k / 2)];
    std::printf("R\tmemory\tN=%d, at %d\tconn/s filling\t%s\t%d\t%.6g\n", n, k, variant, rep,
                (k - k / 2) / took.count());
  }
  std::fflush(stdout);
  char byte = 'r';
  if (write(ready, &byte, 1) != 1) die("client: write", std::strerror(errno));
  if (read(go, &byte, 1) != 1) die("client: read", "the server went away");
  if (point < points.size()) {  // N itself is a rate point: measured after the server's memory
    start_batch();
    for (int i = 1; i < inflight; ++i) launch(true);
    pump([&] { return !in_batch; });
    std::fflush(stdout);
  }
  for (rdma_cm_id* id : ids) check(rdma_disconnect(id), "rdma_disconnect");
  pump([&] { return closed == n && batch_closed == RatePoint::size * static_cast<int>(points.size()); });
  for (rdma_cm_id* id : ids) {
    rdma_destroy_qp(id);
    check(rdma_destroy_id(id), "rdma_destroy_id");
  }
  if (cq != nullptr) check(ibv_destroy_cq(cq), "ibv_destroy_cq");
  if (pd != nullptr) ibv_dealloc_pd(pd);
  rdma_destroy_event_channel(ch);
  return 0;
}

// ---------------------------------------------------------------- one server

/// Only the variant's own library is set up in its process (besides what linking loads).
int run_server(const char* ip, const std::string& variant, int n, int rep) {
  // librpma: an event and a completion channel each, also for a rate point's batch
  allow_fds(3 * static_cast<rlim_t>(n + RatePoint::size) + 64);
  std::size_t index = 0;
  while (index < memory_variants.size() && variant != memory_variants[index]) ++index;
  if (index == memory_variants.size()) die("variant", variant);
  const std::string port = std::to_string(port_base + static_cast<int>(index));

  std::optional<rpmapp::Peer> peer;
  std::optional<rpmapp::SharedCq> shared_cq;
  std::optional<rpmapp::Srq> srq;
  std::optional<rpmapp::SharedEventChannel> events;
  rpma_peer* rpeer = nullptr;
  std::unique_ptr<Server> server;
  if (variant == "rpmapp" || variant == "rpmapp-shared") {
    peer.emplace(must(rpmapp::Peer::from_address(ip, rpmapp::AddressKind::local), "Peer::from_address"));
    if (variant == "rpmapp-shared") {
      shared_cq.emplace(must(rpmapp::SharedCq::create(*peer), "SharedCq::create"));
      srq.emplace(must(rpmapp::Srq::create(*peer), "Srq::create"));
      events.emplace(must(rpmapp::SharedEventChannel::create(), "SharedEventChannel::create"));
      // serve holds the queues and the channel: the handles may go with the server
      server = std::make_unique<CallbackServer>(
          *peer, ip, port.c_str(),
          rpmapp::ConnConfig{.srq = &*srq, .shared_cq = &*shared_cq, .shared_event_channel = &*events});
    } else {
      server = std::make_unique<RpmappServer>(*peer, ip, port.c_str());
    }
  } else if (variant == "librpma") {
    rpma_log_set_threshold(RPMA_LOG_THRESHOLD, RPMA_LOG_LEVEL_WARNING);
    ibv_context* ctx = nullptr;
    check(rpma_utils_get_ibv_context(ip, RPMA_UTIL_IBV_CONTEXT_LOCAL, &ctx), "rpma_utils_get_ibv_context");
    check(rpma_peer_new(ctx, &rpeer), "rpma_peer_new");
    server = std::make_unique<LibrpmaServer>(rpeer, ip, port.c_str());
  } else {
    server = std::make_unique<RawServer>(ip, port.c_str(), variant == "hand-shared");
  }
  const std::vector<RatePoint> points = rate_points(n);
  std::vector<long> cpu_counts;
  for (const RatePoint& c : points) cpu_counts.insert(cpu_counts.end(), {c.server_from, c.server_to});
  server->time_cpu_at(cpu_counts);
  server->start();

  // The client inherits only its ends (so that it sees EOF on `go` if the server dies).
  int ready[2], go[2];
  if (pipe2(ready, O_CLOEXEC) != 0 || pipe2(go, O_CLOEXEC) != 0) die("pipe2", std::strerror(errno));
  if (fcntl(ready[1], F_SETFD, 0) != 0 || fcntl(go[0], F_SETFD, 0) != 0) die("fcntl", std::strerror(errno));
  reset_peak();
  const Status alone = read_status();
  const pid_t client = spawn({"bench_memory", "client", port, std::to_string(n), std::to_string(ready[1]),
                              std::to_string(go[0]), variant, std::to_string(rep)});
  ::close(ready[1]);
  ::close(go[0]);
  const int fds_alone = open_fds();
  char byte = 0;
  if (read(ready[0], &byte, 1) != 1) {  // the client died: its message is on stderr
    await_exit(client, "the client");
    die("the client", "ended before all connections were established");
  }
  // Everything established, and the batches before N released.
  const long batched_before = RatePoint::size * static_cast<long>(std::count_if(
                                                 points.begin(), points.end(), [&](const RatePoint& c) { return c.k < n; }));
  while (server->established() < n + batched_before || server->closed() < batched_before)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  const Status full = read_status();
  const int fds_full = open_fds();

  if (write(go[1], &byte, 1) != 1) die("write", std::strerror(errno));
  const long batched = RatePoint::size * static_cast<long>(points.size());
  while (server->closed() < n + batched) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  await_exit(client, "the client");
  server->stop();
  std::vector<long> cpu_ns;
  for (std::size_t i = 0; i < cpu_counts.size(); ++i) cpu_ns.push_back(server->cpu_ns_at(i));
  server.reset();
  srq.reset();
  shared_cq.reset();
  events.reset();
  if (rpeer != nullptr) check(rpma_peer_delete(&rpeer), "rpma_peer_delete");

  const std::string param = "N=" + std::to_string(n);
  std::printf("R\tmemory\t%s\tKiB/conn RSS\t%s\t%d\t%.6g\n", param.c_str(), variant.c_str(), rep,
              static_cast<double>(full.rss_kib - alone.rss_kib) / n);
  // The peak: the exact RSS plus how far the counters' peak rose above their current value.
  std::printf("R\tmemory\t%s\tKiB/conn peak\t%s\t%d\t%.6g\n", param.c_str(), variant.c_str(), rep,
              static_cast<double>(full.rss_kib + (full.hwm_kib - full.vm_rss_kib) - alone.rss_kib) / n);
  std::printf("R\tmemory\t%s\tKiB/conn anonymous\t%s\t%d\t%.6g\n", param.c_str(), variant.c_str(), rep,
              static_cast<double>(full.anon_kib - alone.anon_kib) / n);
  std::printf("R\tmemory\t%s\tfds/conn\t%s\t%d\t%.6g\n", param.c_str(), variant.c_str(), rep,
              static_cast<double>(fds_full - fds_alone) / n);
  for (std::size_t i = 0; i < points.size(); ++i) {
    if (cpu_ns[2 * i] < 0 || cpu_ns[2 * i + 1] < 0) die("server", "CPU time not read");
    const long ns = cpu_ns[2 * i + 1] - cpu_ns[2 * i];
    std::printf("R\tmemory\tN=%d, at %d\tserver CPU us/conn\t%s\t%d\t%.6g\n", n, points[i].k, variant.c_str(),
                rep, static_cast<double>(ns) / 1000.0 / static_cast<double>(points[i].server_to - points[i].server_from));
  }
  std::fflush(stdout);
  std::fprintf(stderr,
               "bench_memory: %-7s rep %d: listener alone %ld KiB, with %d connections %ld KiB (VmRSS %ld -> %ld, "
               "VmHWM %ld); per connection %.2f KiB anonymous, %.2f KiB other; %d fds -> %d\n",
               variant.c_str(), rep, alone.rss_kib, n, full.rss_kib, alone.vm_rss_kib, full.vm_rss_kib,
               full.hwm_kib, static_cast<double>(full.anon_kib - alone.anon_kib) / n,
               static_cast<double>((full.rss_kib - full.anon_kib) - (alone.rss_kib - alone.anon_kib)) / n,
               fds_alone, fds_full);
  return 0;
}

}  // namespace
}  // namespace bench

int main(int argc, char** argv) {
  using namespace bench;
  const std::string mode = argc > 1 ? argv[1] : "";
  const char* ip = std::getenv("SOFTROCE_IP");
  if (ip == nullptr) die("SOFTROCE_IP", "not set (run inside tools/rpmapp-vm)");
  if (mode == "client" && argc == 8)
    return run_client(ip, argv[2], std::atoi(argv[3]), std::atoi(argv[4]), std::atoi(argv[5]), argv[6],
                      std::atoi(argv[7]));
  if (mode == "server" && argc == 5) return run_server(ip, argv[2], std::atoi(argv[3]), std::atoi(argv[4]));
  if (mode == "client" || mode == "server" || (argc > 1 && std::atoi(argv[1]) <= 0))
    die("usage", "bench_memory [reps] [N] | server VARIANT N REP | client PORT N READY GO VARIANT REP");

  const int reps = argc > 1 ? std::atoi(argv[1]) : 3;
  const int n = argc > 2 ? std::atoi(argv[2]) : 1000;
  if (n <= 0) die("usage", "N must be positive");
  // Round r runs the variants in the order r, r+1, ... (mod their number), as common.hpp's
  // interleave.
  for (int rep = 0; rep < reps; ++rep) {
    for (std::size_t k = 0; k < memory_variants.size(); ++k) {
      const char* variant = memory_variants[(static_cast<std::size_t>(rep) + k) % memory_variants.size()];
      const pid_t pid = spawn({"bench_memory", "server", variant, std::to_string(n), std::to_string(rep)});
      await_exit(pid, variant);
    }
  }
  return 0;
}
