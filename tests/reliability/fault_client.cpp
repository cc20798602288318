// A client process for the fault scenarios (faults_test.cpp starts it): makes ATTEMPTS
// connection attempts to IP:PORT, at most IN_FLIGHT at once, and counts how each ended:
// established (then disconnected and closed at once), rejected, unreachable, lost, refused
// (iWARP: rdma_connect's TCP connection refused, ECONNREFUSED), failed (ConnReq::to or
// connect returned another error) or gave up (no CM event within TIMEOUT_MS: the client's
// own bound, e.g. a request the server's full backlog dropped and whose retries went
// unanswered). Prints one line
//   fault_client: attempts N established E rejected R unreachable U lost L refused C failed F
//                 gave_up G slowest T seconds S
// (T: the longest attempt, in seconds; S: the whole run)
// and exits 0 when every attempt ended in one of these ways (an attempt never outlives
// its bound, so the process cannot hang), 1 on a usage or setup error.
//   fault_client IP PORT ATTEMPTS IN_FLIGHT TIMEOUT_MS
//
// Two more roles, each a hostile or restricted process:
//   fault_client --no-establish IP PORT kill|exit
// connects with librdmacm directly, WITHOUT a queue pair on its cm_id: librdmacm then
// hands the REP to the application as RDMA_CM_EVENT_CONNECT_RESPONSE instead of sending
// the RTU itself (rdma-core librdmacm/cma.c, rdma_get_cm_event; the RTU is sent by
// ucma_process_conn_resp, reached only through rdma_establish here). On that event it
// prints "fault_client: connect response after S s" and SIGKILLs itself, or _exit()s
// without destroying anything: the server has accepted, the connection is never
// established. Exits 1 when anything before that fails or takes over 20 s. iWARP has no
// connection without a queue pair (iw_cm's connect names one) and no RTU: there the client
// connects with a queue pair (rdma_connect makes the TCP connection and sends the MPA
// request), prints "fault_client: connect request sent after S s", and dies at once,
// before the server's MPA reply.
//   fault_client --memlock IP UID LIMIT_BYTES REGION_BYTES
// as root: lowers RLIMIT_MEMLOCK's soft limit to LIMIT_BYTES, becomes UID (setgid, setuid:
// no capabilities left), opens a Peer on IP and prints "fault_client: memlock ready";
// after a line on stdin registers 4 KiB (within the limit), then REGION_BYTES (beyond it),
// then 4 KiB again, prints each outcome ("fault_client: memlock KEY: VALUE"), prints
// "fault_client: memlock done"; after another line raises the soft limit to the hard one,
// registers REGION_BYTES again and exits 0 (1 on a setup error). The parent reads the
// process's ledger at "ready" and at "done".
//   fault_client --echo IP PORT CONNECTIONS
// the scale scenario's client: makes CONNECTIONS connections to IP:PORT one after the
// other, all on one SharedEventChannel and one SharedCq (so the client holds thousands
// without an fd or a CQ each), and on each, once established, one round trip: a message
// that names the process and the connection, whose echo must come back on the same
// connection, byte for byte. On iWARP a first message whose echo has not come back
// within 1 s is sent again: a stock siw can leave the active side's first message unread
// until the next frame arrives (docs/peer.md, "the active side's first message"; the
// VM's siw has a fix); then both echoes must come back. Keeps them all; prints "fault_client: echo ready round_trips N
// resent K seconds S" (K: the messages sent again), and after a line on stdin disconnects
// them all, waits for each one's closed, releases them and prints "fault_client: echo
// done". Exits 1 on the first failure (printed), each wait bounded by 30 s.
#include <rpmapp/rpmapp.hpp>

#include <arpa/inet.h>
#include <grp.h>
#include <netinet/in.h>
#include <poll.h>
#include <rdma/rdma_cma.h>
#include <signal.h>
#include <sys/resource.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

namespace {

using Clock = std::chrono::steady_clock;

struct Attempt {
  rpmapp::Conn conn;
  Clock::time_point start, deadline;
};

struct Counts {
  long established = 0, rejected = 0, unreachable = 0, lost = 0, refused = 0, failed = 0, gave_up = 0;
  long ended() const { return established + rejected + unreachable + lost + refused + failed + gave_up; }
};

long number(const char* text, const char* what) {
  char* end = nullptr;
  const long value = std::strtol(text, &end, 10);
  if (end == text || *end != '\0' || value < 0) {
    std::fprintf(stderr, "fault_client: %s is not a number: %s\n", what, text);
    std::exit(1);
  }
  return value;
}

// Ends an attempt that produced `event`: an established connection is disconnected and
// closed at once (the server sees closed).
void count_event(Counts& counts, rpmapp::ConnEvent event, rpmapp::Conn& conn) {
  switch (event) {
    case rpmapp::ConnEvent::established:
      ++counts.established;
      (void)conn.disconnect();
      break;
    case rpmapp::ConnEvent::rejected: ++counts.rejected; break;
    case rpmapp::ConnEvent::unreachable: ++counts.unreachable; break;
    case rpmapp::ConnEvent::lost:
    case rpmapp::ConnEvent::closed: ++counts.lost; break;
  }
}

[[noreturn]] void fail(const char* what) {
  std::fprintf(stderr, "fault_client: %s: %s (errno %d)\n", what, std::strerror(errno), errno);
  std::exit(1);
}

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// The next CM event on `channel` within 20 s; exits 1 unless it is `expected`.
void expect_cm_event(rdma_event_channel* channel, rdma_cm_event_type expected) {
  pollfd p{channel->fd, POLLIN, 0};
  if (::poll(&p, 1, 20000) != 1) {
    std::fprintf(stderr, "fault_client: no CM event within 20 s (waiting for %s)\n", rdma_event_str(expected));
    std::exit(1);
  }
  rdma_cm_event* event = nullptr;
  if (rdma_get_cm_event(channel, &event) != 0) fail("rdma_get_cm_event");
  const rdma_cm_event_type type = event->event;
  const int status = event->status;
  rdma_ack_cm_event(event);
  if (type != expected) {
    std::fprintf(stderr, "fault_client: %s (status %d) where %s was expected\n", rdma_event_str(type), status,
                 rdma_event_str(expected));
    std::exit(1);
  }
}

[[noreturn]] void die_now(bool kill_self) {
  std::fflush(stdout);
  if (kill_self) ::raise(SIGKILL);
  ::_exit(0);
}

// iWARP's counterpart (see the top): a connection with its queue pair, the MPA request
// sent, and death before the reply.
int connect_and_die(const char* ip, const char* port, const rpmapp::Peer& peer, bool kill_self) {
  auto req = rpmapp::ConnReq::to(peer, ip, port);
  if (!req) {
    std::fprintf(stderr, "fault_client: %s\n", req.error().message().c_str());
    return 1;
  }
  const auto t0 = Clock::now();
  auto conn = std::move(*req).connect();
  if (!conn) {
    std::fprintf(stderr, "fault_client: %s\n", conn.error().message().c_str());
    return 1;
  }
  std::printf("fault_client: connect request sent after %.3f s; %s before the reply\n", seconds_since(t0),
              kill_self ? "SIGKILL" : "_exit");
  die_now(kill_self);
}

// Connects without a queue pair and dies when the server's REP arrives (see the top).
int connect_without_establish(const char* ip, const char* port, bool kill_self) {
  if (auto peer = rpmapp::Peer::from_address(ip, rpmapp::AddressKind::local); peer && *peer->iwarp())
    return connect_and_die(ip, port, *peer, kill_self);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<std::uint16_t>(std::atoi(port)));
  if (::inet_pton(AF_INET, ip, &addr.sin_addr) != 1) {
    std::fprintf(stderr, "fault_client: not an IPv4 address: %s\n", ip);
    return 1;
  }
  rdma_event_channel* channel = rdma_create_event_channel();
  if (channel == nullptr) fail("rdma_create_event_channel");
  rdma_cm_id* id = nullptr;
  if (rdma_create_id(channel, &id, nullptr, RDMA_PS_TCP) != 0) fail("rdma_create_id");
  if (rdma_resolve_addr(id, nullptr, reinterpret_cast<sockaddr*>(&addr), 2000) != 0) fail("rdma_resolve_addr");
  expect_cm_event(channel, RDMA_CM_EVENT_ADDR_RESOLVED);
  if (rdma_resolve_route(id, 2000) != 0) fail("rdma_resolve_route");
  expect_cm_event(channel, RDMA_CM_EVENT_ROUTE_RESOLVED);
  rdma_conn_param param{};
  param.qp_num = 0x1234;  // no queue pair: any number; the server's QP only points at it
  param.responder_resources = 1;
  param.initiator_depth = 1;
  param.retry_count = 6;
  param.rnr_retry_count = 7;
  const auto t0 = Clock::now();
  if (rdma_connect(id, &param) != 0) fail("rdma_connect");
  expect_cm_event(channel, RDMA_CM_EVENT_CONNECT_RESPONSE);
  std::printf("fault_client: connect response after %.3f s; %s without rdma_establish\n", seconds_since(t0),
              kill_self ? "SIGKILL" : "_exit");
  die_now(kill_self);
}

// Reads one line from stdin (the parent's "go on"); false at EOF.
bool wait_for_parent() {
  for (int c = std::getchar();; c = std::getchar()) {
    if (c == EOF) return false;
    if (c == '\n') return true;
  }
}

void report_registration(const char* key, const rpmapp::Peer& peer, std::vector<std::byte>& memory, std::size_t len) {
  auto mr = rpmapp::MrLocal::reg(peer, memory.data(), len, rpmapp::MrUsage::read_src | rpmapp::MrUsage::write_dst);
  if (mr) {
    auto gone = std::move(*mr).dereg();
    std::printf("fault_client: memlock %s: %s\n", key, gone ? "ok" : gone.error().message().c_str());
  } else {
    const rpmapp::Error& e = mr.error();
    std::printf("fault_client: memlock %s: failed\n", key);
    std::printf("fault_client: memlock %s call: %s\n", key, std::string(e.call()).c_str());
    std::printf("fault_client: memlock %s errno: %d\n", key, e.sys_errno());
    std::printf("fault_client: memlock %s errc: %s\n", key, std::string(rpmapp::to_string(e.code())).c_str());
    std::printf("fault_client: memlock %s message: %s\n", key, e.message().c_str());
  }
  std::fflush(stdout);
}

// Registration under a small RLIMIT_MEMLOCK as an unprivileged user (see the top).
int memlock_as_user(const char* ip, long uid, long limit, long region) {
  rlimit memlock{};
  if (::getrlimit(RLIMIT_MEMLOCK, &memlock) != 0) fail("getrlimit");
  memlock.rlim_cur = static_cast<rlim_t>(limit);
  if (::setrlimit(RLIMIT_MEMLOCK, &memlock) != 0) fail("setrlimit");
  // Dropping root: the group first (setgid needs the privilege setuid gives up).
  if (::setgroups(0, nullptr) != 0) fail("setgroups");
  if (::setgid(static_cast<gid_t>(uid)) != 0) fail("setgid");
  if (::setuid(static_cast<uid_t>(uid)) != 0) fail("setuid");
  if (::setuid(0) == 0) {
    std::fprintf(stderr, "fault_client: still able to become root\n");
    return 1;
  }
  auto peer = rpmapp::Peer::from_address(ip, rpmapp::AddressKind::local);
  if (!peer) {
    std::fprintf(stderr, "fault_client: Peer::from_address: %s\n", peer.error().message().c_str());
    return 1;
  }
  std::vector<std::byte> memory(static_cast<std::size_t>(region));
  std::printf("fault_client: memlock uid: %d\nfault_client: memlock euid: %d\n", static_cast<int>(::getuid()),
              static_cast<int>(::geteuid()));
  std::printf("fault_client: memlock ready\n");
  std::fflush(stdout);
  if (!wait_for_parent()) return 1;
  report_registration("within", *peer, memory, 4096);
  report_registration("over", *peer, memory, memory.size());
  report_registration("within_after", *peer, memory, 4096);
  std::printf("fault_client: memlock done\n");
  std::fflush(stdout);
  if (!wait_for_parent()) return 1;
  memlock.rlim_cur = memlock.rlim_max;  // an unprivileged process may raise it up to the hard limit
  if (::setrlimit(RLIMIT_MEMLOCK, &memlock) != 0) fail("setrlimit (raise)");
  report_registration("raised", *peer, memory, memory.size());
  return 0;
}

}  // namespace

// The scale scenario's client (see the top).
int echo_client(const std::string& ip, const std::string& port, long connections) {
  constexpr std::size_t slot = 64;  // per connection: its message, then an echo slot for each of two echoes
  constexpr std::size_t slots = 3;
  constexpr auto bound = std::chrono::milliseconds(30000);
  constexpr auto resend_after = std::chrono::milliseconds(1000);  // iWARP: see the top
  auto report = [](const char* what, const rpmapp::Error& e) {
    std::fprintf(stderr, "fault_client: echo: %s: %s\n", what, e.message().c_str());
    return 1;
  };
  auto peer = rpmapp::Peer::from_address(ip, rpmapp::AddressKind::remote);
  if (!peer) return report("Peer::from_address", peer.error());
  auto iwarp = peer->iwarp();
  if (!iwarp) return report("Peer::iwarp", iwarp.error());
  auto events = rpmapp::SharedEventChannel::create();
  if (!events) return report("SharedEventChannel::create", events.error());
  auto shared = rpmapp::SharedCq::create(*peer, {.size = 256});
  if (!shared) return report("SharedCq::create", shared.error());
  auto cq = shared->cq();
  if (!cq) return report("SharedCq::cq", cq.error());
  std::vector<char> memory(static_cast<std::size_t>(connections) * slots * slot);
  auto mr = rpmapp::MrLocal::reg(*peer, memory.data(), memory.size(), rpmapp::MrUsage::send | rpmapp::MrUsage::recv);
  if (!mr) return report("MrLocal::reg", mr.error());
  rpmapp::ConnConfig config;
  config.sq_size = config.rq_size = *iwarp ? 2 : 1;  // iWARP: room for a message sent again and its echo
  config.shared_cq = &*shared;
  config.shared_event_channel = &*events;
  std::vector<rpmapp::Conn> conns;
  conns.reserve(static_cast<std::size_t>(connections));
  long resent = 0;
  const auto t0 = Clock::now();
  for (long i = 0; i < connections; ++i) {
    auto req = rpmapp::ConnReq::to(*peer, ip, port, config);
    if (!req) return report("ConnReq::to", req.error());
    const std::size_t at = static_cast<std::size_t>(i) * slots * slot;
    for (std::uint64_t r = 1; r <= config.rq_size; ++r)
      if (auto ok = req->recv(*mr, at + r * slot, slot, r); !ok) return report("ConnReq::recv", ok.error());
    auto conn = std::move(*req).connect();
    if (!conn) return report("ConnReq::connect", conn.error());
    auto event = conn->next_event_for(bound);
    if (!event) return report("Conn::next_event_for", event.error());
    if (*event != rpmapp::ConnEvent::established) {
      std::fprintf(stderr, "fault_client: echo: connection %ld %s\n", i, std::string(rpmapp::to_string(*event)).c_str());
      return 1;
    }
    const int n = std::snprintf(memory.data() + at, slot, "echo %d.%ld", static_cast<int>(::getpid()), i);
    auto send = [&] { return conn->send(*mr, at, static_cast<std::size_t>(n), rpmapp::Completion::always, 0); };
    if (auto ok = send(); !ok) return report("Conn::send", ok.error());
    const rpmapp::ConnId mine = *conn->id();
    int sent = 0, messages = 1, echoes = 0;
    while (sent < messages || echoes < messages) {
      ibv_wc wc[2];
      rpmapp::ConnId from[2];
      const bool may_resend = *iwarp && messages == 1 && echoes == 0;
      auto got = cq->next_for(wc, from, may_resend ? resend_after : bound);
      if (!got && may_resend && got.error().code() == rpmapp::errc::no_completion) {
        if (auto ok = send(); !ok) return report("Conn::send (again)", ok.error());
        ++messages;
        ++resent;
        continue;
      }
      if (!got) return report("Cq::next_for", got.error());
      for (std::size_t k = 0; k < got->size(); ++k) {
        if (auto ok = rpmapp::check(wc[k]); !ok) return report("a completion", ok.error());
        if (from[k] != mine) {
          std::fprintf(stderr, "fault_client: echo: a completion of connection %ld tagged with another\n", i);
          return 1;
        }
        if (wc[k].opcode == IBV_WC_SEND) ++sent;
        if (wc[k].opcode == IBV_WC_RECV) {
          const char* echo = memory.data() + at + wc[k].wr_id * slot;
          if (wc[k].byte_len != static_cast<std::uint32_t>(n) || std::memcmp(memory.data() + at, echo, n) != 0) {
            std::fprintf(stderr, "fault_client: echo: connection %ld: the echo differs from \"%.*s\"\n", i, n,
                         memory.data() + at);
            return 1;
          }
          ++echoes;
        }
      }
    }
    conns.push_back(std::move(*conn));
  }
  std::printf("fault_client: echo ready round_trips %ld resent %ld seconds %.3f\n", connections, resent, seconds_since(t0));
  std::fflush(stdout);
  char line[8];
  if (::read(STDIN_FILENO, line, sizeof line) <= 0) return 1;
  for (auto& conn : conns)
    if (auto ok = conn.disconnect(); !ok) return report("Conn::disconnect", ok.error());
  // each one's closed before releasing it: closing while its disconnect request is
  // unanswered cancels the request (on kernel 7.2, 76 of 1,000 never left, docs/peer.md)
  for (std::size_t i = 0; i < conns.size(); ++i) {
    auto event = conns[i].next_event_for(bound);
    if (!event) return report("Conn::next_event_for", event.error());
    if (*event != rpmapp::ConnEvent::closed) {
      std::fprintf(stderr, "fault_client: echo: connection %zu %s instead of closed\n", i,
                   std::string(rpmapp::to_string(*event)).c_str());
      return 1;
    }
  }
  for (auto& conn : conns)
    if (auto ok = std::move(conn).close(); !ok) return report("Conn::close", ok.error());
  std::printf("fault_client: echo done\n");
  return 0;
}

int main(int argc, char** argv) {
  if (argc == 5 && std::strcmp(argv[1], "--no-establish") == 0 &&
      (std::strcmp(argv[4], "kill") == 0 || std::strcmp(argv[4], "exit") == 0))
    return connect_without_establish(argv[2], argv[3], std::strcmp(argv[4], "kill") == 0);
  if (argc == 6 && std::strcmp(argv[1], "--memlock") == 0)
    return memlock_as_user(argv[2], number(argv[3], "UID"), number(argv[4], "LIMIT_BYTES"),
                           number(argv[5], "REGION_BYTES"));
  if (argc == 5 && std::strcmp(argv[1], "--echo") == 0) return echo_client(argv[2], argv[3], number(argv[4], "CONNECTIONS"));
  if (argc != 6) {
    std::fprintf(stderr,
                 "usage: fault_client IP PORT ATTEMPTS IN_FLIGHT TIMEOUT_MS\n"
                 "       fault_client --echo IP PORT CONNECTIONS\n"
                 "       fault_client --no-establish IP PORT kill|exit\n"
                 "       fault_client --memlock IP UID LIMIT_BYTES REGION_BYTES\n");
    return 1;
  }
  const std::string ip = argv[1], port = argv[2];
  const long attempts = number(argv[3], "ATTEMPTS");
  const long in_flight = std::max(1L, number(argv[4], "IN_FLIGHT"));
  const auto timeout = std::chrono::milliseconds(number(argv[5], "TIMEOUT_MS"));
  auto peer = rpmapp::Peer::from_address(ip, rpmapp::AddressKind::remote);
  if (!peer) {
    std::fprintf(stderr, "fault_client: Peer::from_address: %s\n", peer.error().message().c_str());
    return 1;
  }
  rpmapp::ConnConfig config;  // small queues: many connections, no data
  config.cq_size = config.sq_size = config.rq_size = 1;
  config.timeout = std::chrono::milliseconds(2000);

  const auto t0 = Clock::now();
  Counts counts;
  long started = 0;
  std::vector<Attempt> active;
  std::vector<pollfd> fds;
  double slowest = 0;  // seconds of the longest attempt: a request the backlog dropped is
                       // retried by the IB CM after its response timeout (about 4 s)
  while (counts.ended() < attempts) {
    while (started < attempts && static_cast<long>(active.size()) < in_flight) {
      ++started;
      auto req = rpmapp::ConnReq::to(*peer, ip, port, config);
      if (!req) {
        std::fprintf(stderr, "fault_client: ConnReq::to: %s\n", req.error().message().c_str());
        ++counts.failed;
        continue;
      }
      auto conn = std::move(*req).connect();
      if (!conn && conn.error().call() == "rdma_connect" && conn.error().sys_errno() == ECONNREFUSED) {
        ++counts.refused;  // iWARP: nothing listens (any more) for the TCP connection
        continue;
      }
      if (!conn) {
        std::fprintf(stderr, "fault_client: connect: %s\n", conn.error().message().c_str());
        ++counts.failed;
        continue;
      }
      active.push_back({std::move(*conn), Clock::now(), Clock::now() + timeout});
    }
    if (active.empty()) continue;
    fds.clear();
    for (auto& a : active) fds.push_back({*a.conn.fd(), POLLIN, 0});
    ::poll(fds.data(), fds.size(), 50);
    const auto now = Clock::now();
    for (std::size_t i = active.size(); i-- > 0;) {
      Attempt& a = active[i];
      bool done = false;
      auto event = a.conn.try_next_event();
      if (event) {
        count_event(counts, *event, a.conn);
        done = true;
      } else if (event.error().code() != rpmapp::errc::no_event) {
        std::fprintf(stderr, "fault_client: next_event: %s\n", event.error().message().c_str());
        ++counts.failed;
        done = true;
      } else if (now >= a.deadline) {
        ++counts.gave_up;
        done = true;
      }
      if (done) {
        slowest = std::max(slowest, std::chrono::duration<double>(now - a.start).count());
        if (auto closed = std::move(a.conn).close(); !closed)
          std::fprintf(stderr, "fault_client: Conn::close: %s\n", closed.error().message().c_str());
        if (i + 1 != active.size()) active[i] = std::move(active.back());
        active.pop_back();
      }
    }
  }
  const double seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  std::printf("fault_client: attempts %ld established %ld rejected %ld unreachable %ld lost %ld "
              "refused %ld failed %ld gave_up %ld slowest %.1f seconds %.1f\n",
              attempts, counts.established, counts.rejected, counts.unreachable, counts.lost,
              counts.refused, counts.failed, counts.gave_up, slowest, seconds);
  return 0;
}
