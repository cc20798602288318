// docs/THREAD_SAFETY.md, the sentences the fake provider can prove, most with threads. Built
// with ThreadSanitizer in tools/check, where a data race fails the run. Catch2 v2
// assertions are not thread-safe: threads record results, the main thread asserts.
#include "test_util.hpp"

#include <latch>
#include <optional>
#include <string>
#include <system_error>
#include <thread>
#include <vector>

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
