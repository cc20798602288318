// A device the kernel removes (RDMA_CM_EVENT_DEVICE_REMOVAL): the listener, the connections,
// registration, outgoing requests and new listeners on it fail with ENODEV naming it; the
// other device is untouched; the last Peer of it has librdmacm let go of its context (which
// the kernel's removal waits for), but never while another Peer's device is gone too.
// The kernel side is proven in the VM (tests/reliability/faults_test.cpp, [device-removal]).
#include "loop_util.hpp"

namespace device_removal_test {

using namespace test;
using namespace std::chrono_literals;

namespace {

// The error of a call on removed device fake0: provider, ENODEV, naming `call` and the device.
void check_removed(const Error& e, std::string_view call) {
  INFO("error: " << e.message());
  CHECK(e.code() == errc::provider);
  CHECK(e.sys_errno() == ENODEV);
  CHECK(e.call() == call);
  CHECK_THAT(e.message(), Catch::Contains("device fake0 was removed (RDMA_CM_EVENT_DEVICE_REMOVAL)"));
}

// librdmacm's sync after the last Peer of a removed device: the present devices first.
#define REQUIRE_OK(expr)                                         \
  do {                                                           \
    auto result_ = (expr);                                       \
    INFO((result_ ? std::string() : result_.error().message())); \
    REQUIRE(result_);                                            \
  } while (false)

const std::vector<std::string> sync_calls = {"ibv_get_device_list", "ibv_free_device_list",
                                             "rdma_get_devices", "rdma_free_devices"};

std::vector<std::string> after(const std::vector<std::string>& calls, const std::vector<std::string>& tail) {
  auto all = calls;
  all.insert(all.end(), tail.begin(), tail.end());
  return all;
}

// `devices` are removed while `peer` (on device 0) has a connection, which hears of it (lost)
// and is closed: rpmapp knows device 0 is removed, and nothing of it is left but the Peer.
void remove_under_connection(fake::FakeProvider& fake, const Peer& peer, std::initializer_list<int> devices) {
  Conn conn = connect_out(peer);
  for (int device : devices) fake.remove_device(device);
  auto event = conn.try_next_event();
  REQUIRE(event);
  CHECK(*event == ConnEvent::lost);
  REQUIRE_OK(std::move(conn).close());
}

}  // namespace

TEST_CASE("a removed device: every later call on its objects is ENODEV naming it, the other "
          "device serves, and its last Peer lets librdmacm close its context",
          "[device-removal]") {
  fake::FakeProvider fake;
  {
    Peer peer = open_peer(fake);
    Peer other = open_peer(fake, 1);
    Endpoint ep = listen_on(peer, "169.254.77.1");
    Conn conn = connect_out(peer, "hello");
    std::vector<std::byte> memory(64);
    MrLocal mr = *MrLocal::reg(peer, memory, MrUsage::write_src);

    fake.remove_device(0);
    CHECK_FALSE(fake.device_context_closed(0));  // Peers still use it: the removal waits

    // The listener: the event as an error, then the same error without reading the channel.
    auto request = ep.try_next_conn_req();
    REQUIRE_FALSE(request);
    check_removed(request.error(), "rdma_get_cm_event");
    CHECK(request.error().operation() == "Endpoint::try_next_conn_req");
    const auto mark = fake.mark();
    auto again = ep.next_conn_req_for(10ms);
    REQUIRE_FALSE(again);
    check_removed(again.error(), "rdma_get_cm_event");
    CHECK(fake.calls_since(mark).empty());

    // The connection: lost once, then the error (no event can come: the kernel destroyed the id).
    auto lost = conn.try_next_event();
    REQUIRE(lost);
    CHECK(*lost == ConnEvent::lost);
    auto later = conn.next_event();  // would block forever otherwise
    REQUIRE_FALSE(later);
    check_removed(later.error(), "rdma_get_cm_event");
    CHECK(later.error().operation() == "Conn::next_event");

    // New objects on the device: refused before any provider call.
    const auto before = fake.mark();
    auto reg = MrLocal::reg(peer, memory, MrUsage::read_src);
    REQUIRE_FALSE(reg);
    check_removed(reg.error(), "ibv_reg_mr");
    auto to = ConnReq::to(peer, "169.254.77.9", "7471");
    REQUIRE_FALSE(to);
    check_removed(to.error(), "ConnReq::to");
    auto listen = Endpoint::listen(peer, "169.254.77.1", "0");
    REQUIRE_FALSE(listen);
    check_removed(listen.error(), "Endpoint::listen");
    CHECK(fake.calls_since(before).empty());
    CHECK(*peer.device_name() == "fake0");  // queries still answer

    // The other device is untouched.
    CHECK(MrLocal::reg(other, memory, MrUsage::read_src));
    Endpoint other_ep = listen_on(other, "169.254.78.1");
    CHECK(take_request(fake, other_ep, {1, "on fake1", "169.254.78.2", 40000}));

    // Released: librdmacm syncs once the last Peer of the device is gone, not before.
    REQUIRE_OK(std::move(conn).close());
    REQUIRE_OK(std::move(ep).shutdown());
    REQUIRE_OK(std::move(mr).dereg());
    CHECK_FALSE(fake.device_context_closed(0));
    const auto closing = fake.mark();
    REQUIRE_OK(std::move(peer).close());
    CHECK(fake.calls_since(closing) == after({"ibv_dereg_mr", "ibv_dealloc_pd"}, sync_calls));
    CHECK(fake.device_context_closed(0));
    // Device 1 still works, and its Peer's release syncs nothing more.
    CHECK(take_request(fake, other_ep, {1, "on fake1", "169.254.78.2", 40000}));
    REQUIRE_OK(std::move(other_ep).shutdown());
    const auto other_closing = fake.mark();
    REQUIRE_OK(std::move(other).close());
    CHECK(fake.calls_since(other_closing) == std::vector<std::string>{"ibv_dereg_mr", "ibv_dealloc_pd"});
  }
  fake.expect_clean();
}

TEST_CASE("a removed device under EventLoop::serve: the handler gets the error naming it, once",
          "[device-removal][event_loop]") {
  fake::FakeProvider fake;
  {
    Peer peer = open_peer(fake);
    Endpoint ep = listen_on(peer, "169.254.77.1");
    EventLoop loop = make_loop();
    std::vector<Error> errors;
    auto reg = registered(loop.serve(ep, [&](expected<ConnReq> req) {
      if (!req) errors.push_back(req.error());
    }));
    fake.remove_device(0);
    CHECK(ran(loop.run_once(0ms)) == 1);
    REQUIRE(errors.size() == 1);
    check_removed(errors[0], "rdma_get_cm_event");
    CHECK(errors[0].operation() == "EventLoop::serve");
    CHECK(ran(loop.run_once(0ms)) == 0);  // nothing more comes
    CHECK(errors.size() == 1);
  }
  fake.expect_clean();
}

TEST_CASE("a removed device under EventLoop::watch: the handler hears lost once, then nothing",
          "[device-removal][event_loop]") {
  fake::FakeProvider fake;
  {
    Peer peer = open_peer(fake);
    Conn conn = connect_out(peer);
    EventLoop loop = make_loop();
    std::vector<expected<ConnEvent>> heard;
    auto reg = registered(loop.watch(conn, [&](expected<ConnEvent> event) { heard.push_back(event); }));
    fake.remove_device(0);
    CHECK(ran(loop.run_once(0ms)) == 1);
    REQUIRE(heard.size() == 1);
    REQUIRE(heard[0]);
    CHECK(*heard[0] == ConnEvent::lost);
    CHECK(ran(loop.run_once(0ms)) == 0);
    CHECK(heard.size() == 1);
    // A direct call afterwards says why.
    auto later = conn.try_next_event();
    REQUIRE_FALSE(later);
    check_removed(later.error(), "rdma_get_cm_event");
  }
  fake.expect_clean();
}

TEST_CASE("librdmacm is not synced while another Peer's device is gone: its context would "
          "close under that Peer; the last of them syncs",
          "[device-removal]") {
  fake::FakeProvider fake;
  {
    Peer peer = open_peer(fake);
    Peer unaware = open_peer(fake, 1);  // no cm_id on device 1: it hears of no removal
    remove_under_connection(fake, peer, {0, 1});
    // Peer::open validates a context with rdma_get_devices, which would sync: not now.
    const auto opening = fake.mark();
    CHECK(Peer::open(fake.context(1)));
    CHECK(fake.calls_since(opening) ==
          std::vector<std::string>{"ibv_get_device_list", "ibv_free_device_list", "ibv_query_device_ex",
                                   "ibv_alloc_pd", "ibv_reg_mr", "ibv_dereg_mr", "ibv_dealloc_pd"});
    const auto closing = fake.mark();
    REQUIRE_OK(std::move(peer).close());
    CHECK(fake.calls_since(closing) ==
          std::vector<std::string>{"ibv_dereg_mr", "ibv_dealloc_pd", "ibv_get_device_list",
                                   "ibv_free_device_list"});
    CHECK_FALSE(fake.device_context_closed(0));
    CHECK_FALSE(fake.device_context_closed(1));  // the fake notes a misuse if it closes now
    const auto last = fake.mark();
    REQUIRE_OK(std::move(unaware).close());
    CHECK(fake.calls_since(last) == after({"ibv_dereg_mr", "ibv_dealloc_pd"}, sync_calls));
    CHECK(fake.device_context_closed(0));
    CHECK(fake.device_context_closed(1));
  }
  fake.expect_clean();
}

TEST_CASE("a removed device under idle wildcard listeners: each lets go of the device's Peer when "
          "the removal is heard, without a request, so the removal need not wait for them; they serve on",
          "[device-removal]") {
  fake::FakeProvider fake;
  {
    std::vector<Peer> peers = peers_on_both_devices(fake);
    Endpoint wildcard = listen_wildcard(peers);
    Endpoint second = listen_wildcard(peers, "7472");
    // A listener on one of the device's addresses keeps its Peer: it hears the removal itself.
    Endpoint specific = listen_on(peers[0], "169.254.77.1", "7473");
    remove_under_connection(fake, peers[0], {0});
    // Neither wildcard listener took a request: both let go when the connection heard it.
    REQUIRE_OK(std::move(specific).shutdown());
    const auto closing = fake.mark();
    REQUIRE_OK(std::move(peers[0]).close());
    CHECK(fake.calls_since(closing) == after({"ibv_dereg_mr", "ibv_dealloc_pd"}, sync_calls));
    CHECK(fake.device_context_closed(0));
    CHECK(take_request(fake, wildcard, {1, "on fake1", "169.254.78.2", 40000}));
    CHECK(take_request(fake, second, {1, "on fake1", "169.254.78.2", 40001}));
    REQUIRE_OK(std::move(wildcard).shutdown());
    REQUIRE_OK(std::move(second).shutdown());
  }
  fake.expect_clean();
}

TEST_CASE("a request a wildcard listener took before a removal: its connect is ENODEV, and it holds "
          "the device's Peer only until it goes",
          "[device-removal]") {
  fake::FakeProvider fake;
  {
    std::vector<Peer> peers = peers_on_both_devices(fake);
    Endpoint wildcard = listen_wildcard(peers);
    // The request holds the Peer of device 0 after the listener let go of it at the removal.
    ConnReq early = take_request(fake, wildcard, {0, "on fake0", "169.254.77.2", 40000});
    remove_under_connection(fake, peers[0], {0});
    auto refused = std::move(early).connect();
    REQUIRE_FALSE(refused);
    INFO(refused.error().message());
    CHECK(refused.error().sys_errno() == ENODEV);
    const auto closing = fake.mark();
    REQUIRE_OK(std::move(peers[0]).close());
    CHECK(fake.calls_since(closing) == after({"ibv_dereg_mr", "ibv_dealloc_pd"}, sync_calls));
    CHECK(take_request(fake, wildcard, {1, "on fake1", "169.254.78.2", 40001}));
    REQUIRE_OK(std::move(wildcard).shutdown());
  }
  fake.expect_clean();
}

TEST_CASE("a removed device under an outgoing request being resolved: rdma_cm's ADDR_ERROR is "
          "reported as the removal",
          "[device-removal]") {
  fake::FakeProvider fake;
  {
    Peer peer = open_peer(fake);
    // What rxe gave in the VM: ADDR_ERROR, EPERM.
    fake.addr_event = RDMA_CM_EVENT_ADDR_ERROR;
    fake.addr_status = -EPERM;
    auto pending = ConnReq::start(peer, "169.254.77.9", "7471");
    REQUIRE(pending);
    fake.addr_event = RDMA_CM_EVENT_ADDR_RESOLVED;
    fake.addr_status = 0;
    remove_under_connection(fake, peer, {0});
    auto req = std::move(*pending).wait_for(1s);
    REQUIRE_FALSE(req);
    check_removed(req.error(), "rdma_resolve_addr");
    CHECK(req.error().operation() == "PendingConnReq::wait_for");
  }
  fake.expect_clean();
}

TEST_CASE("a removed device: a sync that fails (the device list unread, or librdmacm's own "
          "rdma_get_devices) is made by the next last Peer; the close still succeeds",
          "[device-removal][fail]") {
  struct Case {
    const char* call;                   // fails with ENOMEM
    std::vector<std::string> at_close;  // the provider calls of the close
  };
  const std::vector<std::string> released = {"ibv_dereg_mr", "ibv_dealloc_pd"};
  const Case cases[] = {
      {"ibv_get_device_list", after(released, {"ibv_get_device_list"})},
      {"rdma_get_devices", after(released, {"ibv_get_device_list", "ibv_free_device_list", "rdma_get_devices"})}};
  for (const Case& c : cases) {
    INFO("failing " << c.call);
    fake::FakeProvider fake;
    {
      Peer peer = open_peer(fake);
      remove_under_connection(fake, peer, {0});
      fake.fail(c.call, ENOMEM);
      const auto closing = fake.mark();
      REQUIRE_OK(std::move(peer).close());
      CHECK(fake.calls_since(closing) == c.at_close);
      CHECK_FALSE(fake.device_context_closed(0));
      const auto next = fake.mark();
      { Peer later = open_peer(fake, 1); }  // Peer::open's own rdma_get_devices syncs already
      CHECK(fake.device_context_closed(0));
      CHECK(fake.calls_since(next) == after({"rdma_get_devices", "rdma_free_devices", "ibv_query_device_ex",
                                             "ibv_alloc_pd", "ibv_reg_mr", "ibv_dereg_mr", "ibv_dealloc_pd"},
                                            sync_calls));
    }
    fake.expect_clean();
  }
}

}  // namespace device_removal_test

#undef REQUIRE_OK  // the unit files are compiled in unity batches
