// docs/THREAD_SAFETY.md, the sentences the fake provider can prove, most with threads. Built
// with ThreadSanitizer in tools/check, where a data race fails the run. Catch2 v2
// assertions are not thread-safe: threads record results, the main thread asserts.
#include "data_util.hpp"

#include <atomic>
#include <latch>
#include <algorithm>
#include <optional>
#include <set>
#include <string>
#include <system_error>
#include <thread>
#include <vector>

namespace threads_test {

using namespace test;

namespace {
constexpr int kThreads = 8;

// Runs body(t) in kThreads threads started together; joins them.
template <class Body> void in_threads(Body body) {
  std::latch start(kThreads);
  std::vector<std::thread> pool;
  for (int t = 0; t < kThreads; ++t)
    pool.emplace_back([&, t] {
      start.arrive_and_wait();
      body(t);
    });
  for (auto& th : pool) th.join();
}
}  // namespace

// THREAD_SAFETY.md, Error: "one object may be read from several threads at once.
// to_string, rpmapp_category() and make_error_code are thread-safe."
TEST_CASE("threads: one Error read from 8 threads; errc texts and category", "[threads][error]") {
  const Error shared(errc::provider, EADDRINUSE, "rdma_listen", "port 7471");
  const std::string want = shared.message();
  std::vector<int> bad(kThreads, 0);
  in_threads([&](int t) {
    for (int i = 0; i < 200; ++i) {
      if (shared.message() != want || shared.code() != errc::provider ||
          shared.sys_errno() != EADDRINUSE || shared.call() != "rdma_listen" ||
          shared.reason() != "port 7471")
        ++bad[static_cast<std::size_t>(t)];
      Error copy = shared;  // copying reads too
      if (!(copy == shared)) ++bad[static_cast<std::size_t>(t)];
      for (int v = -100009; v <= -100000; ++v) {
        const auto code = static_cast<errc>(v);
        std::error_code ec = make_error_code(code);
        if (&ec.category() != &rpmapp_category() || ec.message() != to_string(code) ||
            std::string(rpmapp_category().name()).empty())
          ++bad[static_cast<std::size_t>(t)];
      }
    }
  });
  for (int t = 0; t < kThreads; ++t) CHECK(bad[static_cast<std::size_t>(t)] == 0);
}

// Issue 8.7 with threads: a Peer joining a wildcard listener (listen_shared) while another
// thread takes requests from a handle of it: ListenerState::peers is read and written
// under its mutex (ThreadSanitizer reports the race otherwise).
TEST_CASE("threads: a Peer joins a shared listener while another thread takes requests",
          "[threads][listen_shared]") {
  fake::FakeProvider fake;
  {
    Peer peer0 = open_peer(fake, 0);
    Peer peer1 = open_peer(fake, 1);
    auto a = Endpoint::listen_shared(peer0, "", "7471");
    REQUIRE(a);
    constexpr int requests = 200;
    for (int i = 0; i < requests; ++i)
      fake.inject_connect_request(*a->fd(), {0, "", "169.254.77.20", 40000});
    std::latch start(2);
    std::vector<std::string> problems;  // the taker's
    int taken = 0;
    std::thread taker([&] {
      start.arrive_and_wait();
      while (taken < requests) {
        auto req = a->try_next_conn_req();
        if (!req) {
          problems.push_back(req.error().message());
          break;
        }
        ++taken;
      }
    });
    start.arrive_and_wait();
    auto b = Endpoint::listen_shared(peer1, "", "7471");  // joins while requests are taken
    taker.join();
    REQUIRE(b);
    INFO((problems.empty() ? std::string() : problems.front()));
    CHECK(problems.empty());
    CHECK(taken == requests);
    fake.inject_connect_request(*b->fd(), {1, "", "169.254.78.20", 40001});
    auto on1 = b->try_next_conn_req();
    REQUIRE(on1);
    CHECK(fake.qp_pd.at(*on1->qp_num()) == *peer1.pd());
  }
  fake.expect_clean();
}

// THREAD_SAFETY.md, ConnConfig and ListenOptions: "copied by the calls they are given to:
// they may be changed or destroyed as soon as the call returns".
TEST_CASE("threads: ConnConfig and ListenOptions may go as soon as the call returns",
          "[threads][config]") {
  fake::FakeProvider fake;
  {
    Peer peer = open_peer(fake);
    auto options = std::make_optional<ListenOptions>();
    options->backlog = 17;
    auto ep = Endpoint::listen(peer, "169.254.77.1", "7471", *options);
    REQUIRE(ep);
    options.reset();
    CHECK(fake.backlogs.back() == 17);

    auto config = std::make_optional<ConnConfig>();
    config->retry_count = 5;
    config->rnr_retry_count = 4;
    config->sq_size = 12;
    auto req = ConnReq::to(peer, "169.254.77.9", "7471", *config);
    REQUIRE(req);
    config->retry_count = 1;  // changed, then destroyed: the request kept its copy
    config.reset();
    auto conn = std::move(*req).connect();
    REQUIRE(conn);
    CHECK(fake.last_conn_param.retry_count == 5);
    CHECK(fake.last_conn_param.rnr_retry_count == 4);
    CHECK(fake.last_qp_attr.cap.max_send_wr == 12);
  }
  fake.expect_clean();
}

// THREAD_SAFETY.md, data path: "a const MrLocal / MrRemote may be used from several
// threads at once" (each thread with its own Conn and Cq: one thread at a time per Conn),
// "Srq::recv may be called from several threads at once", MrLocal::reg concurrently.
TEST_CASE("threads: Conns in 8 threads share one MrLocal and one MrRemote; 8 threads post to one Srq",
          "[threads][data]") {
  fake::FakeProvider fake;
  {
    Peer peer = open_peer(fake);
    Buffer memory(kThreads * 64);
    const MrLocal local = reg(peer, memory, MrUsage::write_src | MrUsage::read_dst | MrUsage::recv);
    const MrRemote remote = test::remote(0x10000, kThreads * 64, 0x77, MrUsage::write_dst | MrUsage::read_src);
    std::vector<Conn> conns;
    for (int t = 0; t < kThreads; ++t) conns.push_back(connected(fake, peer));
    constexpr int rounds = 20;
    std::vector<int> bad(kThreads, 0);
    in_threads([&](int t) {
      Conn& conn = conns[t];
      auto cq = conn.cq();
      if (!cq) {
        ++bad[t];
        return;
      }
      const std::size_t off = static_cast<std::size_t>(t) * 64;
      for (int i = 0; i < rounds; ++i) {
        const std::uint64_t id = static_cast<std::uint64_t>(t) * 1000 + i;
        auto posted = i % 2 == 0 ? conn.write(remote, off, local, off, 64, Completion::always, id)
                                 : conn.read(local, off, remote, off, 64, Completion::always, id);
        if (!posted || fake.complete_sends(*conn.qp()) != 1) {
          ++bad[t];
          continue;
        }
        ibv_wc wc{};
        auto got = cq->next_for({&wc, 1}, std::chrono::seconds(1));
        if (!got || wc.wr_id != id || wc.status != IBV_WC_SUCCESS) ++bad[t];
      }
      // Registering on the shared Peer from every thread at once.
      Buffer own(256);
      auto mr = MrLocal::reg(peer, own.data(), own.size, MrUsage::send);
      if (!mr || !std::move(*mr).dereg()) ++bad[t];
    });
    for (int t = 0; t < kThreads; ++t) CHECK(bad[t] == 0);

    auto srq = Srq::create(peer, SrqConfig{kThreads * rounds, 0});
    REQUIRE(srq);
    std::fill(bad.begin(), bad.end(), 0);
    const std::size_t before = fake.posted().size();
    in_threads([&](int t) {
      for (int i = 0; i < rounds; ++i)
        if (!srq->recv(local, static_cast<std::size_t>(t) * 64, 64, static_cast<std::uint64_t>(t) * 1000 + i))
          ++bad[t];
    });
    for (int t = 0; t < kThreads; ++t) CHECK(bad[t] == 0);
    std::set<std::uint64_t> ids;
    const auto posted = fake.posted();
    for (std::size_t i = before; i < posted.size(); ++i)
      if (posted[i].queue == fake::PostedWr::Queue::srq) ids.insert(posted[i].wr_id);
    CHECK(ids.size() == static_cast<std::size_t>(kThreads * rounds));
    for (auto& conn : conns) REQUIRE(std::move(conn).close());
    REQUIRE(std::move(*srq).close());
  }
  fake.expect_clean();
}

TEST_CASE("threads: a SharedCq read on one thread while connections on it are made, used and released on "
          "another; every tag names the connection that sent", "[threads][shared-cq]") {
  fake::FakeProvider fake;
  {
    Peer peer = open_peer(fake);
    SharedCq shared = *SharedCq::create(peer);
    ConnConfig cfg;
    cfg.shared_cq = &shared;
    Buffer buf(64);
    MrLocal mr = reg(peer, buf, MrUsage::send);
    constexpr std::uint64_t rounds = 40;
    std::vector<ConnId> sender(rounds);  // written before the send whose wr_id indexes it
    std::atomic<bool> stop{false};
    std::vector<std::pair<std::uint64_t, ConnId>> read;
    std::thread reader([&] {
      Cq cq = *shared.cq();
      std::array<ibv_wc, 4> wcs;
      std::array<ConnId, 4> tags;
      for (;;) {
        const bool last = stop.load();
        auto got = cq.get(wcs, tags);
        if (got)
          for (std::size_t i = 0; i < got->size(); ++i) read.emplace_back(wcs[i].wr_id, tags[i]);
        else if (last)
          return;
      }
    });
    for (std::uint64_t i = 0; i < rounds; ++i) {
      Conn conn = connected(fake, peer, cfg);
      sender[i] = *conn.id();
      REQUIRE(conn.send(mr, 0, 8, Completion::always, i));
      REQUIRE(fake.complete_sends(*conn.qp()) == 1);
      REQUIRE(std::move(conn).close());
    }
    stop = true;
    reader.join();
    // Whatever the reader took before a release is tagged with its sender; the rest was dropped.
    CHECK(read.size() <= rounds);
    for (const auto& [wr_id, tag] : read) {
      REQUIRE(wr_id < rounds);
      CHECK(tag == sender[wr_id]);
    }
    CHECK(*shared.connections() == 0);
  }
  fake.expect_clean();
}

// THREAD_SAFETY.md, SharedEventChannel: "connections on the channel may be made, waited on
// and released on any threads at once".
TEST_CASE("threads: 8 threads wait on their own connections of one SharedEventChannel; each gets its own "
          "events, whichever thread reads them", "[threads][shared-events]") {
  fake::FakeProvider fake;
  {
    Peer peer = open_peer(fake);
    SharedEventChannel channel = *SharedEventChannel::create();
    ConnConfig cfg;
    cfg.shared_event_channel = &channel;
    std::vector<Conn> conns;
    for (int t = 0; t < kThreads; ++t) conns.push_back(connected(fake, peer, cfg));
    std::vector<std::string> got(kThreads);
    std::atomic<int> waiting{0};
    std::thread injector([&] {
      while (waiting.load() < kThreads) std::this_thread::yield();
      for (int t = kThreads - 1; t >= 0; --t) {  // in reverse: most are read by another thread
        fake.inject_event_on_qp(*conns[t].qp_num(), RDMA_CM_EVENT_DISCONNECTED);
        std::this_thread::sleep_for(std::chrono::milliseconds(2));
      }
    });
    in_threads([&](int t) {
      ++waiting;
      auto event = conns[t].next_event_for(std::chrono::milliseconds(5000));
      got[t] = event ? std::string(to_string(*event)) : event.error().message();
      if (event) (void)std::move(conns[t]).close();  // released while others still wait
    });
    injector.join();
    for (int t = 0; t < kThreads; ++t) CHECK(got[t] == "closed");
    CHECK(*channel.connections() == 0);
  }
  fake.expect_clean();
}

}  // namespace threads_test
