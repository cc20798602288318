// The kernel resource ledger of a process: its open fds (/proc/PID/fd) and the RDMA
// objects the kernel holds for it (cm_ids, QPs, CQs, MRs, PDs, device contexts, SRQs),
// as `rdma resource show KIND` (iproute2) lists them. A fault scenario records it before
// and after and fails on any difference. Only meaningful on a machine with RDMA devices
// (the VM); on the host every RDMA count is 0.
#pragma once

#include <rdma/rdma_cma.h>
#include <sys/types.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <dirent.h>
#include <stdexcept>
#include <string>
#include <string_view>
#include <system_error>
#include <thread>

namespace reliability {

// The RDMA object kinds `rdma resource show` knows, in ledger order.
inline constexpr std::array<std::string_view, 7> rdma_kinds{"cm_id", "qp",  "cq", "mr",
                                                            "pd",    "ctx", "srq"};

struct Ledger {
  long fds = 0;
  std::array<long, rdma_kinds.size()> rdma{};  // indexed like rdma_kinds

  friend bool operator==(const Ledger&, const Ledger&) = default;

  // "fds 7 cm_id 1 qp 0 cq 0 mr 0 pd 0 ctx 0 srq 0"
  std::string to_string() const {
    std::string text = "fds " + std::to_string(fds);
    for (std::size_t i = 0; i < rdma_kinds.size(); ++i)
      text += " " + std::string(rdma_kinds[i]) + " " + std::to_string(rdma[i]);
    return text;
  }
  long count(std::string_view kind) const {
    if (kind == "fds") return fds;
    for (std::size_t i = 0; i < rdma_kinds.size(); ++i)
      if (rdma_kinds[i] == kind) return rdma[i];
    throw std::invalid_argument("no ledger kind " + std::string(kind));
  }
};

// "cm_id +1 fds +3" (only what differs), or "" when equal.
inline std::string ledger_diff(const Ledger& before, const Ledger& after) {
  std::string text;
  auto add = [&](std::string_view kind, long b, long a) {
    if (a == b) return;
    if (!text.empty()) text += ' ';
    text += std::string(kind) + (a > b ? " +" : " ") + std::to_string(a - b);
  };
  add("fds", before.fds, after.fds);
  for (std::size_t i = 0; i < rdma_kinds.size(); ++i)
    add(rdma_kinds[i], before.rdma[i], after.rdma[i]);
  return text;
}

namespace detail {

// Open fds of `pid`, not counting the one used to read the directory.
inline long count_fds(pid_t pid) {
  const std::string path = "/proc/" + std::to_string(pid) + "/fd";
  DIR* dir = ::opendir(path.c_str());
  if (dir == nullptr) throw std::system_error(errno, std::generic_category(), "opendir " + path);
  long n = 0;
  while (const dirent* entry = ::readdir(dir))
    if (entry->d_name[0] != '.') ++n;
  const bool self = pid == ::getpid();
  ::closedir(dir);
  return self ? n - 1 : n;
}

// Lines of `rdma resource show KIND` that belong to `pid` ("... pid N comm ...");
// kernel-owned objects carry no pid. pid 0 counts every line that has a pid.
inline long count_rdma(std::string_view kind, pid_t pid) {
  const std::string command = "rdma resource show " + std::string(kind) + " 2>/dev/null";
  FILE* pipe = ::popen(command.c_str(), "r");  // pipe fds are closed before fds are counted
  if (pipe == nullptr) throw std::system_error(errno, std::generic_category(), "popen rdma");
  const std::string want = " pid " + std::to_string(pid) + " ";
  std::string line;
  long n = 0;
  for (int c; (c = std::fgetc(pipe)) != EOF;) {
    if (c != '\n') {
      line += static_cast<char>(c);
      continue;
    }
    line += ' ';
    if (pid == 0 ? line.find(" pid ") != std::string::npos : line.find(want) != std::string::npos) ++n;
    line.clear();
  }
  const int status = ::pclose(pipe);
  if (status != 0)
    throw std::runtime_error("`" + command + "` failed (status " + std::to_string(status) +
                             "): is iproute2's rdma tool installed?");
  return n;
}

}  // namespace detail

// librdmacm opens a context (and its fds) on every RDMA device at its first use and keeps
// them until the process exits; a baseline taken before that would see them as a leak.
// Call this once before the first ledger_of() of a scenario.
inline void open_librdmacm_devices() {
  int n = 0;
  if (ibv_context** devices = ::rdma_get_devices(&n)) ::rdma_free_devices(devices);
}

// The ledger of `pid` (default: this process). Throws when `rdma` cannot run.
inline Ledger ledger_of(pid_t pid = ::getpid()) {
  Ledger ledger;
  for (std::size_t i = 0; i < rdma_kinds.size(); ++i)
    ledger.rdma[i] = detail::count_rdma(rdma_kinds[i], pid);
  ledger.fds = detail::count_fds(pid);
  return ledger;
}

// RDMA objects of every process on the machine (fds stay 0): after a process died, what
// it held must be gone from here.
inline Ledger ledger_of_all_processes() {
  Ledger ledger;
  for (std::size_t i = 0; i < rdma_kinds.size(); ++i)
    ledger.rdma[i] = detail::count_rdma(rdma_kinds[i], 0);
  return ledger;
}

// Polls (every 50 ms) until `read()` equals `baseline` or `timeout` passes: the kernel
// releases some objects asynchronously (a killed peer's QPs, TIME_WAIT cm_ids). Returns the
// last ledger read; equal to `baseline` on success.
template <class Read = Ledger (*)()>
Ledger wait_for_ledger(const Ledger& baseline, std::chrono::milliseconds timeout,
                       Read read = [] { return ledger_of(); }) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  Ledger now = read();
  while (!(now == baseline) && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    now = read();
  }
  return now;
}

}  // namespace reliability
