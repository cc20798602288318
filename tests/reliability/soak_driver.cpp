// soak_driver --seconds S --seed X --out DIR [--addr A] [--port P]: the soak, inside the
// VM (tools/soak starts it there). Starts ONE soak_server and, for S seconds, keeps up to
// `parallel` jobs of soak_client processes (next to this program) running against it:
// normal multi-cycle clients and, drawn at random (seeded), faults: a client SIGKILLed
// mid-connect or mid-transfer, one that never speaks, garbage private data, an abrupt
// disconnect or exit, a small RLIMIT_NOFILE, a burst of clients over the backlog, and an
// endpoint shutdown + re-listen on the server. Every 5 s it samples the server's ledger
// (ledger.hpp) and RSS (/proc/PID/status) into DIR/samples.csv; every minute it prints a
// progress line; at the end a table (also DIR/summary.txt).
// Fails (exit 1) when the server dies, any process overruns its bound, any ERROR line
// appears (client or server), the server's ledger does not return to its baseline once
// its clients are gone, or its RSS grows by more than 8 MiB (ASan build: 32 MiB) between the first and
// last quarter of the samples.
#include "ledger.hpp"

#include <fmt/core.h>
#include <poll.h>
#include <csignal>
#include <sys/wait.h>

#include <algorithm>
#include <atomic>
#include <mutex>
#include <utility>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <map>
#include <random>
#include <string>
#include <thread>
#include <vector>
#include <fcntl.h>

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

namespace {

constexpr int parallel = 3;             // concurrent client jobs (the VM has 2 vCPUs)
constexpr int backlog = 4;              // the server's; a burst is burst_size at once
constexpr int burst_size = 12;
constexpr auto client_bound = 90s;      // any client process: its every wait is 30 s
constexpr auto sample_every = 5s;
// Allowed RSS growth, mean of the first to the last quarter of the samples. Under
// AddressSanitizer the allocator's size-class regions, its quarantine (limited to 4 MiB
// here) and their shadow grow with the addresses used for tens of seconds before they
// level off: its bound is wider, and the tight one applies to a build without sanitizers
// (ASan's leak check at the server's exit covers the heap there).
constexpr long rss_bound_kb = 8 * 1024;
constexpr long rss_bound_asan_kb = 32 * 1024;

std::string bin_dir;

struct Child {
  pid_t pid = -1;
  int out = -1;  // its stdout
  std::string buffer;
  std::string fault;  // "" for a normal client
  Clock::time_point started = Clock::now();
  Clock::time_point kill_at = Clock::time_point::max();
  bool killed = false;
  std::string last_line;
  std::string kill_on_stage;  // kill this long after this stage line (kill_delay)
  std::chrono::milliseconds kill_delay{0};
};

pid_t spawn(const std::vector<std::string>& args, int& out_fd, const char* asan_options = nullptr) {
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0) throw std::system_error(errno, std::generic_category(), "pipe2");
  const pid_t pid = ::fork();
  if (pid < 0) throw std::system_error(errno, std::generic_category(), "fork");
  if (pid == 0) {
    ::dup2(fds[1], 1);
    if (asan_options) ::setenv("ASAN_OPTIONS", asan_options, 1);
    std::vector<char*> argv;
    for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    ::execv(argv[0], argv.data());
    std::_Exit(127);
  }
  ::close(fds[1]);
  out_fd = fds[0];
  return pid;
}

long rss_kb(pid_t pid) {
  std::ifstream status("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  while (std::getline(status, line))
    if (line.rfind("VmRSS:", 0) == 0) return std::atol(line.c_str() + 6);
  return -1;
}

}  // namespace

int main(int argc, char** argv) {
  int seconds = 600;
  unsigned long long seed = 20261130;
  std::string out_dir = ".", addr = std::getenv("SOFTROCE_IP") ? std::getenv("SOFTROCE_IP") : "", port = "7201";
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string opt = argv[i], val = argv[i + 1];
    if (opt == "--seconds") seconds = std::atoi(val.c_str());
    else if (opt == "--seed") seed = std::strtoull(val.c_str(), nullptr, 10);
    else if (opt == "--out") out_dir = val;
    else if (opt == "--addr") addr = val;
    else if (opt == "--port") port = val;
    else return fmt::print(stderr, "soak_driver: unknown option {}\n", opt), 2;
  }
  if (addr.empty()) return fmt::print(stderr, "soak_driver: no --addr and no SOFTROCE_IP\n"), 2;
  bin_dir = std::string(argv[0]).substr(0, std::string(argv[0]).rfind('/') + 1);
  std::signal(SIGPIPE, SIG_IGN);
  fmt::print("soak: {} s, seed {} (replay: --seed {}), server {} port {}, backlog {}\n", seconds, seed, seed,
             addr, port, backlog);
  std::fflush(stdout);
  std::mt19937_64 rng(seed);

  std::map<std::string, long> faults, errors, outcomes;
  long cycles = 0;
  bool failed = false;
  auto error = [&](const std::string& kind, const std::string& message) {
    ++errors[kind];
    failed = true;
    fmt::print("ERROR {}: {}\n", kind, message);
    std::fflush(stdout);
  };

  // The server. ASan's quarantine (256 MB by default) would read as growth: keep it small.
  Child server;
  server.pid = spawn({bin_dir + "soak_server", addr, port, std::to_string(backlog)}, server.out,
                     "quarantine_size_mb=4:detect_leaks=1");
  bool listening = false, server_dead = false, server_asan = false;
  int relisten_pending = 0;
  Clock::time_point relisten_since;
  auto server_line = [&](const std::string& line) {
    if (line.rfind("listening on", 0) == 0) listening = true;
    else if (line == "built with AddressSanitizer") server_asan = true;
    else if (line == "relistened") --relisten_pending;
    else if (line.rfind("ERROR ", 0) == 0) error("server_" + line.substr(6, line.find(':') - 6), line);
    else if (line.rfind("final ", 0) == 0) fmt::print("server: {}\n", line);
  };

  std::vector<Child> clients;
  auto read_lines = [&](Child& c, auto on_line) {
    char buf[4096];
    const ssize_t n = ::read(c.out, buf, sizeof buf);
    if (n <= 0) return false;
    c.buffer.append(buf, static_cast<std::size_t>(n));
    for (std::size_t nl; (nl = c.buffer.find('\n')) != std::string::npos;) {
      on_line(c.buffer.substr(0, nl));
      c.buffer.erase(0, nl + 1);
    }
    return true;
  };
  auto client_line = [&](Child& c, const std::string& line) {
    c.last_line = line;
    if (line == "stage done") ++cycles;
    else if (line.rfind("stage ", 0) == 0 && line.substr(6) == c.kill_on_stage)
      c.kill_at = Clock::now() + c.kill_delay;
    else if (line.rfind("RESULT ", 0) == 0) ++outcomes[line.substr(7, line.find(' ', 7) - 7)];
    else if (line.rfind("ERROR ", 0) == 0) error(line.substr(6, line.find(':') - 6), line + " (fault " + (c.fault.empty() ? "none" : c.fault) + ")");
  };

  // Pumps output and reaps processes for up to `slice`.
  auto pump = [&](std::chrono::milliseconds slice) {
    std::vector<pollfd> fds{{server.out, POLLIN, 0}};
    for (auto& c : clients) fds.push_back({c.out, POLLIN, 0});
    ::poll(fds.data(), fds.size(), static_cast<int>(slice.count()));
    if (fds[0].revents) read_lines(server, server_line);
    for (std::size_t i = 0; i < clients.size(); ++i)
      if (fds[i + 1].revents) read_lines(clients[i], [&](const std::string& l) { client_line(clients[i], l); });
    int status = 0;
    if (!server_dead && ::waitpid(server.pid, &status, WNOHANG) == server.pid) {
      server_dead = true;
      error("server_died", fmt::format("the server exited (status {:#x})", status));
    }
    const auto now = Clock::now();
    for (auto it = clients.begin(); it != clients.end();) {
      Child& c = *it;
      if (!c.killed && now >= c.kill_at) {
        ::kill(c.pid, SIGKILL);
        c.killed = true;
        ++outcomes["killed"];
      }
      if (!c.killed && now - c.started > client_bound) {
        ::kill(c.pid, SIGKILL);
        c.killed = true;
        error("hang", fmt::format("client {} (fault {}) still running after {} s", c.pid, c.fault,
                                  std::chrono::duration_cast<std::chrono::seconds>(client_bound).count()));
      }
      if (::waitpid(c.pid, &status, WNOHANG) == c.pid) {
        while (read_lines(c, [&](const std::string& l) { client_line(c, l); })) {}
        const bool ok = (WIFEXITED(status) && WEXITSTATUS(status) == 0) ||
                        (c.killed && WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL) ||
                        (WIFEXITED(status) && WEXITSTATUS(status) == 1);  // its ERROR line counted
        if (!ok) error("client_exit", fmt::format("client {} (fault {}) ended with status {:#x}", c.pid, c.fault, status));
        const auto took = std::chrono::duration_cast<std::chrono::seconds>(now - c.started).count();
        if (took >= 20)  // within its bound, but worth seeing
          fmt::print("note: client {} (fault {}) took {} s; last line: {}\n", c.pid, c.fault.empty() ? "none" : c.fault,
                     took, c.last_line);
        ::close(c.out);
        it = clients.erase(it);
      } else {
        ++it;
      }
    }
  };

  const auto start = Clock::now();
  while (!listening && !server_dead && Clock::now() - start < 60s) pump(100ms);
  if (!listening) {
    if (!server_dead) error("server_start", "no 'listening on' line within 60 s");
    ::kill(server.pid, SIGKILL);
    return 1;
  }
  const reliability::Ledger baseline = reliability::ledger_of(server.pid);
  fmt::print("server pid {} baseline: {} rss {} kB\n", server.pid, baseline.to_string(), rss_kb(server.pid));
  std::fflush(stdout);

  std::ofstream csv(out_dir + "/samples.csv");
  csv << "seconds,cycles,faults,errors,rss_kb,fds,cm_id,qp,cq,mr,pd,clients\n";
  struct Sample { double t; long rss; reliability::Ledger ledger; long cycles; };
  std::vector<Sample> samples;
  auto total = [](const std::map<std::string, long>& m) { long n = 0; for (auto& [k, v] : m) n += v; return n; };
  auto kinds = [](const std::map<std::string, long>& m) {
    std::string s;
    for (auto& [k, v] : m) s += fmt::format("{}{}={}", s.empty() ? "" : " ", k, v);
    return s.empty() ? std::string("none") : s;
  };
  // Sampling runs `rdma` 7 times (about a second under TCG): on its own thread, so that the
  // clients keep running meanwhile. The main loop writes the rows.
  std::mutex sampled_mutex;
  std::vector<std::pair<double, std::pair<long, reliability::Ledger>>> sampled;  // t, rss, ledger
  std::string sampler_error;
  auto take_sample = [&] {
    const double t = std::chrono::duration<double>(Clock::now() - start).count();
    const long rss = rss_kb(server.pid);
    reliability::Ledger l;
    try { l = reliability::ledger_of(server.pid); } catch (const std::exception& e) {
      std::lock_guard lock(sampled_mutex);
      sampler_error = e.what();
      return;
    }
    std::lock_guard lock(sampled_mutex);
    sampled.push_back({t, {rss, l}});
  };
  auto write_samples = [&] {
    std::lock_guard lock(sampled_mutex);
    if (!sampler_error.empty()) error("ledger", std::exchange(sampler_error, ""));
    for (const auto& [t, v] : sampled) {
      const auto& [rss, l] = v;
      samples.push_back({t, rss, l, cycles});
      csv << fmt::format("{:.1f},{},{},{},{},{},{},{},{},{},{},{}\n", t, cycles, total(faults), total(errors), rss,
                         l.fds, l.count("cm_id"), l.count("qp"), l.count("cq"), l.count("mr"), l.count("pd"),
                         clients.size());
    }
    sampled.clear();
    csv.flush();
  };
  std::atomic<bool> sampling{true};
  std::thread sampler([&] {
    for (auto next = Clock::now(); sampling; next += sample_every) {
      take_sample();
      while (sampling && Clock::now() < next + sample_every) std::this_thread::sleep_for(50ms);
    }
  });

  const std::vector<std::string> fault_kinds{"kill_connect", "kill_transfer", "silent", "garbage",
                                             "abrupt", "fdlimit", "relisten", "burst"};
  auto spawn_client = [&](const std::string& mode, int n_cycles, const std::string& fault) -> Child& {
    Child c;
    c.fault = fault;
    c.pid = spawn({bin_dir + "soak_client", addr, port, mode, std::to_string(rng()), std::to_string(n_cycles)}, c.out);
    clients.push_back(std::move(c));
    return clients.back();
  };

  const auto end = start + std::chrono::seconds(seconds);
  auto next_progress = start + 60s;
  while (Clock::now() < end && !server_dead) {
    write_samples();
    if (Clock::now() >= next_progress && !samples.empty()) {
      next_progress += 60s;
      const auto& s = samples.back();
      fmt::print("[{:4.0f} s] cycles {} | faults {} | errors {} | server rss {} kB, {}\n", s.t, cycles,
                 kinds(faults), kinds(errors), s.rss, s.ledger.to_string());
      std::fflush(stdout);
    }
    if (relisten_pending > 0 && Clock::now() - relisten_since > 30s) {
      error("hang", "the server did not re-listen within 30 s");
      relisten_pending = 0;
    }
    if (static_cast<int>(clients.size()) < parallel) {
      // 60% normal clients, 40% a fault drawn uniformly.
      if (rng() % 10 < 6) {
        spawn_client("normal", 1 + static_cast<int>(rng() % 5), "");
      } else {
        const std::string f = fault_kinds[rng() % fault_kinds.size()];
        ++faults[f];
        if (f == "kill_connect") {
          Child& c = spawn_client("normal", 1, f);
          c.kill_on_stage = "connect";
          c.kill_delay = std::chrono::milliseconds(rng() % 300);
        } else if (f == "kill_transfer") {
          Child& c = spawn_client("slow", 1, f);
          c.kill_on_stage = "transfer";
          c.kill_delay = std::chrono::milliseconds(200 + rng() % 1500);
        } else if (f == "relisten") {
          if (relisten_pending == 0) relisten_since = Clock::now();
          ++relisten_pending;
          ::kill(server.pid, SIGUSR1);
        } else if (f == "burst") {
          for (int i = 0; i < burst_size; ++i) spawn_client("normal", 1, f);
        } else {
          spawn_client(f, 1, f);
        }
      }
    }
    pump(50ms);
  }

  // Drain: no new clients; all must end within their bound, then the server's ledger
  // must come back to its baseline.
  sampling = false;
  sampler.join();
  write_samples();
  if (!samples.empty())
    fmt::print("[{:4.0f} s] cycles {} | faults {} | errors {} | server rss {} kB, {}\n", samples.back().t, cycles,
               kinds(faults), kinds(errors), samples.back().rss, samples.back().ledger.to_string());
  fmt::print("draining {} client(s)\n", clients.size());
  std::fflush(stdout);
  const auto drain_start = Clock::now();
  while (!clients.empty() && Clock::now() - drain_start < client_bound + 10s) pump(100ms);
  if (!clients.empty()) error("hang", fmt::format("{} client(s) did not end", clients.size()));
  while (relisten_pending > 0 && !server_dead && Clock::now() - relisten_since < 30s) pump(100ms);
  reliability::Ledger final_ledger;
  if (!server_dead) {
    // Dropped connections (idle bound 10 s) and the CM's timeouts take a while.
    final_ledger = reliability::wait_for_ledger(baseline, 90s, [&] {
      pump(0ms);
      return reliability::ledger_of(server.pid);
    });
    take_sample();
    write_samples();
    if (!(final_ledger == baseline))
      error("leak", fmt::format("the server's ledger {} differs from its baseline {}: {}", final_ledger.to_string(),
                                baseline.to_string(), reliability::ledger_diff(baseline, final_ledger)));
  }

  // RSS: the mean of the last quarter of the samples against the first quarter's.
  long rss_first = 0, rss_last = 0;
  const long rss_bound = server_asan ? rss_bound_asan_kb : rss_bound_kb;
  if (samples.size() >= 4) {
    const std::size_t q = samples.size() / 4;
    for (std::size_t i = 0; i < q; ++i) rss_first += samples[i].rss, rss_last += samples[samples.size() - 1 - i].rss;
    rss_first /= static_cast<long>(q);
    rss_last /= static_cast<long>(q);
    if (rss_last - rss_first > rss_bound)
      error("rss_growth", fmt::format("server RSS grew from {} kB (first quarter) to {} kB (last quarter), bound {} kB",
                                      rss_first, rss_last, rss_bound));
  }

  if (!server_dead) {
    ::kill(server.pid, SIGTERM);
    const auto t = Clock::now();
    int status = 0;
    while (Clock::now() - t < 30s && ::waitpid(server.pid, &status, WNOHANG) != server.pid) {
      while (read_lines(server, server_line)) {}
      std::this_thread::sleep_for(50ms);
    }
    if (Clock::now() - t >= 30s) {
      ::kill(server.pid, SIGKILL);
      error("hang", "the server did not exit within 30 s of SIGTERM");
    } else {
      while (read_lines(server, server_line)) {}
      if (!(WIFEXITED(status) && WEXITSTATUS(status) == 0))
        error("server_exit", fmt::format("the server ended with status {:#x}", status));
    }
  }

  // The table.
  std::string table;
  auto row = [&](const std::string& k, const std::string& v) { table += fmt::format("  {:<22} {}\n", k, v); };
  table += fmt::format("soak summary: {} s, seed {}: {}\n", seconds, seed, failed ? "FAILED" : "passed");
  row("cycles", std::to_string(cycles));
  row("faults", fmt::format("{} ({})", total(faults), kinds(faults)));
  row("client outcomes", kinds(outcomes));
  row("errors", fmt::format("{} ({})", total(errors), kinds(errors)));
  row("server baseline", baseline.to_string());
  row("server at the end", final_ledger.to_string());
  row("server RSS", fmt::format("first quarter {} kB, last quarter {} kB (bound +{} kB)", rss_first, rss_last, rss_bound));
  table += "  over time (every ~60 s):\n    seconds  cycles  rss_kB  fds cm_id  qp  cq  mr\n";
  double next_t = 0;
  for (const auto& s : samples) {
    if (s.t + 0.01 < next_t && &s != &samples.back()) continue;
    next_t = s.t + 60;
    table += fmt::format("    {:7.0f} {:7} {:7} {:4} {:5} {:3} {:3} {:3}\n", s.t, s.cycles, s.rss, s.ledger.fds,
                         s.ledger.count("cm_id"), s.ledger.count("qp"), s.ledger.count("cq"), s.ledger.count("mr"));
  }
  fmt::print("{}", table);
  std::ofstream(out_dir + "/summary.txt") << table;
  return failed ? 1 : 0;
}
