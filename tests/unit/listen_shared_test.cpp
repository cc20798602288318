// Endpoint::listen_shared: ib_cm_insert_listen semantics.
#include "test_util.hpp"

#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <latch>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace listen_shared_test {

using namespace test;

TEST_CASE("listen_shared returns the same listener for the same device and port",
          "[listen_shared]") {
  fake::FakeProvider fake;
  {
    Peer peer = open_peer(fake);
    auto a = Endpoint::listen_shared(peer, "169.254.77.1", "7471");
    REQUIRE(a);
    const auto mark = fake.mark();
    auto b = Endpoint::listen_shared(peer, "169.254.77.1", "7471");
    REQUIRE(b);
    CHECK(fake.calls_since(mark).empty());  // nothing new created
    CHECK(*a->fd() == *b->fd());
    CHECK(*a->share_count() == 2);
    CHECK(*b->share_count() == 2);
    CHECK(fake.alive("cm_id") == 1);

    auto other_port = Endpoint::listen_shared(peer, "169.254.77.1", "7472");
    REQUIRE(other_port);
    CHECK(*other_port->fd() != *a->fd());
    CHECK(*other_port->share_count() == 1);

    // Requests go to whichever handle asks.
    fake.inject_connect_request(*a->fd(), {0, "one", "169.254.77.20", 40001});
    auto req = b->try_next_conn_req();
    REQUIRE(req);
    CHECK(as_text(*req->private_data()) == "one");

    // The first owner leaving does not stop the listener; the last one does.
    CHECK(std::move(*a).shutdown());
    CHECK(*b->share_count() == 1);
    CHECK(fake.alive("cm_id") == 3);  // listener, other_port, the request
    fake.inject_connect_request(*b->fd(), {});
    CHECK(b->try_next_conn_req());
    CHECK(std::move(*b).shutdown());
    CHECK(fake.alive("cm_id") == 2);  // other_port and the request
    // A new listen_shared on the port after the last owner left makes a new listener.
    auto c = Endpoint::listen_shared(peer, "169.254.77.1", "7471");
    REQUIRE(c);
    CHECK(*c->share_count() == 1);
  }
  fake.expect_clean();
}

TEST_CASE("listen_shared: wildcard and port 0", "[listen_shared]") {
  fake::FakeProvider fake;
  {
    Peer peer = open_peer(fake);
    auto a = Endpoint::listen_shared(peer, "", "0");
    REQUIRE(a);
    auto b = Endpoint::listen_shared(peer, "", "0");  // port 0 always makes a new one
    REQUIRE(b);
    CHECK(*a->port() != *b->port());
    const std::string port = std::to_string(*a->port());
    auto c = Endpoint::listen_shared(peer, "::", port);  // "" binds "::": shares a's port
    REQUIRE(c);
    CHECK(*c->fd() == *a->fd());
    CHECK(*a->share_count() == 2);
    CHECK(*c->device() == "");
    auto v4 = Endpoint::listen_shared(peer, "0.0.0.0", port);  // another key, refused
    REQUIRE_FALSE(v4);
    check_inval(v4.error(), "Endpoint::listen_shared", "held by an IPv6 wildcard");
  }
  fake.expect_clean();
}

TEST_CASE("listen_shared and listen do not share", "[listen_shared]") {
  fake::FakeProvider fake;
  Peer peer = open_peer(fake);
  Endpoint plain = listen_on(peer, "169.254.77.1", "7471");
  auto shared = Endpoint::listen_shared(peer, "169.254.77.1", "7471");
  REQUIRE_FALSE(shared);  // a second listener on a port in use
  CHECK(shared.error().sys_errno() == EADDRINUSE);
  CHECK(*plain.share_count() == 1);
}

TEST_CASE("listen_shared: each provider call fails in turn", "[listen_shared][fail-each]") {
  const std::vector<std::string> calls = {"rdma_create_event_channel", "fcntl",
                                          "rdma_create_id", "rdma_bind_addr", "rdma_listen"};
  fail_each_call(calls, kErr, [](fake::FakeProvider& fake, Probe& probe) {
    Peer peer = open_peer(fake);
    probe.begin();
    auto ep = Endpoint::listen_shared(peer, "169.254.77.1", "7471");
    probe.end();
    if (!probe.check_outcome(ep)) return;
    // Nothing registered: the next call listens anew.
    auto again = Endpoint::listen_shared(peer, "169.254.77.1", "7471");
    REQUIRE(again);
    CHECK(*again->share_count() == 1);
  });
}

TEST_CASE("listen_shared: bad arguments are inval, before any provider call",
          "[listen_shared][inval]") {
  fake::FakeProvider fake;
  std::optional<Peer> holder(open_peer(fake));
  Peer& peer = *holder;
  const auto mark = fake.mark();
  for (const char* port : {"", "-1", "65536", "abc", " 80", "80 ", "+80"}) {
    auto ep = Endpoint::listen_shared(peer, "", port);
    REQUIRE_FALSE(ep);
    check_inval(ep.error(), "Endpoint::listen_shared", "port");
  }
  for (const char* addr : {"abc", "1.2.3.4.5", "300.1.1.1"}) {
    auto ep = Endpoint::listen_shared(peer, addr, "7471");
    REQUIRE_FALSE(ep);
    check_inval(ep.error(), "Endpoint::listen_shared", "numeric");
  }
  CHECK(fake.calls_since(mark).empty());
  auto foreign = Endpoint::listen_shared(peer, "169.254.78.1", "7471");
  REQUIRE_FALSE(foreign);
  check_inval(foreign.error(), "Endpoint::listen_shared", "fake1");
  holder.reset();
  fake.expect_clean();
}

TEST_CASE("listen_shared: another address on a shared port is another listener",
          "[listen_shared][inval]") {
  fake::FakeProvider fake;
  Peer peer = open_peer(fake);
  auto first = Endpoint::listen_shared(peer, "169.254.77.1", "7471");
  REQUIRE(first);
  auto malformed = Endpoint::listen_shared(peer, "abc", "7471");
  REQUIRE_FALSE(malformed);
  check_inval(malformed.error(), "Endpoint::listen_shared", "numeric");
  auto foreign = Endpoint::listen_shared(peer, "169.254.78.1", "7471");  // fake1's address
  REQUIRE_FALSE(foreign);
  check_inval(foreign.error(), "Endpoint::listen_shared", "fake1");
  // Keyed by address, not device: the kernel decides (the fake's fake0 has one address).
  auto other = Endpoint::listen_shared(peer, "169.254.77.5", "7471");
  REQUIRE_FALSE(other);
  check_injected(other.error(), "rdma_bind_addr", EADDRNOTAVAIL);
  CHECK(*first->share_count() == 1);
}

// BUG (detail/listener.hpp, detail::listen_shared): when a shared listener exists for the
// device and port, the arguments are not validated: a negative backlog is accepted (listen
// and a first listen_shared reject it), and a malformed address is reported as "already
// listened on at address ..." instead of "not a numeric IPv4 or IPv6 address".
TEST_CASE("listen_shared validates its arguments even when a listener exists",
          "[listen_shared]") {
  fake::FakeProvider fake;
  Peer peer = open_peer(fake);
  auto first = Endpoint::listen_shared(peer, "169.254.77.1", "7471");
  REQUIRE(first);
  ListenOptions negative;
  negative.backlog = -1;
  auto bad_backlog = Endpoint::listen_shared(peer, "169.254.77.1", "7471", negative);
  REQUIRE_FALSE(bad_backlog);
  check_inval(bad_backlog.error(), "Endpoint::listen_shared", "backlog");
  auto malformed = Endpoint::listen_shared(peer, "abc", "7471");
  REQUIRE_FALSE(malformed);
  check_inval(malformed.error(), "Endpoint::listen_shared", "numeric");
  CHECK(*first->share_count() == 1);
}

// ---- issue 8.7: keys and Peers of shared listeners

TEST_CASE("issue 8.7: an IPv6 wildcard is not handed the IPv4-only listener of its port",
          "[listen_shared][issue8]") {
  fake::FakeProvider fake;
  {
    Peer peer = open_peer(fake);
    auto v4 = Endpoint::listen_shared(peer, "0.0.0.0", "7471");
    REQUIRE(v4);
    const auto mark = fake.mark();
    auto v6 = Endpoint::listen_shared(peer, "::", "7471");
    REQUIRE_FALSE(v6);  // before: the IPv4 listener, shared (IPv6 clients refused)
    check_inval(v6.error(), "Endpoint::listen_shared", "port 7471 is held by an IPv4-only wildcard");
    CHECK(fake.calls_since(mark).empty());
    CHECK(*v4->share_count() == 1);
    // And the reverse: an IPv6 wildcard already takes the port's IPv4 requests.
    auto dual = Endpoint::listen_shared(peer, "::", "7472");
    REQUIRE(dual);
    CHECK(*dual->local_address() == "::");
    auto v4_after = Endpoint::listen_shared(peer, "0.0.0.0", "7472");
    REQUIRE_FALSE(v4_after);  // before: the IPv6 listener, shared
    check_inval(v4_after.error(), "Endpoint::listen_shared", "held by an IPv6 wildcard");
    CHECK(*dual->share_count() == 1);
  }
  fake.expect_clean();
}

TEST_CASE("issue 8.7: \"::0\" and \"::\" are one key (the bound address, not the device)",
          "[listen_shared][issue8]") {
  fake::FakeProvider fake;
  {
    Peer peer = open_peer(fake);
    auto a = Endpoint::listen_shared(peer, "::0", "7471");
    REQUIRE(a);
    CHECK(*a->device() == "");  // a wildcard listener
    for (const char* same : {"::", "0::0", "0:0:0:0:0:0:0:0"}) {
      INFO("address " << same);
      auto b = Endpoint::listen_shared(peer, same, "7471");
      INFO((b ? std::string() : b.error().message()));
      REQUIRE(b);  // before: "::0" was keyed by device fake0, "::" got EADDRINUSE
      CHECK(*b->fd() == *a->fd());
      CHECK(*a->share_count() == 2);
    }
    CHECK(fake.alive("cm_id") == 1);
    auto back = Endpoint::listen_shared(peer, "::0", "7471");
    REQUIRE(back);
    CHECK(*back->fd() == *a->fd());
  }
  fake.expect_clean();
}

TEST_CASE("issue 8.7: a Peer on a device the wildcard listener does not serve joins it",
          "[listen_shared][issue8]") {
  fake::FakeProvider fake;
  {
    Peer peer0 = open_peer(fake, 0);
    Peer peer1 = open_peer(fake, 1);
    auto a = Endpoint::listen_shared(peer0, "", "7471");
    REQUIRE(a);
    auto b = Endpoint::listen_shared(peer1, "::", "7471");  // "" is "::"
    REQUIRE(b);
    CHECK(*b->fd() == *a->fd());
    CHECK(*a->share_count() == 2);
    // A request on fake1 is served with peer1 (before: rejected, "no peer" for fake1) ...
    fake.inject_connect_request(*a->fd(), {1, "on fake1", "169.254.78.20", 40001});
    auto on1 = a->try_next_conn_req();
    INFO((on1 ? std::string() : on1.error().message()));
    REQUIRE(on1);
    CHECK(fake.qp_pd.at(*on1->qp_num()) == *peer1.pd());
    // ... and one on fake0 with peer0, whichever handle takes it.
    fake.inject_connect_request(*a->fd(), {0, "on fake0", "169.254.77.20", 40002});
    auto on0 = b->try_next_conn_req();
    REQUIRE(on0);
    CHECK(fake.qp_pd.at(*on0->qp_num()) == *peer0.pd());
    // peer1 again: already served, shares.
    auto c = Endpoint::listen_shared(peer1, "", "7471");
    REQUIRE(c);
    CHECK(*c->share_count() == 3);
  }
  fake.expect_clean();
}

TEST_CASE("issue 8.7: a Peer the shared listener cannot serve is inval, naming why",
          "[listen_shared][issue8][inval]") {
  fake::FakeProvider fake;
  {
    Peer peer0 = open_peer(fake, 0);
    Peer other0 = open_peer(fake, 0);  // same device, another protection domain
    Peer peer1 = open_peer(fake, 1);
    auto wildcard = Endpoint::listen_shared(peer0, "", "7471");
    REQUIRE(wildcard);
    auto specific = Endpoint::listen_shared(peer0, "169.254.77.1", "7472");
    REQUIRE(specific);
    const auto mark = fake.mark();
    // before: the listener was returned and other0 silently ignored
    auto same_device = Endpoint::listen_shared(other0, "", "7471");
    REQUIRE_FALSE(same_device);
    check_inval(same_device.error(), "Endpoint::listen_shared",
                "serves device fake0 with another Peer");
    auto same_device_specific = Endpoint::listen_shared(other0, "169.254.77.1", "7472");
    REQUIRE_FALSE(same_device_specific);
    check_inval(same_device_specific.error(), "Endpoint::listen_shared",
                "serves device fake0 with another Peer");
    // before: inval from listening anew ("belongs to device fake0"), not from the listener
    auto other_device = Endpoint::listen_shared(peer1, "169.254.77.1", "7472");
    REQUIRE_FALSE(other_device);
    check_inval(other_device.error(), "Endpoint::listen_shared",
                "169.254.77.1 port 7472 is bound to device fake0; the peer is on fake1");
    CHECK(fake.calls_since(mark).empty());
    CHECK(*wildcard->share_count() == 1);
    CHECK(*specific->share_count() == 1);
    // A request on fake0 is still served with peer0.
    fake.inject_connect_request(*wildcard->fd(), {0, "", "169.254.77.20", 40001});
    auto req = wildcard->try_next_conn_req();
    REQUIRE(req);
    CHECK(fake.qp_pd.at(*req->qp_num()) == *peer0.pd());
  }
  fake.expect_clean();
}

// ---- issue 8.5: the registry outlives every Endpoint

namespace {
// The child process of the test below: a provider and an Endpoint that live until exit.
fake::FakeProvider* exit_fake = nullptr;
std::optional<Endpoint> exit_endpoint;  // constructed before the registry exists
}  // namespace

TEST_CASE("issue 8.5: an Endpoint from listen_shared held in a global is released at exit",
          "[listen_shared][issue8]") {
  std::fflush(nullptr);  // the child must not print the parent's buffered output again
  const pid_t child = fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    exit_fake = new fake::FakeProvider;  // never destroyed: the Endpoint needs it at exit
    auto peer = Peer::open(exit_fake->context(0));
    if (!peer) _exit(3);
    auto ep = Endpoint::listen_shared(*peer, "169.254.77.1", "7471");
    if (!ep) _exit(4);
    exit_endpoint.emplace(std::move(*ep));
    std::exit(0);  // static destructors run: the registry is used by ~Endpoint after them
  }
  int status = 0;
  REQUIRE(waitpid(child, &status, 0) == child);
  // before: AddressSanitizer reported a heap-use-after-free in release_listener (exit 1)
  REQUIRE(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 0);
}

// ---- issue 8.4: the last handle, with threads (the fake is thread-safe; Catch2 is not:
// threads record, the main thread asserts)

namespace {
long count_calls(const std::vector<std::string>& log, const std::string& call) {
  return static_cast<long>(std::count(log.begin(), log.end(), call));
}
}  // namespace

// THREAD_SAFETY.md, Endpoint: "listen, listen_shared and shutdown (and destruction) may be
// called concurrently: the registry of shared listeners is protected by a mutex".
TEST_CASE("issue 8.4: listen_shared and shutdown from 2 and 16 threads on one port",
          "[listen_shared][issue8][threads]") {
  fake::FakeProvider fake;
  {
    Peer peer = open_peer(fake);
    std::mutex mutex;
    std::vector<std::string> problems;
    std::atomic<int> listened{0};
    // 2 threads let the handle count drop to zero often (the old race: a listen_shared
    // between the unlock and stop() got EADDRINUSE); 16 threads contend for the lock.
    for (const auto& [threads, rounds] : {std::pair{2, 10000}, std::pair{16, 1000}}) {
      std::latch start(threads);
      std::vector<std::thread> pool;
      for (int t = 0; t < threads; ++t)
        pool.emplace_back([&, t, rounds = rounds] {
          start.arrive_and_wait();
          for (int i = 0; i < rounds; ++i) {
            auto ep = Endpoint::listen_shared(peer, "169.254.77.1", "7471");
            if (!ep) {
              std::lock_guard lock(mutex);
              problems.push_back("listen_shared: " + ep.error().message());
              continue;
            }
            ++listened;
            if (t % 2 == 0) {
              if (auto done = std::move(*ep).shutdown(); !done) {
                std::lock_guard lock(mutex);
                problems.push_back("shutdown: " + done.error().message());
              }
            }  // odd threads: the destructor releases the handle
          }
        });
      for (auto& th : pool) th.join();
    }
    INFO((problems.empty() ? std::string() : problems.front()));
    CHECK(problems.size() == 0);  // before: EADDRINUSE from rdma_bind_addr
    CHECK(listened == 2 * 10000 + 16 * 1000);
    // Every listener was stopped, exactly once, and the registry kept no entry.
    const auto log = fake.calls();
    CHECK(count_calls(log, "rdma_listen") == count_calls(log, "rdma_destroy_id"));
    CHECK(fake.alive("cm_id") == 0);
    auto& registry = rpmapp::detail::listener_registry();
    std::lock_guard lock(registry.mutex);
    CHECK(registry.listeners.empty());
  }
  fake.expect_clean();
}

TEST_CASE("issue 8.4: of two handles released at once, one stops the listener and reports "
          "its teardown error",
          "[listen_shared][issue8][threads]") {
  fake::FakeProvider fake;
  {
    Peer peer = open_peer(fake);
    constexpr int rounds = 2000;
    std::vector<int> errors(rounds, 0), wrong(rounds, 0);
    for (int r = 0; r < rounds; ++r) {
      auto a = Endpoint::listen_shared(peer, "169.254.77.1", "7471");
      auto b = Endpoint::listen_shared(peer, "169.254.77.1", "7471");
      REQUIRE(a);
      REQUIRE(b);
      fake.fail("rdma_destroy_id", kErr);  // the listening id's
      std::latch start(2);
      std::atomic<int> failed{0}, other{0};
      auto release = [&](Endpoint& ep) {
        start.arrive_and_wait();
        auto done = std::move(ep).shutdown();
        if (done) return;
        if (done.error().call() == "rdma_destroy_id" && done.error().sys_errno() == kErr)
          ++failed;
        else
          ++other;
      };
      std::thread one(release, std::ref(*a)), two(release, std::ref(*b));
      one.join();
      two.join();
      errors[static_cast<std::size_t>(r)] = failed;  // before: sometimes 0 (lost)
      wrong[static_cast<std::size_t>(r)] = other;
    }
    CHECK(std::count(errors.begin(), errors.end(), 1) == rounds);
    CHECK(std::count(wrong.begin(), wrong.end(), 0) == rounds);
    CHECK(fake.alive("cm_id") == 0);
  }
  fake.expect_clean();
}

}  // namespace listen_shared_test
