// soak_client ADDR PORT MODE SEED [CYCLES]: one client process of the soak (soak_driver).
// MODE:
//   normal  CYCLES cycles of connect / RDMA WRITE of random bytes into its slot of the
//           server's region / RDMA READ back and compare / send the length and hash, which
//           the server checks and answers / disconnect.
//   slow    one cycle that pauses 3 s mid-transfer (the driver kills it there).
//   silent  connects and never speaks: the server must drop it (closed within 30 s).
//   garbage connects with random private data: the server must reject it.
//   abrupt  connects, writes, then disconnects or exits without a word (random).
//   fdlimit normal, under a small RLIMIT_NOFILE (random 5..16): ok, or a failure naming EMFILE.
// Prints "stage connect" / "stage transfer" as it goes (the driver kills on them) and
// ends with one line "RESULT KIND", exit 0; or "ERROR KIND: message", exit 1, for what
// must not happen. A connection rejected or unreachable (the server is full, busy
// re-listening or past its backlog) ends with "RESULT refused"; so does, on iWARP, an
// rdma_connect whose TCP connection is refused (ECONNREFUSED: nothing listens while the
// server re-listens; docs/peer.md, "a port nobody listens on").
#include "soak_common.hpp"

#include <rpmapp/rpmapp.hpp>

#include <fmt/core.h>
#include <sys/resource.h>

#include <array>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <thread>
#include <unistd.h>

using namespace std::chrono_literals;

namespace {

// Every wait is bounded: generous, the emulated VM runs several processes on two vCPUs.
constexpr auto wait_bound = 30s;

std::string mode;

[[noreturn]] void result(std::string_view kind) {
  fmt::print("RESULT {}\n", kind);
  std::fflush(stdout);
  std::_Exit(0);
}

[[noreturn]] void fail(std::string_view kind, const std::string& message) {
  fmt::print("ERROR {}: {}\n", kind, message);
  std::fflush(stdout);
  std::_Exit(1);
}

[[noreturn]] void fail(std::string_view kind, const rpmapp::Error& e) {
  // Under fd pressure running out of fds is the expected outcome, wherever it happens.
  if (mode == "fdlimit" && e.sys_errno() == EMFILE) result("emfile");
  // librdmacm's one-time initialisation (ucma_init) reports any failure, EMFILE included,
  // as EPERM (reading the ABI version) or ENODEV (listing the devices): the fd limit is
  // the only cause here, but the errno cannot name it.
  if (mode == "fdlimit" && kind == "peer" && (e.sys_errno() == EPERM || e.sys_errno() == ENODEV))
    result("emfile_masked");
  fail(kind, e.message());
}

void stage(std::string_view what) {
  fmt::print("stage {}\n", what);
  std::fflush(stdout);
}

// Waits for the next completion and checks its status and opcode.
ibv_wc next_completion(rpmapp::Cq& cq, std::string_view what) {
  ibv_wc wc{};
  auto got = cq.next_for(std::span(&wc, 1), wait_bound);
  if (!got) fail(got.error() == rpmapp::errc::no_completion ? "hang" : "completion", got.error());
  if (auto ok = rpmapp::check(wc); !ok) fail("wc_status", fmt::format("{}: {}", what, ok.error().message()));
  return wc;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 5) {
    fmt::print(stderr, "usage: soak_client ADDR PORT MODE SEED [CYCLES]\n");
    return 2;
  }
  const std::string addr = argv[1], port = argv[2];
  mode = argv[3];
  std::mt19937_64 rng(std::strtoull(argv[4], nullptr, 10));
  const int cycles = argc > 5 ? std::atoi(argv[5]) : 1;

  if (mode == "fdlimit") {
    // One Peer made and dropped with fds to spare first: the sanitizer runtime's first check
    // of a dynamic type needs a pipe and reports a false "invalid vptr" when no fd is left
    // (docs/reliability.md); this fills its cache for the Peer's shared state.
    if (auto warm = rpmapp::Peer::from_address(addr, rpmapp::AddressKind::remote); !warm) fail("peer", warm.error());
    const rlim_t limit = 5 + rng() % 12;
    const rlimit r{limit, limit};
    if (::setrlimit(RLIMIT_NOFILE, &r) != 0) fail("setrlimit", std::string(std::strerror(errno)));
    fmt::print("RLIMIT_NOFILE {}\n", limit);
  }

  auto peer = rpmapp::Peer::from_address(addr, rpmapp::AddressKind::remote);
  if (!peer) fail("peer", peer.error());
  // [0, data_size): what is written; [data_size, 2 data_size): what is read back;
  // then the check message and the answer.
  std::vector<std::byte> memory(2 * soak::data_size + 2 * soak::message_size);
  const std::size_t read_at = soak::data_size, send_at = 2 * soak::data_size,
                    recv_at = send_at + soak::message_size;
  auto mr = rpmapp::MrLocal::reg(*peer, memory, rpmapp::MrUsage::write_src | rpmapp::MrUsage::read_dst |
                                                    rpmapp::MrUsage::send | rpmapp::MrUsage::recv);
  if (!mr) fail("reg", mr.error());

  for (int cycle = 0; cycle < cycles; ++cycle) {
    stage("connect");
    std::array<std::byte, 32> hello{};
    for (auto& b : hello) b = static_cast<std::byte>(rng());
    if (mode != "garbage") std::memcpy(hello.data(), soak::hello.data(), soak::hello.size());
    else hello[0] = std::byte{'X'};  // never the magic
    auto req = rpmapp::ConnReq::to(*peer, addr, port);
    if (!req) fail("resolve", req.error());
    auto conn = std::move(*req).connect(hello);
    if (!conn && conn.error().call() == "rdma_connect" && conn.error().sys_errno() == ECONNREFUSED) result("refused");
    if (!conn) fail("connect", conn.error());
    auto event = conn->next_event_for(wait_bound);
    if (!event) fail(event.error() == rpmapp::errc::no_event ? "hang" : "conn_event", event.error());
    if (*event == rpmapp::ConnEvent::rejected || *event == rpmapp::ConnEvent::unreachable) {
      if (mode == "garbage") result("rejected_garbage");
      result("refused");
    }
    if (*event != rpmapp::ConnEvent::established)
      fail("conn_event", fmt::format("connect: {}", rpmapp::to_string(*event)));
    if (mode == "garbage") fail("garbage_accepted", "the server accepted garbage private data");

    if (mode == "silent") {
      // Never speaks: the server must disconnect it.
      auto closed = conn->next_event_for(wait_bound);
      if (!closed) fail(closed.error() == rpmapp::errc::no_event ? "hang" : "conn_event", closed.error());
      if (*closed != rpmapp::ConnEvent::closed)
        fail("conn_event", fmt::format("silent: {}", rpmapp::to_string(*closed)));
      if (auto ok = std::move(*conn).close(); !ok) fail("close", ok.error());
      result("dropped");
    }

    stage("transfer");
    auto data = conn->private_data();
    if (!data) fail("private_data", data.error());
    const std::size_t head = soak::welcome.size() + 4;
    if (!soak::starts_with(*data, soak::welcome) || data->size() < head + rpmapp::mr_descriptor_size)
      fail("welcome", "malformed accept data");
    const std::uint32_t offset = soak::get_u32(data->data() + soak::welcome.size());
    auto region = rpmapp::MrRemote::from_descriptor(data->subspan(head, rpmapp::mr_descriptor_size));
    if (!region) fail("descriptor", region.error());
    auto cq = conn->cq();
    if (!cq) fail("cq", cq.error());

    const std::size_t len = 1 + rng() % soak::data_size;
    for (std::size_t i = 0; i < len; ++i) memory[i] = static_cast<std::byte>(rng());
    if (auto ok = conn->recv(*mr, recv_at, soak::message_size); !ok) fail("recv", ok.error());
    if (auto ok = conn->write(*region, offset, *mr, 0, len); !ok) fail("write", ok.error());
    next_completion(*cq, "write");
    if (mode == "abrupt") {
      if (rng() % 2 == 0) std::_Exit(0);  // the kernel tears the connection down
      if (auto ok = conn->disconnect(); !ok) fail("disconnect", ok.error());
      result("abrupt");  // gone without waiting for closed
    }
    if (mode == "slow") std::this_thread::sleep_for(3s);
    if (auto ok = conn->read(*mr, read_at, *region, offset, len); !ok) fail("read", ok.error());
    next_completion(*cq, "read");
    if (std::memcmp(memory.data(), memory.data() + read_at, len) != 0)
      fail("content", "the bytes read back differ from those written");

    std::memcpy(memory.data() + send_at, soak::check.data(), soak::check.size());
    soak::put_u32(memory.data() + send_at + soak::check.size(), static_cast<std::uint32_t>(len));
    soak::put_u64(memory.data() + send_at + soak::check.size() + 4, soak::hash(std::span(memory).first(len)));
    if (auto ok = conn->send(*mr, send_at, soak::check.size() + 12); !ok) fail("send", ok.error());
    bool sent = false, answered = false;
    while (!sent || !answered) {
      const ibv_wc wc = next_completion(*cq, "send/recv");
      if (wc.opcode == IBV_WC_SEND) sent = true;
      else if (wc.opcode == IBV_WC_RECV) {
        answered = true;
        const std::span<const std::byte> answer(memory.data() + recv_at, wc.byte_len);
        if (!(wc.byte_len == soak::good.size() && soak::starts_with(answer, soak::good)))
          fail("content", "the server did not confirm the slot's content");
      } else fail("wc_opcode", fmt::format("unexpected {}", rpmapp::to_string(wc.opcode)));
    }

    if (auto ok = conn->disconnect(); !ok) fail("disconnect", ok.error());
    auto closed = conn->next_event_for(wait_bound);
    if (!closed) fail(closed.error() == rpmapp::errc::no_event ? "hang" : "conn_event", closed.error());
    if (*closed != rpmapp::ConnEvent::closed) fail("conn_event", fmt::format("disconnect: {}", rpmapp::to_string(*closed)));
    if (auto ok = std::move(*conn).close(); !ok) fail("close", ok.error());
    stage("done");  // one cycle
  }
  if (auto ok = std::move(*mr).dereg(); !ok) fail("dereg", ok.error());
  result(fmt::format("ok {}", cycles));
}
