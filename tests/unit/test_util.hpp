// Helpers shared by the unit tests.
#pragma once

#include "fake_provider.hpp"

#include <rpmapp/rpmapp.hpp>

#include "catch2_compat.hpp"

#include <array>
#include <cerrno>
#include <chrono>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace test {

using namespace rpmapp;

/// The errno the tests inject: not one the fake or the library produce on their own.
inline constexpr int kErr = ENOTRECOVERABLE;

inline std::string str(std::string_view s) { return std::string(s); }

/// Runs `f` and returns how long it took.
template <class F> std::chrono::steady_clock::duration timed(F&& f) {
  const auto start = std::chrono::steady_clock::now();
  f();
  return std::chrono::steady_clock::now() - start;
}

/// Runs `fn` on another thread after `delay`; joins on destruction.
class Later {
 public:
  template <class F>
  Later(std::chrono::milliseconds delay, F fn)
      : thread_([delay, fn = std::move(fn)]() mutable {
          std::this_thread::sleep_for(delay);
          fn();
        }) {}
  ~Later() { thread_.join(); }
  Later(const Later&) = delete;
  Later& operator=(const Later&) = delete;

 private:
  std::thread thread_;
};

inline Peer open_peer(fake::FakeProvider& fake, int device = 0) {
  auto peer = Peer::open(fake.context(device));
  REQUIRE(peer);
  return std::move(*peer);
}

inline Endpoint listen_on(const Peer& peer, std::string_view addr, std::string_view port = "7471") {
  auto ep = Endpoint::listen(peer, addr, port);
  INFO((ep ? std::string() : ep.error().message()));
  REQUIRE(ep);
  return std::move(*ep);
}

/// A Peer on each of the fake's first two devices, for a wildcard listener.
inline std::vector<Peer> peers_on_both_devices(fake::FakeProvider& fake) {
  std::vector<Peer> peers;
  peers.push_back(open_peer(fake, 0));
  peers.push_back(open_peer(fake, 1));
  return peers;
}

/// A wildcard listener with one Peer per device.
inline Endpoint listen_wildcard(std::span<const Peer> peers, std::string_view port = "7471") {
  auto ep = Endpoint::listen(peers, "", port);
  INFO((ep ? std::string() : ep.error().message()));
  REQUIRE(ep);
  return std::move(*ep);
}

/// Injects a request and takes it (non-blocking variant is used only through the fake's poll).
inline ConnReq take_request(fake::FakeProvider& fake, Endpoint& ep, fake::Request req = {},
                            const ConnConfig& cfg = {}) {
  fake.inject_connect_request(*ep.fd(), req);
  auto r = ep.next_conn_req(cfg);
  INFO((r ? std::string() : r.error().message()));
  REQUIRE(r);
  return std::move(*r);
}

inline ConnReq outgoing(const Peer& peer, std::string_view addr = "169.254.77.9",
                        const ConnConfig& cfg = {}) {
  auto r = ConnReq::to(peer, addr, "7471", cfg);
  INFO((r ? std::string() : r.error().message()));
  REQUIRE(r);
  return std::move(*r);
}

/// An outgoing request connected with `private_data`: rdma_connect made, no event yet.
inline Conn connect_out(const Peer& peer, std::string_view private_data = {}) {
  auto conn = outgoing(peer).connect(as_bytes(private_data));
  INFO((conn ? std::string() : conn.error().message()));
  REQUIRE(conn);
  return std::move(*conn);
}

/// ConnReq::to's provider calls, in order, with the default ConnConfig (the blocking form).
inline const std::vector<std::string> conn_req_to_calls = {
    "rdma_create_event_channel", "fcntl",
    "rdma_create_id",
    "rdma_resolve_addr",  "poll",
    "rdma_get_cm_event",  "rdma_resolve_route",        "rdma_ack_cm_event",
    "poll",               "rdma_get_cm_event",         "ibv_create_comp_channel",
    "ibv_create_cq",      "ibv_req_notify_cq",         "rdma_create_qp",
    "rdma_ack_cm_event"};

/// Endpoint::next_conn_req's provider calls, in order, with the default ConnConfig.
inline const std::vector<std::string> next_conn_req_calls = {
    "poll",           "rdma_get_cm_event",         "ibv_create_comp_channel",
    "ibv_create_cq",  "ibv_req_notify_cq",         "rdma_create_qp",
    "rdma_ack_cm_event", "rdma_create_event_channel", "fcntl",
    "rdma_migrate_id"};

/// The provider calls that release a connection's resources, in order: its queue pair, its
/// CQ (and its own receive CQ), their completion channels, its cm_id and event channel.
inline std::vector<std::string> teardown_calls(bool own_rcq) {
  std::vector<std::string> calls = {"ibv_destroy_qp", "ibv_destroy_cq"};
  if (own_rcq) calls.push_back("ibv_destroy_cq");
  calls.push_back("ibv_destroy_comp_channel");
  if (own_rcq) calls.push_back("ibv_destroy_comp_channel");  // the receive CQ's own channel
  calls.insert(calls.end(), {"rdma_destroy_id", "rdma_destroy_event_channel"});
  return calls;
}

/// The errc a provider failure with `err` in `call` must become.
inline errc expected_errc(const std::string& call, int err) {
  if (err == ENOMEM) return errc::nomem;
  if (call == "rdma_get_cm_event" && (err == EAGAIN || err == EWOULDBLOCK || err == ENODATA))
    return errc::no_event;
  return errc::provider;
}

/// Checks that `e` reports the injected failure of `call` with `err`.
inline void check_injected(const Error& e, const std::string& call, int err) {
  INFO("error: " << e.message());
  CHECK(e.code() == expected_errc(call, err));
  CHECK(e.sys_errno() == err);
  CHECK(str(e.call()) == call);
  // the rpmapp function it came from leads the message
  CHECK(str(e.operation()).find("::") != std::string::npos);
  CHECK_THAT(e.message(), Catch::StartsWith(str(e.operation()) + ": " + call + ": "));
}

/// Checks an inval Error from `call` whose reason mentions `words`.
inline void check_inval(const Error& e, std::string_view call, std::string_view words = {}) {
  INFO("error: " << e.message());
  CHECK(e.code() == errc::inval);
  CHECK(e.sys_errno() == 0);
  CHECK(e.call() == call);
  // the rpmapp function called: the call itself, or the one that ran it (said first)
  if (e.operation() != call) {
    CHECK(str(e.operation()).find("::") != std::string::npos);
    CHECK_THAT(e.message(), Catch::StartsWith(str(e.operation()) + ": " + std::string(call) + ": "));
  }
  if (!words.empty()) CHECK_THAT(e.message(), Catch::Contains(std::string(words)));
}

/// A 0xAB-poisoned buffer, to prove an out-param was not written.
struct Poisoned {
  std::array<std::byte, 256> bytes;
  Poisoned() { bytes.fill(std::byte{0xAB}); }
  std::span<std::byte> span() { return bytes; }
  bool untouched() const {
    for (auto b : bytes)
      if (b != std::byte{0xAB}) return false;
    return true;
  }
};

/// The failure a "fail each call in turn" run injects.
struct Injected {
  std::string call;
  int nth;
  int err;
};

/// Marks where the operation under test starts and ends within a scenario.
class Probe {
 public:
  Probe(fake::FakeProvider& fake, std::optional<Injected> inject)
      : fake_(fake), inject_(std::move(inject)) {}
  /// Call right before the operation under test.
  void begin() {
    begin_ = fake_.mark();
    if (inject_) fake_.fail(inject_->call, inject_->err, inject_->nth);
  }
  /// Call right after it.
  void end() {
    end_ = fake_.mark();
    if (inject_) CHECK(fake_.pending_faults() == 0);  // the injected call was made
  }
  const std::optional<Injected>& injected() const { return inject_; }
  bool failing() const { return inject_.has_value(); }
  std::vector<std::string> calls() const {
    auto all = fake_.calls();
    return {all.begin() + static_cast<std::ptrdiff_t>(begin_),
            all.begin() + static_cast<std::ptrdiff_t>(end_)};
  }
  /// Checks `e` against the injected failure.
  void check(const Error& e) const { check_injected(e, inject_->call, inject_->err); }
  /// Checks the operation's `result`: success when nothing was injected, else the injected
  /// failure. Returns whether it failed (the scenario may check more then).
  template <class T> bool check_outcome(const expected<T>& result) const {
    if (!failing()) {
      CHECK(result);
      return false;
    }
    REQUIRE_FALSE(result);
    check(result.error());
    return true;
  }

 private:
  fake::FakeProvider& fake_;
  std::optional<Injected> inject_;
  std::size_t begin_ = 0, end_ = 0;
};

/// Runs `scenario(fake, probe)` once without failures to learn the provider calls the
/// operation makes (between probe.begin() and probe.end()), checks they are `expected`,
/// then once per call, failing it with `err`. Each run must leave the fake clean once the
/// scenario's objects are gone (after a failed ibv_destroy_qp: once the contexts close).
/// The scenario checks the outcome (probe.failing()).
template <class Scenario>
void fail_each_call(const std::vector<std::string>& expected, int err, Scenario scenario) {
  std::vector<std::string> log;
  {
    fake::FakeProvider fake;
    Probe probe(fake, std::nullopt);
    scenario(fake, probe);
    log = probe.calls();
    fake.expect_clean();
  }
  CHECK(log == expected);
  auto steps = fake::failable_calls(log);
  REQUIRE(!steps.empty());
  for (auto& [call, nth] : steps) {
    INFO("failing call " << call << " #" << nth << " with errno " << err);
    fake::FakeProvider fake;
    Probe probe(fake, Injected{call, nth, err});
    scenario(fake, probe);
    // a queue pair the kernel would not destroy keeps what it holds until the contexts close
    if (call == "ibv_destroy_qp") fake.close_contexts();
    fake.expect_clean();
  }
}

}  // namespace test
