// The ledger itself, on the real stack: it must see what rpmapp opens and its return
// to the baseline, or every scenario that relies on it proves nothing.
#include "../integration/support.hpp"
#include "ledger.hpp"

#include <rpmapp/mr.hpp>
#include <rpmapp/srq.hpp>

#include <cerrno>
#include <chrono>
#include <cstddef>
#include <iostream>
#include <system_error>
#include <vector>

using namespace std::chrono_literals;

TEST_CASE("ledger_diff names each kind that differs and nothing else") {
  reliability::Ledger a, b;
  CHECK(reliability::ledger_diff(a, b).empty());
  b.fds = 3;
  b.rdma[0] = 1;   // cm_id
  b.rdma[2] = -1;  // cq
  CHECK(reliability::ledger_diff(a, b) == "fds +3 cm_id +1 cq -1");
  CHECK(b.count("cm_id") == 1);
  CHECK(b.count("fds") == 3);
  CHECK_THROWS(b.count("nonsense"));
}

TEST_CASE("the ledger counts a peer, a listener and a connection, and their release") {
  const std::string ip = itest::ip1();
  reliability::open_librdmacm_devices();
  const auto baseline = reliability::ledger_of();
  CHECK(baseline.count("ctx") >= 1);  // librdmacm's own, for the process's lifetime
  {
    auto peer = itest::local_peer(ip);
    const auto with_peer = reliability::ledger_of();
    CHECK(with_peer.count("ctx") == baseline.count("ctx"));  // librdmacm's context
    CHECK(with_peer.count("pd") == baseline.count("pd") + 1);
    auto ep = MUST(rpmapp::Endpoint::listen(peer, ip, "0"));
    const auto listening = reliability::ledger_of();
    CHECK(listening.count("cm_id") == with_peer.count("cm_id") + 1);
    CHECK(listening.fds > with_peer.fds);  // the listener's event channel
    {
      auto client = itest::start_client(peer, ip, itest::port_text(ep));
      auto server = MUST(itest::take_request(ep).connect({}));
      itest::establish(client, server);
      const auto connected = reliability::ledger_of();
      CHECK(connected.count("cm_id") == listening.count("cm_id") + 2);
      CHECK(connected.count("qp") == listening.count("qp") + 2);
      CHECK(connected.count("cq") >= listening.count("cq") + 2);
      INFO("connected: " << connected.to_string());
      itest::disconnect_both(client, server);
    }
    const auto after_conns = reliability::wait_for_ledger(listening, 5s);
    CHECK(reliability::ledger_diff(listening, after_conns) == "");
  }
  const auto after = reliability::wait_for_ledger(baseline, 5s);
  INFO("baseline " << baseline.to_string() << " after " << after.to_string());
  CHECK(reliability::ledger_diff(baseline, after) == "");
}

// The ledger reads the kernel's resource tracker over netlink; `rdma resource show` reads
// the same tracker. Equal counts for every kind, with every kind present, keep the fast
// path from counting wrong unnoticed (a wrong attribute, a missed device or dump part).
TEST_CASE("the netlink counts equal what `rdma resource show` reports, kind by kind") {
  const std::string ip = itest::ip1();
  reliability::open_librdmacm_devices();
  auto peer = itest::local_peer(ip);
  std::vector<std::byte> memory(4096);
  auto mr = MUST(rpmapp::MrLocal::reg(peer, memory, rpmapp::MrUsage::send | rpmapp::MrUsage::recv));
  auto srq = MUST(rpmapp::Srq::create(peer));
  auto ep = MUST(rpmapp::Endpoint::listen(peer, ip, "0"));
  auto client = itest::start_client(peer, ip, itest::port_text(ep));
  auto server = MUST(itest::take_request(ep).connect({}));
  itest::establish(client, server);

  const auto t0 = std::chrono::steady_clock::now();
  const auto ledger = reliability::ledger_of();
  const std::chrono::duration<double> read_time = std::chrono::steady_clock::now() - t0;
  std::cout << "ledger: one read (netlink) takes " << read_time.count() << " s" << std::endl;
  const auto all = reliability::ledger_of_all_processes();
  const auto tool = reliability::rdma_tool_counts(::getpid());
  for (std::size_t i = 0; i < reliability::rdma_kinds.size(); ++i) {
    INFO("kind " << reliability::rdma_kinds[i]);
    CHECK(ledger.rdma[i] >= 1);  // this process holds one of each
    CHECK(ledger.rdma[i] == tool.of_pid[i]);
    CHECK(all.rdma[i] >= ledger.rdma[i]);
    CHECK(all.rdma[i] == tool.of_all_processes[i]);
  }
  CHECK(reliability::detail::count_rdma("cm_id", ::getpid()) == ledger.count("cm_id"));  // one kind alone
  CHECK(reliability::detail::count_rdma_kinds(1) == decltype(ledger.rdma){});  // init holds none
  itest::disconnect_both(client, server);
}

TEST_CASE("a failed resource dump names the command, the device and errno") {
  reliability::detail::NldevSocket socket;
  const auto& qp = reliability::detail::nldev_kinds[1];
  REQUIRE(std::string(qp.command_name) == "RDMA_NLDEV_CMD_RES_QP_GET");
  try {
    socket.dump(qp.command, qp.command_name, 0xfffffff0u, [](const unsigned char*, std::size_t) { return true; });
    FAIL("a dump of a device that does not exist succeeded");
  } catch (const std::system_error& e) {
    const std::string what = e.what();
    INFO(what);
    CHECK(e.code().value() == EINVAL);  // the kernel's answer to an unknown device index
    CHECK(what.find("RDMA_NLDEV_CMD_RES_QP_GET") != std::string::npos);
    CHECK(what.find("device index 4294967280") != std::string::npos);
  }
  // The socket still serves the next dump.
  CHECK_FALSE(reliability::detail::rdma_device_indexes(socket).empty());
}
