// Fault scenarios between two kernels (tools/rpmapp-multiguest): the server role runs in
// guest 1, the client role in guest 2, and they coordinate through files in the shared
// current directory (9p: a file one guest writes shows up in the other within ~0.5 s).
//
//   multiguest_scenarios SCENARIO ROLE      SCENARIO a|b|c|d, ROLE server|client
//
// Prints "PASS <scenario> <role>: ..." or "FAIL <scenario> <role>: ..." (exit 0 / 1) and
// "MEASURE scenario=<s> role=<r> <key>=<value>" lines. Every wait is bounded; a failing
// side writes <scenario>.abort so that the other stops waiting. See
// docs/reliability.md for what each scenario expects.
#include "ledger.hpp"

#include <rpmapp/rpmapp.hpp>

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

namespace {

std::string g_scenario = "?";
std::string g_role = "?";

// A failed expectation: caught in main, printed as FAIL.
struct Failure : std::runtime_error {
  using std::runtime_error::runtime_error;
};

[[noreturn]] void fail(const std::string& what) { throw Failure(what); }

void say(const std::string& line) {
  std::printf("%s %s: %s\n", g_scenario.c_str(), g_role.c_str(), line.c_str());
  std::fflush(stdout);
}
void measure(const std::string& key, double seconds) {
  std::printf("MEASURE scenario=%s role=%s %s=%.2f\n", g_scenario.c_str(), g_role.c_str(),
              key.c_str(), seconds);
  std::fflush(stdout);
}
double since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

template <class T> T must(rpmapp::expected<T> result, const char* what) {
  if (!result) fail(std::string(what) + ": " + result.error().message());
  return std::move(*result);
}
inline void must(rpmapp::expected<void> result, const char* what) {
  if (!result) fail(std::string(what) + ": " + result.error().message());
}
#define MUST(expr) must((expr), #expr)

// ---------------------------------------------------------------- coordination files
std::string file_name(const std::string& what) { return g_scenario + "." + what; }

void put(const std::string& what, const std::string& text = "") {
  const std::string name = file_name(what), tmp = name + ".tmp";
  {
    std::ofstream out(tmp);
    out << text << '\n';
    if (!out) fail("cannot write " + tmp);
  }
  if (std::rename(tmp.c_str(), name.c_str()) != 0) fail("cannot rename " + tmp);
}
bool exists(const std::string& name) { return ::access(name.c_str(), F_OK) == 0; }

// The first line of <scenario>.<what> once it exists; fails after `timeout`, or at once when
// the other side wrote <scenario>.abort.
std::string wait_for(const std::string& what, std::chrono::seconds timeout) {
  const std::string name = file_name(what);
  const auto deadline = Clock::now() + timeout;
  for (;;) {
    if (exists(name)) {
      std::ifstream in(name);
      std::string line;
      std::getline(in, line);
      return line;
    }
    if (exists(file_name("abort"))) fail("the other side aborted while waiting for " + name);
    if (Clock::now() > deadline)
      fail("no " + name + " within " + std::to_string(timeout.count()) + " s");
    std::this_thread::sleep_for(100ms);
  }
}

// Asks the host to cut (off) or restore (on) this guest's link, and waits until the host
// took the request (it deletes the file after set_link).
void set_my_link(const char* state) {
  const char* ctl = std::getenv("MG_CTL");
  const char* index = std::getenv("MG_INDEX");
  if (ctl == nullptr || index == nullptr) fail("MG_CTL/MG_INDEX unset: run under rpmapp-multiguest");
  const std::string name = std::string(ctl) + "/g" + index + ".link";
  {
    std::ofstream out(name);
    out << state << '\n';
  }
  const auto deadline = Clock::now() + 10s;
  while (exists(name)) {
    if (Clock::now() > deadline) fail(std::string("the host did not apply set_link ") + state);
    std::this_thread::sleep_for(50ms);
  }
  say(std::string("link ") + state);
}

std::string env(const char* name) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') fail(std::string(name) + " is not set (run in rpmapp-multiguest)");
  return v;
}
std::string server_ip() {
  std::istringstream ips(env("MG_IPS"));
  std::string first;
  ips >> first;
  return first;
}

// ---------------------------------------------------------------- ledger
void open_ledger() { reliability::open_librdmacm_devices(); }

void expect_ledger_back(const reliability::Ledger& baseline, const char* who,
                        std::chrono::milliseconds timeout = 15s) {
  const auto after = reliability::wait_for_ledger(baseline, timeout);
  if (!(after == baseline))
    fail(std::string(who) + ": the ledger did not return to its baseline: " +
         reliability::ledger_diff(baseline, after) + " (baseline " + baseline.to_string() + ")");
}
void expect_all_back(const reliability::Ledger& baseline, const char* who) {
  const auto after = reliability::wait_for_ledger(baseline, 15s,
                                                  [] { return reliability::ledger_of_all_processes(); });
  if (!(after == baseline))
    fail(std::string(who) + ": the guest's RDMA objects did not return to what they were: " +
         reliability::ledger_diff(baseline, after));
}

// ---------------------------------------------------------------- data path helpers
struct Buffers {
  static constexpr std::size_t slot = 64;
  std::vector<std::byte> memory = std::vector<std::byte>(slot * 4);
  rpmapp::MrLocal mr;
  explicit Buffers(const rpmapp::Peer& peer)
      : mr(MUST(rpmapp::MrLocal::reg(peer, memory.data(), memory.size(),
                                     rpmapp::MrUsage::send | rpmapp::MrUsage::recv))) {}
  // slot 0: send, slot 1: recv
  void set_message(const std::string& text) {
    std::memset(memory.data(), 0, slot);
    std::memcpy(memory.data(), text.data(), std::min(text.size(), slot - 1));
  }
  std::string received() const {
    return std::string(reinterpret_cast<const char*>(memory.data() + slot));
  }
};

// The next completion of `conn`'s CQ within `timeout`, or nothing.
std::optional<ibv_wc> next_completion(rpmapp::Conn& conn, std::chrono::milliseconds timeout) {
  rpmapp::Cq cq = MUST(conn.cq());
  const auto deadline = Clock::now() + timeout;
  for (;;) {
    std::array<ibv_wc, 1> wc{};
    auto got = cq.get(wc);
    if (got) return wc[0];
    if (got.error().code() != rpmapp::errc::no_completion) fail("Cq::get: " + got.error().message());
    if (Clock::now() > deadline) return std::nullopt;
    std::this_thread::sleep_for(2ms);
  }
}

// Waits for the completion with context `ctx` (others are returned in `others`).
ibv_wc completion_of(rpmapp::Conn& conn, std::uint64_t ctx, std::chrono::milliseconds timeout,
                     const char* what) {
  const auto deadline = Clock::now() + timeout;
  for (;;) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
    auto wc = next_completion(conn, left.count() > 0 ? left : 0ms);
    if (!wc) fail(std::string("no completion of the ") + what + " within " +
                  std::to_string(timeout.count()) + " ms (it hangs)");
    if (wc->wr_id == ctx) return *wc;
    if (wc->status != IBV_WC_SUCCESS)
      fail(std::string("unexpected failed completion (wr_id ") + std::to_string(wc->wr_id) +
           ") while waiting for the " + what + ": " + ibv_wc_status_str(wc->status));
  }
}

std::string wc_text(const ibv_wc& wc) {
  auto checked = rpmapp::check(wc);
  return std::string(ibv_wc_status_str(wc.status)) + " (" + std::to_string(wc.status) + ")" +
         (checked ? std::string() : "; Error: " + checked.error().message());
}

// One message each way, content checked: the client sends `text`, the server echoes it.
void client_round_trip(rpmapp::Conn& conn, Buffers& buf, const std::string& text,
                       std::chrono::milliseconds timeout) {
  MUST(conn.recv(buf.mr, Buffers::slot, Buffers::slot, 11));
  buf.set_message(text);
  MUST(conn.send(buf.mr, 0, Buffers::slot, rpmapp::Completion::always, 12));
  auto sent = completion_of(conn, 12, timeout, "send");
  if (sent.status != IBV_WC_SUCCESS) fail("send of '" + text + "': " + wc_text(sent));
  auto got = completion_of(conn, 11, timeout, "recv");
  if (got.status != IBV_WC_SUCCESS) fail("recv of the echo of '" + text + "': " + wc_text(got));
  if (buf.received() != "echo " + text)
    fail("echo of '" + text + "' came back as '" + buf.received() + "'");
}
// Serves round trips until the message "bye"; returns how many it echoed.
int server_echo(rpmapp::Conn& conn, Buffers& buf, std::chrono::milliseconds timeout,
                int* unreachable) {
  for (int n = 0;; ++n) {
    MUST(conn.recv(buf.mr, Buffers::slot, Buffers::slot, 21));
    const auto deadline = Clock::now() + timeout;
    std::optional<ibv_wc> wc;
    while (!(wc = next_completion(conn, 100ms))) {
      if (auto event = conn.try_next_event()) {
        if (*event == rpmapp::ConnEvent::unreachable && unreachable) {
          ++*unreachable;
          say("transient unreachable event (tolerated)");
          continue;
        }
        fail(std::string("event while serving: ") + std::string(rpmapp::to_string(*event)));
      }
      if (Clock::now() > deadline) fail("no message within the bound (it hangs)");
    }
    if (wc->status != IBV_WC_SUCCESS) fail("recv: " + wc_text(*wc));
    const std::string text = buf.received();
    if (text == "bye") return n;
    buf.set_message("echo " + text);
    MUST(conn.send(buf.mr, 0, Buffers::slot, rpmapp::Completion::always, 22));
    auto sent = completion_of(conn, 22, timeout, "echo send");
    if (sent.status != IBV_WC_SUCCESS) fail("echo send: " + wc_text(sent));
  }
}
void client_bye(rpmapp::Conn& conn, Buffers& buf) {
  buf.set_message("bye");
  MUST(conn.send(buf.mr, 0, Buffers::slot, rpmapp::Completion::always, 13));
  auto sent = completion_of(conn, 13, 30s, "bye send");
  if (sent.status != IBV_WC_SUCCESS) fail("bye send: " + wc_text(sent));
}

rpmapp::ConnEvent event_within(rpmapp::Conn& conn, std::chrono::milliseconds timeout,
                               const char* who) {
  auto event = conn.next_event_for(timeout);
  if (!event) fail(std::string(who) + ": Conn::next_event_for: " + event.error().message());
  return *event;
}

// Orderly end of a connection from either side, bounded: disconnect, then wait for closed.
void close_conn(rpmapp::Conn& conn, const char* who) {
  MUST(conn.disconnect());
  for (;;) {
    auto ev = event_within(conn, 30s, who);
    if (ev == rpmapp::ConnEvent::closed) return;
    if (ev != rpmapp::ConnEvent::unreachable)
      fail(std::string(who) + ": waiting for closed, got " + std::string(rpmapp::to_string(ev)));
  }
}

rpmapp::Conn connect_to_server(const rpmapp::Peer& peer, const std::string& port) {
  auto conn = MUST(MUST(rpmapp::ConnReq::to(peer, server_ip(), port)).connect());
  const auto ev = event_within(conn, 30s, "client");
  if (ev != rpmapp::ConnEvent::established)
    fail("connect: " + std::string(rpmapp::to_string(ev)) + " instead of established");
  return conn;
}
rpmapp::Conn accept_one(rpmapp::Endpoint& ep) {
  auto req = MUST(ep.next_conn_req_for(30s));
  auto conn = MUST(std::move(req).connect());
  const auto ev = event_within(conn, 30s, "server");
  if (ev != rpmapp::ConnEvent::established)
    fail("accept: " + std::string(rpmapp::to_string(ev)) + " instead of established");
  return conn;
}

// Starts this program as `multiguest_scenarios SCENARIO ROLE` in a child process.
pid_t spawn_self(const char* self, const std::string& role) {
  std::fflush(stdout);
  const pid_t pid = ::fork();
  if (pid < 0) fail(std::string("fork: ") + std::strerror(errno));
  if (pid == 0) {
    ::execl(self, self, g_scenario.c_str(), role.c_str(), static_cast<char*>(nullptr));
    std::_Exit(127);
  }
  return pid;
}
void kill_and_reap(pid_t pid) {
  ::kill(pid, SIGKILL);
  int status = 0;
  ::waitpid(pid, &status, 0);
  if (!WIFSIGNALED(status) || WTERMSIG(status) != SIGKILL)
    fail("the child " + std::to_string(pid) + " ended before it was killed (status " +
         std::to_string(status) + ")");
}

// ================================================================ a: server killed
// The server (a child of the server role, so that it can be SIGKILLed) accepts 8
// connections and posts nothing; each client connection has a recv posted and a send in
// flight (RNR-retried: the server posts no recv). After the kill every client connection
// must see closed or lost, and, once disconnected, both operations complete with an error.
constexpr int a_conns = 8;

int a_server_victim() {
  const std::string ip = env("SOFTROCE_IP");
  auto peer = MUST(rpmapp::Peer::from_address(ip, rpmapp::AddressKind::local));
  auto ep = MUST(rpmapp::Endpoint::listen(peer, ip, "0"));
  put("port", std::to_string(MUST(ep.port())));
  std::vector<rpmapp::Conn> conns;
  for (int i = 0; i < a_conns; ++i) conns.push_back(accept_one(ep));
  put("accepted");
  std::this_thread::sleep_for(120s);  // killed long before
  return 2;
}

void a_server(const char* self) {
  open_ledger();
  const auto guest_before = reliability::ledger_of_all_processes();
  const pid_t victim = spawn_self(self, "victim");
  wait_for("clients-ready", 90s);
  const auto kill_time = Clock::now();
  kill_and_reap(victim);
  put("killed");
  say("server process " + std::to_string(victim) + " SIGKILLed with " + std::to_string(a_conns) +
      " connections");
  expect_all_back(guest_before, "killed server");
  measure("guest_ledger_back_s", since(kill_time));
}

void a_client() {
  open_ledger();
  const auto baseline = reliability::ledger_of();
  const std::string port = wait_for("port", 60s);
  {
    const std::string ip = env("SOFTROCE_IP");
    auto peer = MUST(rpmapp::Peer::from_address(ip, rpmapp::AddressKind::local));
    std::vector<rpmapp::Conn> conns;
    std::vector<std::unique_ptr<Buffers>> bufs;
    for (int i = 0; i < a_conns; ++i) {
      conns.push_back(connect_to_server(peer, port));
      bufs.push_back(std::make_unique<Buffers>(peer));
    }
    wait_for("accepted", 30s);
    for (int i = 0; i < a_conns; ++i) {
      MUST(conns[i].recv(bufs[i]->mr, Buffers::slot, Buffers::slot, 1));
      bufs[i]->set_message("in flight");
      MUST(conns[i].send(bufs[i]->mr, 0, Buffers::slot, rpmapp::Completion::always, 2));
    }
    put("clients-ready");
    // The server is killed as soon as its guest sees clients-ready (9p: within ~0.5 s), so
    // the time from here to each event bounds the detection time from above.
    const auto ready = Clock::now();
    std::map<std::string, int> events, statuses;
    std::vector<double> event_at(a_conns, -1);
    double worst_event = 0, worst_ops = 0;
    for (int seen = 0; seen < a_conns;) {
      if (since(ready) > 60) fail(std::to_string(a_conns - seen) + " connections saw no event within 60 s");
      for (int i = 0; i < a_conns; ++i) {
        if (event_at[i] >= 0) continue;
        auto ev = conns[i].try_next_event();
        if (!ev) {
          if (ev.error().code() != rpmapp::errc::no_event)
            fail("Conn::try_next_event: " + ev.error().message());
          continue;
        }
        event_at[i] = since(ready);
        worst_event = std::max(worst_event, event_at[i]);
        ++seen;
        ++events[std::string(rpmapp::to_string(*ev))];
        if (*ev != rpmapp::ConnEvent::closed && *ev != rpmapp::ConnEvent::lost)
          fail("connection " + std::to_string(i) + ": " + std::string(rpmapp::to_string(*ev)) +
               " instead of closed or lost");
      }
      std::this_thread::sleep_for(5ms);
    }
    wait_for("killed", 30s);
    // before the application reacts, has anything completed on its own?
    int early = 0;
    for (int i = 0; i < a_conns; ++i) {
      if (auto wc = next_completion(conns[i], 0ms)) {
        ++early;
        if (wc->status == IBV_WC_SUCCESS) fail("an operation succeeded after the server died");
        ++statuses[std::string(wc->wr_id == 1 ? "recv:" : "send:") + ibv_wc_status_str(wc->status)];
        say("before disconnect: wr_id " + std::to_string(wc->wr_id) + " completed with " + wc_text(*wc));
      }
    }
    measure("completions_before_disconnect", early);
    measure("all_closed_or_lost_s", worst_event);
    if (early > 0) fail("completions before disconnect: not expected (see the lines above)");
    const auto disconnected = Clock::now();
    for (int i = 0; i < a_conns; ++i) {
      MUST(conns[i].disconnect());  // the application's answer: the queue pair goes to error
      for (std::uint64_t ctx : {1u, 2u}) {
        if (early > 0) break;  // then this loop's pairing of contexts is not exact; fail below
        auto wc = completion_of(conns[i], ctx, 30s, ctx == 1 ? "posted recv" : "send in flight");
        if (wc.status == IBV_WC_SUCCESS)
          fail("connection " + std::to_string(i) + ": the " + (ctx == 1 ? "recv" : "send") +
               " succeeded after the server died");
        if (rpmapp::check(wc)) fail("rpmapp::check accepted a failed completion");
        ++statuses[std::string(ctx == 1 ? "recv:" : "send:") + ibv_wc_status_str(wc.status)];
        if (i == 0) say(std::string(ctx == 1 ? "recv" : "send") + " completed with " + wc_text(wc));
      }
      worst_ops = std::max(worst_ops, since(disconnected));
    }
    measure("ops_failed_after_disconnect_s", worst_ops);
    std::string seen;
    for (const auto& [k, v] : events) seen += k + "=" + std::to_string(v) + " ";
    for (const auto& [k, v] : statuses) seen += k + "=" + std::to_string(v) + " ";
    say("seen: " + seen);
  }
  expect_ledger_back(baseline, "client");
}

// ================================================================ b: client killed early
// Round 1: the client (a child, SIGKILLed) sends its request; the server takes it and,
// once the client is dead, accepts: the accept fails, or the request ends
// rejected/closed/lost/unreachable. Round 2: the client is killed while its request waits
// in the server's queue, not yet taken: taking it then either finds nothing or a request
// that ends as in round 1.
void accept_dead_request(rpmapp::ConnReq req, const char* round) {
  const auto t0 = Clock::now();
  auto conn = std::move(req).connect();
  if (!conn) {
    say(std::string(round) + ": accept after the client's death failed cleanly: " +
        conn.error().message());
  } else {
    const auto ev = event_within(*conn, 30s, "server");
    if (ev == rpmapp::ConnEvent::established)
      fail(std::string(round) + ": established with a dead client");
    say(std::string(round) + ": the accepted request ended with " +
        std::string(rpmapp::to_string(ev)));
  }
  measure(std::string(round) + "_request_ended_s", since(t0));
}

void b_server() {
  open_ledger();
  const auto baseline = reliability::ledger_of();
  {
    const std::string ip = env("SOFTROCE_IP");
    auto peer = MUST(rpmapp::Peer::from_address(ip, rpmapp::AddressKind::local));
    auto ep = MUST(rpmapp::Endpoint::listen(peer, ip, "0"));
    put("port", std::to_string(MUST(ep.port())));
    auto req = MUST(ep.next_conn_req_for(60s));
    put("request-seen");
    wait_for("client-killed", 30s);
    accept_dead_request(std::move(req), "round1");

    put("round2");
    wait_for("client2-killed", 60s);
    std::this_thread::sleep_for(1s);  // the dead client's kernel rejects within ~0.1 s
    auto queued = ep.next_conn_req_for(10s);
    if (queued) {
      accept_dead_request(std::move(*queued), "round2");
    } else if (queued.error().code() == rpmapp::errc::no_event) {
      say("round2: the dead client's queued request never reached the application");
    } else {
      // documented: a request whose client gave up fails (rdma_create_qp, EINVAL), rejected
      say("round2: taking the dead client's request failed cleanly: " + queued.error().message());
    }

    // Round 3: the same endpoint still serves a live client.
    put("round3");
    auto live = accept_one(ep);
    Buffers buf(peer);
    const int echoed = server_echo(live, buf, 30s, nullptr);
    if (echoed != 1) fail("round3: echoed " + std::to_string(echoed) + " messages, expected 1");
    const auto ev = event_within(live, 30s, "server");
    if (ev != rpmapp::ConnEvent::closed) fail("round3: " + std::string(rpmapp::to_string(ev)));
    MUST(live.disconnect());
    say("round3: a live client connected and exchanged data on the same endpoint");
  }
  expect_ledger_back(baseline, "server");
}

int b_client_victim(const std::string& round) {
  const std::string ip = env("SOFTROCE_IP");
  auto peer = MUST(rpmapp::Peer::from_address(ip, rpmapp::AddressKind::local));
  auto conn = MUST(MUST(rpmapp::ConnReq::to(peer, server_ip(), wait_for("port", 60s))).connect());
  put("requested" + round);
  std::this_thread::sleep_for(120s);  // killed long before
  return 2;
}

void b_client(const char* self) {
  open_ledger();
  const auto guest_before = reliability::ledger_of_all_processes();
  const pid_t victim = spawn_self(self, "victim");
  wait_for("request-seen", 90s);
  kill_and_reap(victim);
  put("client-killed");
  say("round1: client process SIGKILLed after its request reached the server");
  expect_all_back(guest_before, "killed client (round 1)");

  wait_for("round2", 60s);
  const pid_t victim2 = spawn_self(self, "victim2");
  wait_for("requested2", 60s);
  kill_and_reap(victim2);
  put("client2-killed");
  say("round2: client process SIGKILLed right after sending its request");
  expect_all_back(guest_before, "killed client (round 2)");

  wait_for("round3", 60s);
  {
    const std::string ip = env("SOFTROCE_IP");
    auto peer = MUST(rpmapp::Peer::from_address(ip, rpmapp::AddressKind::local));
    auto conn = connect_to_server(peer, wait_for("port", 10s));
    Buffers buf(peer);
    client_round_trip(conn, buf, "after two dead clients", 10s);
    client_bye(conn, buf);
    close_conn(conn, "client");
  }
  expect_all_back(guest_before, "live client (round 3)");
}

// ================================================================ c: 5 s link cut
// An established connection; the client's guest link is cut for 5 s with a send in flight,
// then restored: the send completes, and data flows again with its content checked.
void c_server() {
  open_ledger();
  const auto baseline = reliability::ledger_of();
  int unreachable = 0;
  {
    const std::string ip = env("SOFTROCE_IP");
    auto peer = MUST(rpmapp::Peer::from_address(ip, rpmapp::AddressKind::local));
    auto ep = MUST(rpmapp::Endpoint::listen(peer, ip, "0"));
    put("port", std::to_string(MUST(ep.port())));
    auto conn = accept_one(ep);
    Buffers buf(peer);
    const int echoed = server_echo(conn, buf, 60s, &unreachable);
    if (echoed != 6) fail("echoed " + std::to_string(echoed) + " messages, expected 6");
    auto ev = event_within(conn, 30s, "server");
    while (ev == rpmapp::ConnEvent::unreachable) {
      ++unreachable;
      ev = event_within(conn, 30s, "server");
    }
    if (ev != rpmapp::ConnEvent::closed) fail("at the end: " + std::string(rpmapp::to_string(ev)));
    MUST(conn.disconnect());
  }
  say("unreachable events: " + std::to_string(unreachable));
  measure("unreachable_events", unreachable);
  expect_ledger_back(baseline, "server");
}

void c_client() {
  open_ledger();
  const auto baseline = reliability::ledger_of();
  int unreachable = 0;
  {
    const std::string ip = env("SOFTROCE_IP");
    auto peer = MUST(rpmapp::Peer::from_address(ip, rpmapp::AddressKind::local));
    auto conn = connect_to_server(peer, wait_for("port", 60s));
    Buffers buf(peer);
    for (int i = 0; i < 3; ++i) client_round_trip(conn, buf, "before " + std::to_string(i), 10s);
    set_my_link("off");
    const auto cut = Clock::now();
    // a round trip started while the link is down: it completes after the restore
    std::thread restore([&] {
      std::this_thread::sleep_for(5s);
      set_my_link("on");
    });
    std::string failure;
    try {
      client_round_trip(conn, buf, "across the cut", 30s);
    } catch (const Failure& f) {
      failure = f.what();
    }
    restore.join();
    if (!failure.empty()) fail(failure);
    measure("first_round_trip_after_cut_s", since(cut));
    for (int i = 0; i < 2; ++i) client_round_trip(conn, buf, "after " + std::to_string(i), 10s);
    while (auto ev = conn.try_next_event()) {
      if (*ev != rpmapp::ConnEvent::unreachable)
        fail("event during the cut: " + std::string(rpmapp::to_string(*ev)));
      ++unreachable;
    }
    client_bye(conn, buf);
    close_conn(conn, "client");
  }
  say("connection survived a 5 s cut; unreachable events: " + std::to_string(unreachable));
  measure("unreachable_events", unreachable);
  expect_ledger_back(baseline, "client");
}

// ================================================================ d: link cut for good
// Both sides have a recv posted, then the client's guest link is cut and each side posts a
// send: each send fails with IBV_WC_RETRY_EXC_ERR (retry_count 6, ~15 s on rxe).
void d_side(bool server) {
  open_ledger();
  const auto baseline = reliability::ledger_of();
  const char* who = server ? "server" : "client";
  {
    const std::string ip = env("SOFTROCE_IP");
    auto peer = MUST(rpmapp::Peer::from_address(ip, rpmapp::AddressKind::local));
    std::optional<rpmapp::Endpoint> ep;
    std::optional<rpmapp::Conn> conn_holder;
    if (server) {
      ep.emplace(MUST(rpmapp::Endpoint::listen(peer, ip, "0")));
      put("port", std::to_string(MUST(ep->port())));
      conn_holder.emplace(accept_one(*ep));
    } else {
      conn_holder.emplace(connect_to_server(peer, wait_for("port", 60s)));
    }
    rpmapp::Conn& conn = *conn_holder;
    Buffers buf(peer);
    MUST(conn.recv(buf.mr, Buffers::slot, Buffers::slot, 31));
    put(std::string(who) + "-recv-posted");
    wait_for(server ? "client-recv-posted" : "server-recv-posted", 30s);
    if (!server) {
      set_my_link("off");
      put("cut");
    } else {
      wait_for("cut", 30s);
    }
    buf.set_message(std::string("lost from the ") + who);
    const auto posted = Clock::now();
    MUST(conn.send(buf.mr, 0, Buffers::slot, rpmapp::Completion::always, 32));
    // Watch the completion queue and the connection's events together, so that each event
    // is timed when it comes; after the failed send, 10 s more for an event to follow.
    std::optional<ibv_wc> wc;
    double detect = 0;
    std::string events;
    while (Clock::now() < posted + 40s && (!wc || since(posted) < detect + 10)) {
      if (!wc) {
        if ((wc = next_completion(conn, 0ms))) {
          detect = since(posted);
          if (wc->wr_id != 32) fail("completion of wr_id " + std::to_string(wc->wr_id) + ": " + wc_text(*wc));
        }
      }
      auto ev = conn.try_next_event();
      if (ev) {
        const std::string name(rpmapp::to_string(*ev));
        events += name + "@" + std::to_string(since(posted)).substr(0, 5) + "s ";
        say("event " + name + " " + std::to_string(since(posted)) + " s after the send was posted");
        if (*ev == rpmapp::ConnEvent::unreachable) measure("unreachable_after_send_s", since(posted));
        if (*ev == rpmapp::ConnEvent::lost || *ev == rpmapp::ConnEvent::closed)
          measure(name + "_after_send_s", since(posted));
      } else if (ev.error().code() != rpmapp::errc::no_event) {
        fail("Conn::try_next_event: " + ev.error().message());
      }
      std::this_thread::sleep_for(5ms);
    }
    if (!wc) fail("the send across the dead link did not complete within 40 s (it hangs)");
    if (wc->status != IBV_WC_RETRY_EXC_ERR)
      fail("the send completed with " + wc_text(*wc) + ", expected transport retry counter exceeded");
    auto checked = rpmapp::check(*wc);
    if (checked) fail("rpmapp::check accepted a retry-exceeded completion");
    say("send failed after " + std::to_string(detect) + " s: " + checked.error().message());
    measure("retry_exc_s", detect);
    say("connection events up to 10 s after the failed send: " + (events.empty() ? "none" : events));
    MUST(conn.disconnect());
    auto recv_wc = completion_of(conn, 31, 10s, "posted recv");
    if (recv_wc.status == IBV_WC_SUCCESS) fail("the posted recv succeeded across a dead link");
    say("the posted recv completed with " + wc_text(recv_wc));
    put(std::string(who) + "-done");
    wait_for(server ? "client-done" : "server-done", 60s);
  }
  expect_ledger_back(baseline, who, 30s);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: %s a|b|c|d server|client\n", argv[0]);
    return 2;
  }
  g_scenario = argv[1];
  g_role = argv[2];
  const auto t0 = Clock::now();
  try {
    if (g_role == "victim") return g_scenario == "a" ? a_server_victim() : b_client_victim("");
    if (g_role == "victim2") return b_client_victim("2");
    const bool server = g_role == "server";
    if (!server && g_role != "client") fail("unknown role " + g_role);
    if (g_scenario == "a") server ? a_server(argv[0]) : a_client();
    else if (g_scenario == "b") server ? b_server() : b_client(argv[0]);
    else if (g_scenario == "c") server ? c_server() : c_client();
    else if (g_scenario == "d") d_side(server);
    else fail("unknown scenario " + g_scenario);
  } catch (const std::exception& e) {
    if (g_role.rfind("victim", 0) != 0) {
      try {
        put("abort", e.what());
      } catch (...) {
      }
    }
    std::printf("FAIL %s %s: %s\n", g_scenario.c_str(), g_role.c_str(), e.what());
    return 1;
  }
  std::printf("PASS %s %s (%.1f s)\n", g_scenario.c_str(), g_role.c_str(), since(t0));
  return 0;
}
