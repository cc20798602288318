// The ledger itself, on the real stack: it must see what rpmapp opens and its return
// to the baseline, or every scenario that relies on it proves nothing.
#include "../integration/support.hpp"
#include "ledger.hpp"

#include <chrono>

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
