// rpmapp::ConnReq, PendingConnReq, Conn and Peer on a real RDMA stack (Soft-RoCE in
// tools/rpmapp-vm): private data both ways and its limits, reject with private data,
// requests outliving their endpoint, non-blocking outgoing requests, peers dropped first,
// queue pairs and completion queues, connecting to a port with no listener, event channels
// reused (ConnConfig::reuse_event_channel), and the fds and CQs a connection costs per
// configuration.
// Needs $SOFTROCE_IP; fails, never skips, without it. Every wait is bounded.
#include "support.hpp"
#include "../reliability/ledger.hpp"

#include <fcntl.h>
#include <poll.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace {

using namespace itest;  // also the rpmapp names every test uses (support.hpp)
using rpmapp::AddressKind;
using rpmapp::PendingConnReq;

bool starts_with(std::span<const std::byte> data, std::string_view prefix) {
  return data.size() >= prefix.size() &&
         std::string_view(reinterpret_cast<const char*>(data.data()), prefix.size()) == prefix;
}

std::vector<std::byte> bytes(std::size_t n, char fill) {
  return std::vector<std::byte>(n, static_cast<std::byte>(fill));
}

// A port on which nothing listens (any more): one the CM assigned to a closed listener.
std::string unused_port(const Peer& peer, const std::string& ip) {
  Endpoint ep = MUST(Endpoint::listen(peer, ip, "0"));
  std::string port = port_text(ep);
  MUST(std::move(ep).shutdown());
  return port;
}

}  // namespace

TEST_CASE("reject with private data: the client sees rejected and the data",
          "[conn][reject]") {
  const std::string ip = ip1();
  Peer peer = local_peer(ip);
  Endpoint ep = MUST(Endpoint::listen(peer, ip, "0"));
  Conn client = start_client(peer, ip, port_text(ep), "may I?");
  ConnReq req = take_request(ep);
  CHECK(MUST(req.is_incoming()));
  CHECK(starts_with(MUST(req.private_data()), "may I?"));
  MUST(std::move(req).reject(rpmapp::as_bytes("busy")));
  CHECK_FALSE(req);
  CHECK(wait_event(client, "client") == ConnEvent::rejected);
  auto data = MUST(client.private_data());
  CHECK(starts_with(data, "busy"));
  CHECK(rpmapp::as_text(data) == "busy");
}

TEST_CASE("dropping an incoming request rejects it", "[conn][reject]") {
  const std::string ip = ip1();
  Peer peer = local_peer(ip);
  Endpoint ep = MUST(Endpoint::listen(peer, ip, "0"));
  Conn client = start_client(peer, ip, port_text(ep));
  { ConnReq req = take_request(ep); }
  CHECK(wait_event(client, "client") == ConnEvent::rejected);
}

TEST_CASE("private data both ways, zero-padded by rdma_cm on IB/RoCE, at its length on iWARP, "
          "compared by prefix",
          "[conn][private_data]") {
  const std::string ip = ip1();
  Peer peer = local_peer(ip);
  const bool iwarp = is_iwarp(ip);
  Endpoint ep = MUST(Endpoint::listen(peer, ip, "0"));
  Conn client = start_client(peer, ip, port_text(ep), "hello from the client");
  ConnReq req = take_request(ep);
  auto request_data = MUST(req.private_data());
  CHECK(starts_with(request_data, "hello from the client"));
  // IB CM pads to RDMA_PS_TCP's REQ size; MPA carries the exact length
  CHECK(request_data.size() == (iwarp ? std::string_view("hello from the client").size() : 56));

  // copy_private_data: too small writes nothing; big enough copies all.
  std::vector<std::byte> small(8, std::byte{0x5a});
  CHECK(MUST_FAIL(req.copy_private_data(small)).code() == errc::inval);
  CHECK(small == bytes(8, 0x5a));
  std::vector<std::byte> big(100, std::byte{0x5a});
  CHECK(MUST(req.copy_private_data(big)) == request_data.size());
  CHECK(starts_with(big, "hello from the client"));

  Conn server = MUST(std::move(req).connect(rpmapp::as_bytes("welcome from the server")));
  establish(client, server);
  auto accept_data = MUST(client.private_data());
  CHECK(starts_with(accept_data, "welcome from the server"));
  CHECK(accept_data.size() == (iwarp ? std::string_view("welcome from the server").size() : 196));
  CHECK(starts_with(MUST(server.private_data()), "hello from the client"));
  disconnect_both(client, server);
}

namespace {

// The private data limits of the transport of the device at `ip`, both sides on one Peer:
// one byte more is inval, sends nothing and leaves the request usable; the limit itself
// arrives whole for connect, accept and reject; a short message arrives padded to the
// limit (IB CM) or at its length (iWARP).
void private_data_limits_hold(const std::string& ip, const rpmapp::PrivateDataLimits& expected) {
  Peer peer = local_peer(ip);
  const auto limits = MUST(peer.private_data_limits());
  REQUIRE(limits == expected);
  Endpoint ep = MUST(Endpoint::listen(peer, ip, "0"));

  ConnReq out = MUST(ConnReq::to(peer, ip, port_text(ep)));
  CHECK_FALSE(MUST(out.is_incoming()));
  auto e1 = MUST_FAIL(std::move(out).connect(bytes(limits.connect + 1, 'c')));
  INFO(e1.message());
  CHECK(e1.code() == errc::inval);
  CHECK_THAT(e1.message(), Catch::Contains(MUST(peer.device_name())));
  REQUIRE(out);  // not consumed
  auto nothing = MUST_FAIL(ep.next_conn_req_for(1500ms));
  INFO(nothing.message());
  CHECK(nothing.code() == errc::no_event);  // nothing was sent

  // An outgoing request cannot be rejected.
  CHECK(MUST_FAIL(std::move(out).reject()).code() == errc::inval);
  REQUIRE(out);

  const auto max_connect = bytes(limits.connect, 'C');
  Conn client = MUST(std::move(out).connect(max_connect));
  ConnReq in = take_request(ep);
  auto request_data = MUST(in.private_data());
  CHECK(std::vector<std::byte>(request_data.begin(), request_data.end()) == max_connect);

  const auto too_long_accept = bytes(limits.accept + 1, 'a');
  auto e2 = MUST_FAIL(std::move(in).connect(too_long_accept));
  INFO(e2.message());
  CHECK(e2.code() == errc::inval);
  REQUIRE(in);
  auto e3 = MUST_FAIL(std::move(in).reject(bytes(limits.reject + 1, 'r')));
  CHECK(e3.code() == errc::inval);
  REQUIRE(in);
  // The client heard nothing so far.
  auto quiet = MUST_FAIL(client.next_event_for(500ms));
  CHECK(quiet.code() == errc::no_event);

  const auto max_accept = bytes(limits.accept, 'A');
  Conn server = MUST(std::move(in).connect(max_accept));
  establish(client, server);
  auto got = MUST(client.private_data());
  CHECK(std::vector<std::byte>(got.begin(), got.end()) == max_accept);
  disconnect_both(client, server);

  // A reject at the limit arrives whole; a short request is padded or exact.
  Conn refused = start_client(peer, ip, port_text(ep), "short");
  ConnReq second = take_request(ep);
  CHECK(MUST(second.private_data()).size() == (limits.padded ? limits.connect : 5));
  const auto max_reject = bytes(limits.reject, 'R');
  MUST(std::move(second).reject(max_reject));
  CHECK(wait_event(refused, "client") == ConnEvent::rejected);
  auto reason = MUST(refused.private_data());
  CHECK(std::vector<std::byte>(reason.begin(), reason.end()) == max_reject);
}

}  // namespace

TEST_CASE("oversize private data is inval, sends nothing, and leaves the request usable; the limits "
          "of the device's transport arrive whole",
          "[conn][private_data]") {
  const std::string ip = ip1();
  private_data_limits_hold(ip, rpmapp::private_data_limits(is_iwarp(ip)));
}

TEST_CASE("on iWARP (siw0) the private data limit is 251 bytes for connect, accept and reject, and "
          "private data arrives at its length",
          "[conn][private_data][iwarp]") {
  private_data_limits_hold(iwarp_ip(), rpmapp::private_data_limits(true));
}

TEST_CASE("a request outlives its endpoint and the server's Peer handle",
          "[conn][lifetime]") {
  const std::string ip = ip1();
  Peer client_peer = local_peer(ip);
  std::optional<Peer> server_peer(local_peer(ip));
  std::optional<Endpoint> ep(MUST(Endpoint::listen(*server_peer, ip, "0")));

  Conn client = start_client(client_peer, ip, port_text(*ep), "outlive");
  ConnReq req = take_request(*ep);
  MUST(std::move(*ep).shutdown());
  ep.reset();
  MUST(std::move(*server_peer).close());  // others still use the protection domain
  server_peer.reset();

  CHECK(MUST(req.device()) == MUST(client_peer.device_name()));
  Conn server = MUST(std::move(req).connect(rpmapp::as_bytes("still here")));
  establish(client, server);
  CHECK(starts_with(MUST(client.private_data()), "still here"));
  disconnect_both(client, server);
  MUST(std::move(server).close());
  MUST(std::move(client).close());
}

TEST_CASE("Peers dropped before their endpoint, requests and connections are safe",
          "[conn][lifetime][peer]") {
  const std::string ip = ip1();
  std::optional<Peer> server_peer(local_peer(ip));
  std::optional<Peer> client_peer(local_peer(ip));
  Endpoint ep = MUST(Endpoint::listen(*server_peer, ip, "0"));
  server_peer.reset();  // the endpoint keeps the domain alive

  ConnReq out = MUST(ConnReq::to(*client_peer, ip, port_text(ep)));
  client_peer.reset();  // the request keeps it alive
  Conn client = MUST(std::move(out).connect());
  ConnReq in = take_request(ep);
  MUST(std::move(ep).shutdown());
  Conn server = MUST(std::move(in).connect());
  establish(client, server);
  disconnect_both(client, server);
  // The last users go here; ASan reports any use after free.
}

TEST_CASE("Peer::from_address finds the device by local and by remote address", "[peer]") {
  const std::string ip = ip1();
  Peer local = MUST(Peer::from_address(ip, AddressKind::local));
  Peer remote = MUST(Peer::from_address(ip, AddressKind::remote));
  const std::string device = MUST(local.device_name());
  CHECK_FALSE(device.empty());
  CHECK(MUST(remote.device_name()) == device);
  if (const char* dev = std::getenv("SOFTROCE_DEV")) CHECK(device == dev);
  CHECK(MUST(local.pd()) != nullptr);
  CHECK(MUST(local.context()) != nullptr);

  auto bad = MUST_FAIL(Peer::from_address("localhost", AddressKind::local));
  INFO(bad.message());
  CHECK(bad.code() == errc::inval);

  MUST(std::move(remote).close());
  CHECK_FALSE(remote);
  CHECK(MUST_FAIL(remote.pd()).code() == errc::inval);
}

TEST_CASE("queue pair numbers and a separate receive CQ (rcq_size > 0)", "[conn][qp]") {
  const std::string ip = ip1();
  Peer peer = local_peer(ip);
  Endpoint ep = MUST(Endpoint::listen(peer, ip, "0"));
  const ConnConfig config{.cq_size = 8, .rcq_size = 5, .sq_size = 4, .rq_size = 6};

  ConnReq out = MUST(ConnReq::to(peer, ip, port_text(ep), config));
  const std::uint32_t out_qp = MUST(out.qp_num());
  CHECK(out_qp != 0);
  CHECK(MUST(out.device()) == MUST(peer.device_name()));
  Conn client = MUST(std::move(out).connect());

  ConnReq in = take_request(ep, config);
  const std::uint32_t in_qp = MUST(in.qp_num());
  CHECK(in_qp != 0);
  CHECK(in_qp != out_qp);
  Conn server = MUST(std::move(in).connect());

  for (Conn* conn : {&client, &server}) {
    ibv_qp* qp = MUST(conn->qp());
    REQUIRE(qp != nullptr);
    CHECK(MUST(conn->qp_num()) == qp->qp_num);
    ibv_cq* cq = MUST(MUST(conn->cq()).native());
    ibv_cq* rcq = MUST(MUST(conn->rcq()).native());
    CHECK(cq != nullptr);
    CHECK(rcq != nullptr);
    CHECK(qp->send_cq == cq);
    CHECK(qp->recv_cq == rcq);
    ibv_qp_attr attr{};
    ibv_qp_init_attr init{};
    REQUIRE(ibv_query_qp(qp, &attr, IBV_QP_CAP, &init) == 0);
    CHECK(init.cap.max_send_wr >= config.sq_size);
    CHECK(init.cap.max_recv_wr >= config.rq_size);
  }
  CHECK(MUST(client.qp_num()) == out_qp);
  CHECK(MUST(server.qp_num()) == in_qp);
  establish(client, server);
  disconnect_both(client, server);

  // Without rcq_size the receive completions share the main CQ.
  Conn c2 = start_client(peer, ip, port_text(ep));
  Conn s2 = MUST(take_request(ep).connect());
  CHECK_FALSE(MUST(c2.rcq()));
  CHECK(MUST(c2.qp())->recv_cq == MUST(MUST(c2.cq()).native()));
  establish(c2, s2);
}

TEST_CASE("8 outgoing requests in flight from one thread, completed through poll + try_wait",
          "[conn][nonblocking]") {
  const std::string ip = ip1();
  Peer peer = local_peer(ip);
  Endpoint ep = MUST(Endpoint::listen(peer, ip, "0"));
  const std::string port = port_text(ep);
  constexpr std::size_t n = 8;

  std::vector<std::optional<PendingConnReq>> pending;
  for (std::size_t i = 0; i < n; ++i) pending.emplace_back(MUST(ConnReq::start(peer, ip, port)));
  std::vector<std::optional<ConnReq>> ready(n);

  const auto deadline = std::chrono::steady_clock::now() + 20s;
  std::size_t done = 0;
  while (done < n) {
    REQUIRE(std::chrono::steady_clock::now() < deadline);
    std::vector<pollfd> fds;
    std::vector<std::size_t> which;
    for (std::size_t i = 0; i < n; ++i) {
      if (!pending[i]) continue;
      fds.push_back({MUST(pending[i]->fd()), POLLIN, 0});
      which.push_back(i);
    }
    const int rc = ::poll(fds.data(), fds.size(), 1000);
    REQUIRE(rc >= 0);
    for (std::size_t k = 0; k < fds.size(); ++k) {
      if ((fds[k].revents & POLLIN) == 0) continue;
      const std::size_t i = which[k];
      auto result = std::move(*pending[i]).try_wait();
      if (!result) {
        INFO("request " << i << ": " << result.error().message());
        REQUIRE(result.error().code() == errc::no_event);
        REQUIRE(*pending[i]);  // still in progress, still usable
        continue;
      }
      ready[i] = std::move(*result);
      pending[i].reset();
      ++done;
    }
  }

  std::vector<Conn> clients;
  for (std::size_t i = 0; i < n; ++i) {
    const std::string tag = "client " + std::to_string(i);
    clients.push_back(MUST(std::move(*ready[i]).connect(rpmapp::as_bytes(tag))));
  }
  std::vector<Conn> servers;
  for (std::size_t i = 0; i < n; ++i) servers.push_back(MUST(take_request(ep).connect()));
  for (auto& c : clients) CHECK(wait_event(c, "client") == ConnEvent::established);
  for (auto& s : servers) CHECK(wait_event(s, "server") == ConnEvent::established);
  for (auto& c : clients) MUST(c.disconnect());
  for (auto& s : servers) CHECK(wait_event(s, "server") == ConnEvent::closed);
  for (auto& s : servers) MUST(s.disconnect());
  for (auto& c : clients) CHECK(wait_event(c, "client") == ConnEvent::closed);
}

TEST_CASE("non-blocking Conn: the fd is O_NONBLOCK, try_ and _for give no_event, "
          "next_event waits for the event",
          "[conn][nonblocking]") {
  const std::string ip = ip1();
  Peer peer = local_peer(ip);
  Endpoint ep = MUST(Endpoint::listen(peer, ip, "0"));
  Conn client = start_client(peer, ip, port_text(ep));
  Conn server = MUST(take_request(ep).connect());
  establish(client, server);

  auto none = MUST_FAIL(client.try_next_event());
  INFO(none.message());
  CHECK(none.code() == errc::no_event);
  CHECK(MUST_FAIL(server.next_event_for(200ms)).code() == errc::no_event);

  const int fd = MUST(server.fd());
  CHECK((::fcntl(fd, F_GETFL) & O_NONBLOCK) != 0);
  CHECK((::fcntl(MUST(client.fd()), F_GETFL) & O_NONBLOCK) != 0);

  // The blocking call waits for the event (the fd's O_NONBLOCK does not end it).
  MUST(client.disconnect());
  CHECK(MUST(server.next_event()) == ConnEvent::closed);
  MUST(server.disconnect());
  CHECK(wait_event(client, "client") == ConnEvent::closed);
}

TEST_CASE("reuse_event_channel: the next connections run on the released ones' channels, "
          "and none of the released ones' events reaches them",
          "[conn][reuse]") {
  const std::string ip = ip1();
  Peer peer = local_peer(ip);
  Endpoint ep = MUST(Endpoint::listen(peer, ip, "0"));
  rpmapp::ConnConfig config;
  config.reuse_event_channel = true;
  Conn client = start_client(peer, ip, port_text(ep), {}, config);
  Conn server = MUST(take_request(ep, config).connect());
  establish(client, server);
  const int client_fd = MUST(client.fd());
  const int server_fd = MUST(server.fd());
  // The server is released with its DISCONNECTED unread: rdma_destroy_id must drop it.
  MUST(client.disconnect());
  pollfd readable{server_fd, POLLIN, 0};
  REQUIRE(::poll(&readable, 1, 10000) == 1);
  MUST(std::move(server).close());
  CHECK(wait_event(client, "client") == ConnEvent::closed);
  MUST(std::move(client).close());

  for (int round = 0; round < 3; ++round) {
    INFO("round " << round);
    Conn c = start_client(peer, ip, port_text(ep), {}, config);
    Conn s = MUST(take_request(ep, config).connect());
    const std::vector<int> fds = {MUST(c.fd()), MUST(s.fd())};
    CHECK(((fds[0] == client_fd && fds[1] == server_fd) || (fds[0] == server_fd && fds[1] == client_fd)));
    CHECK((::fcntl(fds[0], F_GETFL) & O_NONBLOCK) != 0);
    CHECK((::fcntl(fds[1], F_GETFL) & O_NONBLOCK) != 0);
    establish(c, s);  // the first events are this connection's own
    CHECK(MUST_FAIL(c.try_next_event()).code() == errc::no_event);
    CHECK(MUST_FAIL(s.try_next_event()).code() == errc::no_event);
    disconnect_both(c, s);
    MUST(std::move(c).close());
    MUST(std::move(s).close());
  }
  // Kept open by the Peer (closed with its last reference), not by the released Conns.
  CHECK(::fcntl(client_fd, F_GETFD) != -1);
  CHECK(::fcntl(server_fd, F_GETFD) != -1);
}

TEST_CASE("connecting to a port with no listener is rejected or unreachable (IB/RoCE) or refused by "
          "connect (iWARP), not a hang",
          "[conn][events]") {
  const std::string ip = ip1();
  Peer peer = local_peer(ip);
  const std::string port = unused_port(peer, ip);
  if (is_iwarp(ip)) {
    connect_refused_by_tcp(peer, ip, port);
    return;
  }
  Conn client = start_client(peer, ip, port, "anyone?");
  const ConnEvent event = wait_event(client, "client");
  CAPTURE(event);
  CHECK((event == ConnEvent::rejected || event == ConnEvent::unreachable));
}

TEST_CASE("bad ConnReq::to arguments are inval", "[conn]") {
  const std::string ip = ip1();
  Peer peer = local_peer(ip);
  CHECK(MUST_FAIL(ConnReq::to(peer, ip, "0")).code() == errc::inval);
  CHECK(MUST_FAIL(ConnReq::to(peer, ip, "70000")).code() == errc::inval);
  CHECK(MUST_FAIL(ConnReq::to(peer, "host.example", "7471")).code() == errc::inval);
  CHECK(MUST_FAIL(ConnReq::to(peer, ip, "7471", ConnConfig{.cq_size = 0})).code() == errc::inval);
  CHECK(MUST_FAIL(ConnReq::to(peer, ip, "7471", ConnConfig{.retry_count = 8})).code() ==
        errc::inval);
}

// What an accepted connection costs a server process, per ConnConfig: fds (its rdma_cm
// event channel, unless shared, and completion channels) and the kernel's CQs, counted around each of 4
// accepts with the resource ledger (tests/reliability/ledger.hpp); each connection is
// established before the next client starts (a request left waiting at the listener can
// time out at its client). docs/config.md has the table.
TEST_CASE("fds and CQs per accepted connection, per configuration", "[conn][fds]") {
  constexpr long n = 4;
  const std::string ip = ip1();
  Peer peer = local_peer(ip);
  Endpoint ep = MUST(Endpoint::listen(peer, ip, "0"));
  const std::string port = port_text(ep);
  rpmapp::Srq srq = MUST(rpmapp::Srq::create(peer));  // with its own receive CQ
  rpmapp::SharedCq shared = MUST(rpmapp::SharedCq::create(peer));
  rpmapp::SharedCq polled_shared = MUST(rpmapp::SharedCq::create(peer, {.completion_channel = false}));
  rpmapp::SharedEventChannel events = MUST(rpmapp::SharedEventChannel::create());
  struct Case {
    const char* name;
    ConnConfig config;
    long fds, cqs;  // per connection
  };
  ConnConfig with_rcq, shared_channel, polled, polled_rcq, on_srq, on_shared, all_shared;
  with_rcq.rcq_size = 10;
  shared_channel.rcq_size = 10;
  shared_channel.shared_completion_channel = true;
  polled.completion_channel = false;
  polled_rcq.completion_channel = false;
  polled_rcq.rcq_size = 10;
  on_srq.srq = &srq;
  on_shared.srq = &srq;
  on_shared.shared_cq = &shared;
  all_shared.srq = &srq;
  all_shared.shared_cq = &polled_shared;
  all_shared.shared_event_channel = &events;
  const Case cases[] = {{"the default", {}, 2, 1},
                        {"rcq_size 10", with_rcq, 3, 2},
                        {"rcq_size 10, shared_completion_channel", shared_channel, 2, 2},
                        {"completion_channel false", polled, 1, 1},
                        {"completion_channel false, rcq_size 10", polled_rcq, 1, 2},
                        {"srq (its receive CQ shared)", on_srq, 2, 1},
                        {"srq and shared_cq: no queue of its own", on_shared, 1, 0},
                        {"srq, shared_cq and shared_event_channel: no fd either", all_shared, 0, 0}};
  for (const Case& c : cases) {
    INFO(c.name);
    std::vector<Conn> clients, servers;
    long fds = 0, cqs = 0, qps = 0;  // the accepts' own, summed
    for (long i = 0; i < n; ++i) {
      clients.push_back(start_client(peer, ip, port));
      const reliability::Ledger before = reliability::ledger_of();
      servers.push_back(MUST(take_request(ep, c.config).connect()));
      const reliability::Ledger after = reliability::ledger_of();
      INFO("accept " << i << ": " << reliability::ledger_diff(before, after));
      fds += after.count("fds") - before.count("fds");
      cqs += after.count("cq") - before.count("cq");
      qps += after.count("qp") - before.count("qp");
      establish(clients.back(), servers.back());
    }
    CHECK(fds == n * c.fds);
    CHECK(cqs == n * c.cqs);
    CHECK(qps == n);
    for (long i = 0; i < n; ++i) disconnect_both(clients[i], servers[i]);
  }
  MUST(std::move(ep).shutdown());
}
