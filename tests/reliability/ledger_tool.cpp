// rpmapp-ledger [PID | --all]: prints the resource ledger (tests/reliability/ledger.hpp) of
// PID (default: its parent, the script that runs it) or, with --all, the RDMA objects of
// every process, as one line: "fds N cm_id N qp N cq N mr N pd N ctx N srq N".
#include "ledger.hpp"

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>

int main(int argc, char** argv) {
  try {
    reliability::Ledger ledger;
    if (argc > 1 && std::strcmp(argv[1], "--all") == 0) ledger = reliability::ledger_of_all_processes();
    else ledger = reliability::ledger_of(argc > 1 ? static_cast<pid_t>(std::atol(argv[1])) : ::getppid());
    std::printf("%s\n", ledger.to_string().c_str());
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "rpmapp-ledger: %s\n", e.what());
    return 1;
  }
}
