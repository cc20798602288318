// rpmapp-ledger [--repeat N] [PID | --all]: prints the resource ledger
// (tests/reliability/ledger.hpp) of PID (default: its parent, the script that runs it) or,
// with --all, the RDMA objects of every process, as one line:
// "fds N cm_id N qp N cq N mr N pd N ctx N srq N". --repeat N reads it N times and also
// prints the time of one read on stderr ("rpmapp-ledger: N reads, S s per read").
#include "ledger.hpp"

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>

int main(int argc, char** argv) {
  try {
    long repeat = 1;
    int arg = 1;
    if (arg + 1 < argc && std::strcmp(argv[arg], "--repeat") == 0) {
      repeat = std::atol(argv[arg + 1]);
      if (repeat < 1) {
        std::fprintf(stderr, "rpmapp-ledger: --repeat needs a count >= 1, not %s\n", argv[arg + 1]);
        return 2;
      }
      arg += 2;
    }
    const bool all = arg < argc && std::strcmp(argv[arg], "--all") == 0;
    const pid_t pid = arg < argc && !all ? static_cast<pid_t>(std::atol(argv[arg])) : ::getppid();
    reliability::Ledger ledger;
    const auto t0 = std::chrono::steady_clock::now();
    for (long i = 0; i < repeat; ++i)
      ledger = all ? reliability::ledger_of_all_processes() : reliability::ledger_of(pid);
    const std::chrono::duration<double> took = std::chrono::steady_clock::now() - t0;
    std::printf("%s\n", ledger.to_string().c_str());
    if (repeat > 1)
      std::fprintf(stderr, "rpmapp-ledger: %ld reads, %.6f s per read\n", repeat, took.count() / static_cast<double>(repeat));
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "rpmapp-ledger: %s\n", e.what());
    return 1;
  }
}
