// docs/THREAD_SAFETY.md, the sentences the fake provider can prove, with threads. Built
// with ThreadSanitizer in tools/check, where a data race fails the run. Catch2 v2
// assertions are not thread-safe: threads record results, the main thread asserts.
#include "test_util.hpp"

#include <latch>
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
