// A client process for the fault scenarios (faults_test.cpp starts it): makes ATTEMPTS
// connection attempts to IP:PORT, at most IN_FLIGHT at once, and counts how each ended:
// established (then disconnected and closed at once), rejected, unreachable, lost, failed
// (ConnReq::to or connect returned an error) or gave up (no CM event within TIMEOUT_MS:
// the client's own bound, e.g. a request the server's full backlog dropped and whose
// retries went unanswered). Prints one line
//   fault_client: attempts N established E rejected R unreachable U lost L failed F gave_up G
//                 slowest T seconds S
// (T: the longest attempt, in seconds; S: the whole run)
// and exits 0 when every attempt ended in one of these ways (an attempt never outlives
// its bound, so the process cannot hang), 1 on a usage or setup error.
//   fault_client IP PORT ATTEMPTS IN_FLIGHT TIMEOUT_MS
#include <rpmapp/rpmapp.hpp>

#include <poll.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
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
  long established = 0, rejected = 0, unreachable = 0, lost = 0, failed = 0, gave_up = 0;
  long ended() const { return established + rejected + unreachable + lost + failed + gave_up; }
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

}  // namespace

int main(int argc, char** argv) {
  if (argc != 6) {
    std::fprintf(stderr, "usage: fault_client IP PORT ATTEMPTS IN_FLIGHT TIMEOUT_MS\n");
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
              "failed %ld gave_up %ld slowest %.1f seconds %.1f\n",
              attempts, counts.established, counts.rejected, counts.unreachable, counts.lost,
              counts.failed, counts.gave_up, slowest, seconds);
  return 0;
}
