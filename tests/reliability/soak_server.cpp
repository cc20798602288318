// soak_server ADDR PORT BACKLOG: the soak's long-lived server (tools/soak, soak_driver).
// One thread, one rpmapp::EventLoop. Per connection: checks the request's private data
// (garbage is rejected), takes a free slot of its region (none free: rejected), posts a
// receive, accepts with the slot's offset and the region's descriptor; the client writes
// its slot (RDMA WRITE), reads it back (RDMA READ) and sends a check message (length and
// hash), which the server verifies against its slot and answers. A connection that has not
// finished within idle_bound is disconnected by the server (a client that never speaks).
// SIGUSR1: shut the endpoint down and listen again on the same port. SIGTERM: print the
// counters and exit 0.
// Prints "listening on ADDR port PORT" when ready, "relistened" after each SIGUSR1,
// "ERROR KIND: message" for anything a healthy server must never meet, and at exit
// "final NAME=COUNT ...". Exit status 0 unless setting up failed.
#include "ledger.hpp"
#include "soak_common.hpp"

#include <rpmapp/rpmapp.hpp>

#include <fmt/core.h>

#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <map>
#include <string>
#include <thread>
#include <vector>

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

namespace {

// Under software RoCE in an emulated VM a healthy client finishes a cycle in well under a
// second; one that has not within this bound is dropped.
constexpr auto idle_bound = 10s;
// A connection still present this long after its drop is a leak in the making.
constexpr auto stale_bound = 60s;

volatile std::sig_atomic_t relisten_requested = 0;
volatile std::sig_atomic_t stop_requested = 0;

struct Connection {
  Connection(rpmapp::Conn c, std::size_t s) : conn(std::move(c)), slot(s) {}
  rpmapp::Conn conn;
  rpmapp::Registration events, completions;
  std::size_t slot;
  Clock::time_point since = Clock::now();
  bool established = false, answered = false, reply_done = false, dropped = false;
};

std::map<std::string, long> counters;
void count(const std::string& what) { ++counters[what]; }

void error(const std::string& kind, const std::string& message) {
  ++counters["error_" + kind];
  fmt::print("ERROR {}: {}\n", kind, message);
  std::fflush(stdout);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 4) {
    fmt::print(stderr, "usage: soak_server ADDR PORT BACKLOG\n");
    return 2;
  }
  const std::string addr = argv[1], port = argv[2];
  const int backlog = std::atoi(argv[3]);
  std::signal(SIGUSR1, [](int) { relisten_requested = 1; });
  std::signal(SIGTERM, [](int) { stop_requested = 1; });
  std::signal(SIGPIPE, SIG_IGN);

  reliability::open_librdmacm_devices();  // kept for the process's life: part of the baseline
  auto peer = rpmapp::Peer::from_address(addr, rpmapp::AddressKind::local);
  if (!peer) return fmt::print(stderr, "error: {}\n", peer.error().message()), 1;
  std::vector<std::byte> memory(soak::slots * soak::slot_stride);
  auto mr = rpmapp::MrLocal::reg(*peer, memory, rpmapp::MrUsage::write_dst | rpmapp::MrUsage::read_src |
                                                    rpmapp::MrUsage::send | rpmapp::MrUsage::recv);
  if (!mr) return fmt::print(stderr, "error: {}\n", mr.error().message()), 1;
  auto descriptor = mr->descriptor();
  if (!descriptor) return fmt::print(stderr, "error: {}\n", descriptor.error().message()), 1;
  auto loop = rpmapp::EventLoop::create();
  if (!loop) return fmt::print(stderr, "error: {}\n", loop.error().message()), 1;

  std::map<std::uint64_t, Connection> open;  // by connection number
  std::vector<bool> slot_used(soak::slots, false);
  std::uint64_t next_number = 1;

  auto drop = [&](std::uint64_t number) {
    auto it = open.find(number);
    if (it == open.end()) return;
    slot_used[it->second.slot] = false;
    open.erase(it);  // the Conn and its registrations go, also inside its own handler
  };

  auto on_event = [&](std::uint64_t number, rpmapp::expected<rpmapp::ConnEvent> event) {
    auto it = open.find(number);
    if (it == open.end()) return;
    Connection& c = it->second;
    if (!event) {
      error("conn_event", event.error().message());
      return drop(number);
    }
    switch (*event) {
      case rpmapp::ConnEvent::established:
        c.established = true;
        return;
      case rpmapp::ConnEvent::closed:
        count(c.answered ? "conn_done" : "conn_closed_early");
        return drop(number);
      case rpmapp::ConnEvent::lost:
      case rpmapp::ConnEvent::unreachable:
      case rpmapp::ConnEvent::rejected:
        // A client killed or gone between the request and established, or mid-transfer.
        count(std::string("conn_") + std::string(rpmapp::to_string(*event)));
        return drop(number);
      default:
        error("conn_event", fmt::format("connection {}: unexpected event {}", number, rpmapp::to_string(*event)));
        return drop(number);
    }
  };

  auto on_completions = [&](std::uint64_t number, rpmapp::expected<std::span<const ibv_wc>> batch) {
    auto it = open.find(number);
    if (it == open.end()) return;
    Connection& c = it->second;
    if (!batch) {
      error("completion", batch.error().message());
      return drop(number);
    }
    for (const ibv_wc& wc : *batch) {
      if (wc.status != IBV_WC_SUCCESS) {
        // The peer died or disconnected with work pending: flushed, or the reply's send
        // ran out of retries. Anything else is a bug.
        if (wc.status == IBV_WC_WR_FLUSH_ERR || wc.status == IBV_WC_RETRY_EXC_ERR)
          count(std::string("wc_") + ibv_wc_status_str(wc.status));
        else
          error("wc_status", fmt::format("connection {}: {}", number, ibv_wc_status_str(wc.status)));
        continue;
      }
      if (wc.opcode == IBV_WC_RECV) {
        const std::byte* msg = memory.data() + soak::recv_offset(c.slot);
        const std::span<const std::byte> received(msg, wc.byte_len);
        bool ok = wc.byte_len == soak::check.size() + 12 && soak::starts_with(received, soak::check);
        if (ok) {
          const std::uint32_t len = soak::get_u32(msg + soak::check.size());
          const std::uint64_t want = soak::get_u64(msg + soak::check.size() + 4);
          ok = len <= soak::data_size &&
               soak::hash(std::span(memory).subspan(c.slot * soak::slot_stride, len)) == want;
          if (!ok) error("content", fmt::format("connection {}: slot {} does not hold what the client wrote", number, c.slot));
        } else {
          error("message", fmt::format("connection {}: malformed check message ({} bytes)", number, wc.byte_len));
        }
        const std::string_view answer = ok ? soak::good : soak::bad;
        std::memcpy(memory.data() + soak::send_offset(c.slot), answer.data(), answer.size());
        if (auto sent = c.conn.send(*mr, soak::send_offset(c.slot), answer.size()); !sent) {
          error("send", sent.error().message());
          return drop(number);
        }
        c.answered = true;
      } else if (wc.opcode == IBV_WC_SEND) {
        c.reply_done = true;  // the client disconnects once it has the answer
      } else {
        error("wc_opcode", fmt::format("connection {}: unexpected {}", number, rpmapp::to_string(wc.opcode)));
      }
    }
  };

  auto on_request = [&](rpmapp::expected<rpmapp::ConnReq> req) {
    if (!req) {
      // A request that went away before it could be read (its client died): not a bug.
      count("request_failed");
      return;
    }
    auto data = req->private_data();
    if (!data) return error("private_data", data.error().message());
    if (!soak::starts_with(*data, soak::hello)) return count("rejected_garbage");  // rejected when `req` goes
    std::size_t slot = 0;
    while (slot < soak::slots && slot_used[slot]) ++slot;
    if (slot == soak::slots) return count("rejected_full");
    if (auto ok = req->recv(*mr, soak::recv_offset(slot), soak::message_size); !ok)
      return error("recv", ok.error().message());
    std::array<std::byte, soak::welcome.size() + 4 + rpmapp::mr_descriptor_size> accept_data{};
    std::memcpy(accept_data.data(), soak::welcome.data(), soak::welcome.size());
    soak::put_u32(accept_data.data() + soak::welcome.size(), static_cast<std::uint32_t>(slot * soak::slot_stride));
    std::memcpy(accept_data.data() + soak::welcome.size() + 4, descriptor->data(), descriptor->size());
    auto conn = std::move(*req).connect(accept_data);
    if (!conn) {
      // The client may be gone already (killed mid-connect): the accept fails with the
      // provider's errno. Counted, not an error.
      count("accept_failed");
      return;
    }
    const std::uint64_t number = next_number++;
    Connection& c = open.try_emplace(number, std::move(*conn), slot).first->second;
    slot_used[slot] = true;
    auto events = loop->watch(c.conn, [&, number](rpmapp::expected<rpmapp::ConnEvent> e) { on_event(number, std::move(e)); });
    if (!events) {
      error("watch", events.error().message());
      return drop(number);
    }
    c.events = std::move(*events);
    auto completions = loop->watch_completions(
        c.conn, [&, number](rpmapp::expected<std::span<const ibv_wc>> b) { on_completions(number, b); });
    if (!completions) {
      error("watch", completions.error().message());
      return drop(number);
    }
    c.completions = std::move(*completions);
    count("accepted");
  };

  rpmapp::ListenOptions options;
  options.backlog = backlog;
  std::optional<rpmapp::Endpoint> endpoint;
  rpmapp::Registration serving;
  auto start_listening = [&]() -> bool {
    // Right after a shutdown the port may still be held briefly: retry for up to 10 s.
    for (int attempt = 0; attempt < 100; ++attempt) {
      auto ep = rpmapp::Endpoint::listen(*peer, addr, port, options);
      if (ep) {
        endpoint.emplace(std::move(*ep));
        auto s = loop->serve(*endpoint, on_request);
        if (!s) {
          error("serve", s.error().message());
          return false;
        }
        serving = std::move(*s);
        return true;
      }
      if (attempt == 99) error("listen", ep.error().message());
      std::this_thread::sleep_for(100ms);
    }
    return false;
  };
  if (!start_listening()) return 1;
#if defined(__SANITIZE_ADDRESS__)
  fmt::print("built with AddressSanitizer\n");  // the driver allows for its allocator's growth
#endif
  fmt::print("listening on {} port {}\n", addr, port);
  std::fflush(stdout);

  while (!stop_requested) {
    if (auto ran = loop->run_for(200ms); !ran) {
      error("loop", ran.error().message());
      break;
    }
    if (relisten_requested) {
      relisten_requested = 0;
      serving.reset();
      if (auto ok = std::move(*endpoint).shutdown(); !ok) error("shutdown", ok.error().message());
      endpoint.reset();
      if (!start_listening()) break;
      count("relistened");
      fmt::print("relistened\n");
      std::fflush(stdout);
    }
    // Connections past their bound: disconnect once; drop when stale.
    const auto now = Clock::now();
    std::vector<std::uint64_t> stale;
    for (auto& [number, c] : open) {
      if (!c.dropped && now - c.since > idle_bound) {
        c.dropped = true;
        count("idle_dropped");
        if (c.established)
          if (auto ok = c.conn.disconnect(); !ok) count("idle_disconnect_failed");
      } else if (now - c.since > stale_bound) {
        stale.push_back(number);
      }
    }
    for (auto number : stale) {
      error("stale_conn", fmt::format("connection {} (established {}) still open after {} s", number,
                                      open.at(number).established, stale_bound.count()));
      drop(number);
    }
  }

  fmt::print("final open={}", open.size());
  for (const auto& [name, n] : counters) fmt::print(" {}={}", name, n);
  fmt::print("\n");
  std::fflush(stdout);
  open.clear();
  serving.reset();
  if (endpoint)
    if (auto ok = std::move(*endpoint).shutdown(); !ok) fmt::print(stderr, "error: {}\n", ok.error().message());
  if (auto ok = std::move(*mr).dereg(); !ok) fmt::print(stderr, "error: {}\n", ok.error().message());
  return 0;
}
