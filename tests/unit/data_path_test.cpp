// The operations of a connection: the exact work request each posts, the checks before
// posting (inval/nosupp with nothing posted), post failures, moved-from connections, and
// receives (before connect, shared receive queues).
#include "data_util.hpp"

#include <arpa/inet.h>

namespace data_path_test {

using namespace test;

namespace {

struct Setup {
  fake::FakeProvider& fake;
  Peer peer;
  Conn conn;
  Buffer local{4096};
  MrLocal mr;
  ibv_qp* qp;
  /// `device` 1: connected to 169.254.78.9 through the fake's second device.
  Setup(fake::FakeProvider& f, const ConnConfig& cfg = {}, MrUsage usage = all_usages, int device = 0)
      : fake(f), peer(open_peer(f, device)),
        conn(connected(f, peer, cfg, device == 0 ? "169.254.77.9" : "169.254.78.9")),
        mr(reg(peer, local, usage)), qp(*conn.qp()) {}
  std::uint32_t lkey() const { return (*mr.native())->lkey; }
  std::uint64_t at(std::size_t offset) const { return addr_of(local.data()) + offset; }
};

// Built without Catch (a static initializer runs outside any test case); checked below.
const MrRemote peer_region =
    MrRemote::from_descriptor(descriptor_of(0x7f0000001000ull, 1 << 20, 0xabcdef01u, 0xff))
        .value_or(MrRemote{});

fake::PostedWr only_post(const fake::FakeProvider& fake, std::size_t from) {
  auto now = posted_since(fake, from);
  REQUIRE(now.size() == 1);
  return now[0];
}

void check_sge(const fake::PostedWr& wr, std::uint64_t addr, std::uint32_t len, std::uint32_t lkey) {
  REQUIRE(wr.sge.size() == 1);
  CHECK(wr.sge[0].addr == addr);
  CHECK(wr.sge[0].length == len);
  CHECK(wr.sge[0].lkey == lkey);
}

}  // namespace

TEST_CASE("Conn::read posts one RDMA READ", "[data][read]") {
  REQUIRE(peer_region.size() == (1 << 20));
  fake::FakeProvider fake;
  {
    Setup s(fake);
    for (auto when : {Completion::always, Completion::on_error}) {
      const auto before = fake.posted().size();
      REQUIRE(s.conn.read(s.mr, 16, peer_region, 4096, 100, when, 0x1234));
      const auto wr = only_post(fake, before);
      CHECK(wr.queue == fake::PostedWr::Queue::send);
      CHECK(wr.qp_num == *s.conn.qp_num());
      CHECK(wr.opcode == IBV_WR_RDMA_READ);
      CHECK(wr.send_flags == (when == Completion::always ? unsigned(IBV_SEND_SIGNALED) : 0u));
      check_sge(wr, s.at(16), 100, s.lkey());
      CHECK(wr.remote_addr == 0x7f0000001000ull + 4096);
      CHECK(wr.rkey == 0xabcdef01u);
      CHECK(wr.wr_id == 0x1234);
      CHECK(wr.local_ok);
    }
    // The signaled one completes on the CQ with its context; the other silently.
    CHECK(fake.complete_sends(s.qp) == 2);
    ibv_wc wc[4];
    auto got = s.conn.cq()->get(wc);
    REQUIRE(got);
    REQUIRE(got->size() == 1);
    CHECK((*got)[0].wr_id == 0x1234);
    CHECK((*got)[0].opcode == IBV_WC_RDMA_READ);
    CHECK((*got)[0].byte_len == 100);
    CHECK(check((*got)[0]));
  }
  fake.expect_clean();
}

TEST_CASE("Conn::write and write_with_imm post RDMA WRITEs (imm in network order)", "[data][write]") {
  fake::FakeProvider fake;
  {
    Setup s(fake);
    auto before = fake.posted().size();
    REQUIRE(s.conn.write(peer_region, 8, s.mr, 0, 4096, Completion::always, 7));
    auto wr = only_post(fake, before);
    CHECK(wr.opcode == IBV_WR_RDMA_WRITE);
    CHECK(wr.send_flags == IBV_SEND_SIGNALED);
    check_sge(wr, s.at(0), 4096, s.lkey());
    CHECK(wr.remote_addr == 0x7f0000001000ull + 8);
    CHECK(wr.rkey == 0xabcdef01u);
    CHECK(wr.wr_id == 7);

    before = fake.posted().size();
    REQUIRE(s.conn.write_with_imm(peer_region, 0, s.mr, 10, 20, 0x01020304u, Completion::on_error, 9));
    wr = only_post(fake, before);
    CHECK(wr.opcode == IBV_WR_RDMA_WRITE_WITH_IMM);
    CHECK(wr.send_flags == 0);
    check_sge(wr, s.at(10), 20, s.lkey());
    CHECK(wr.imm_data == htonl(0x01020304u));
    CHECK(wr.wr_id == 9);

    before = fake.posted().size();
    REQUIRE(s.conn.write(peer_region, 0, s.mr, 0, 0));  // an empty write: no entry
    wr = only_post(fake, before);
    CHECK(wr.sge.empty());
  }
  fake.expect_clean();
}

TEST_CASE("Conn::atomic_write: emulated (inline fenced WRITE) and native", "[data][atomic]") {
  const std::array<std::byte, 8> value{std::byte{1}, std::byte{2}, std::byte{3}, std::byte{4},
                                       std::byte{5}, std::byte{6}, std::byte{7}, std::byte{8}};
  SECTION("emulated, as librpma 1.2") {
    fake::FakeProvider fake;
    {
      Setup s(fake);
      REQUIRE_FALSE(*s.peer.native_atomic_write());
      const auto before = fake.posted().size();
      REQUIRE(s.conn.atomic_write(peer_region, 64, value, Completion::always, 0x77));
      const auto wr = only_post(fake, before);
      CHECK(wr.opcode == IBV_WR_RDMA_WRITE);
      CHECK(wr.send_flags == (IBV_SEND_SIGNALED | IBV_SEND_INLINE | IBV_SEND_FENCE));
      CHECK(wr.inline_data == std::vector<std::byte>(value.begin(), value.end()));
      CHECK(wr.remote_addr == 0x7f0000001000ull + 64);
      CHECK(wr.rkey == 0xabcdef01u);
      CHECK(wr.wr_id == 0x77);
      CHECK_FALSE(wr.native_atomic);
      const auto b2 = fake.posted().size();
      REQUIRE(s.conn.atomic_write(peer_region, 0, value, Completion::on_error));
      CHECK(only_post(fake, b2).send_flags == (IBV_SEND_INLINE | IBV_SEND_FENCE));
    }
    fake.expect_clean();
  }
  SECTION("emulated on a queue pair with less than 8 bytes of inline data: nosupp") {
    fake::FakeProvider fake;
    {
      ConnConfig cfg;
      cfg.max_inline_data = 4;
      Setup s(fake, cfg);
      const auto before = fake.posted().size();
      auto r = s.conn.atomic_write(peer_region, 0, value);
      REQUIRE_FALSE(r);
      CHECK(r.error().code() == errc::nosupp);
      CHECK(posted_since(fake, before).empty());
    }
    fake.expect_clean();
  }
  SECTION("native: an extended queue pair with atomic write, the value copied when posted") {
    fake::FakeProvider fake;
    fake::DeviceCaps caps;
    caps.device_cap_flags_ex = fake::DeviceCaps::atomic_write_flag;
    fake.set_caps(0, caps);
    namespace abi = rpmapp::detail::native_atomic_write_abi;
    if constexpr (!rpmapp::detail::build_has_native_atomic_write) {
      // rdma-core 39 (Ubuntu 22.04): no ibv_wr_atomic_write in the build, so the device's
      // flag is not taken and the write is emulated
      Setup s(fake);
      CHECK_FALSE(*s.peer.native_atomic_write());
      CHECK(fake.last_qp_attr_ex.send_ops_flags == 0);  // a plain QP (rdma_create_qp)
      const auto before = fake.posted().size();
      REQUIRE(s.conn.atomic_write(peer_region, 8, value));
      CHECK(only_post(fake, before).opcode == IBV_WR_RDMA_WRITE);
    } else {
      Setup s(fake);
      REQUIRE(*s.peer.native_atomic_write());
      CHECK(fake.last_qp_attr_ex.send_ops_flags == abi::qp_ex_with_atomic_write);
      CHECK(fake.last_qp_attr_ex.pd == *s.peer.pd());
      auto copy = value;
      const auto before = fake.posted().size();
      REQUIRE(s.conn.atomic_write(peer_region, 8, copy, Completion::always, 5));
      copy.fill(std::byte{0});
      const auto wr = only_post(fake, before);
      CHECK(wr.native_atomic);
      CHECK(wr.opcode == abi::wr_atomic_write);
      CHECK(wr.send_flags == IBV_SEND_SIGNALED);
      CHECK(wr.inline_data == std::vector<std::byte>(value.begin(), value.end()));
      CHECK(wr.remote_addr == 0x7f0000001000ull + 8);
      CHECK(wr.rkey == 0xabcdef01u);
      CHECK(wr.wr_id == 5);
      fake.complete_sends(s.qp);
      ibv_wc wc;
      auto got = s.conn.cq()->get({&wc, 1});
      REQUIRE(got);
      CHECK(static_cast<int>(wc.opcode) == abi::wc_atomic_write);
      fake.fail("ibv_wr_complete", kErr);
      auto failed = s.conn.atomic_write(peer_region, 8, value);
      REQUIRE_FALSE(failed);
      check_injected(failed.error(), "ibv_wr_complete", kErr);
      // a userspace provider older than the build's rdma-core refuses the native send ops
      // (rxe of rdma-core 39 on kernel 6.2 or newer): the error says why
      fake.fail("rdma_create_qp_ex", EOPNOTSUPP);
      auto refused = ConnReq::to(s.peer, "169.254.77.9", "7471");
      REQUIRE_FALSE(refused);
      CHECK(refused.error().code() == errc::provider);
      CHECK(refused.error().call() == "rdma_create_qp_ex");
      CHECK(refused.error().sys_errno() == EOPNOTSUPP);
      CHECK_THAT(refused.error().message(), Catch::Contains("native atomic write but its libibverbs provider") &&
                                                Catch::Contains("built on a newer rdma-core"));
    }
    fake.expect_clean();
  }
  SECTION("bad offsets: unaligned, out of bounds, no write_dst") {
    fake::FakeProvider fake;
    {
      Setup s(fake);
      const auto before = fake.posted().size();
      check_inval(s.conn.atomic_write(peer_region, 4, value).error(), "Conn::atomic_write", "aligned");
      check_inval(s.conn.atomic_write(peer_region, (1 << 20), value).error(), "Conn::atomic_write");
      const auto small = remote(0x1000, 12, 1, MrUsage::write_dst);
      check_inval(s.conn.atomic_write(small, 8, value).error(), "Conn::atomic_write");
      const auto ro = remote(0x1000, 64, 1, MrUsage::read_src);
      check_inval(s.conn.atomic_write(ro, 0, value).error(), "Conn::atomic_write", "write_dst");
      CHECK(posted_since(fake, before).empty());
    }
    fake.expect_clean();
  }
}

TEST_CASE("Conn::flush: an RDMA READ of up to 8 bytes into the Peer's flush buffer", "[data][flush]") {
  fake::FakeProvider fake;
  {
    Setup s(fake);
    const ibv_mr* flush_mr = fake.registrations().front().mr;
    auto before = fake.posted().size();
    REQUIRE(s.conn.flush(peer_region, 128, 4000, FlushType::visibility, Completion::always, 3));
    auto wr = only_post(fake, before);
    CHECK(wr.opcode == IBV_WR_RDMA_READ);
    CHECK(wr.send_flags == IBV_SEND_SIGNALED);
    check_sge(wr, addr_of(flush_mr->addr), 8, flush_mr->lkey);
    CHECK(wr.remote_addr == 0x7f0000001000ull + 128);
    CHECK(wr.rkey == 0xabcdef01u);
    CHECK(wr.wr_id == 3);
    CHECK(wr.local_ok);

    // Near the end of the region it reads only what is left.
    before = fake.posted().size();
    REQUIRE(s.conn.flush(peer_region, (1 << 20) - 3, 3, FlushType::visibility, Completion::on_error));
    wr = only_post(fake, before);
    CHECK(wr.send_flags == 0);
    check_sge(wr, addr_of(flush_mr->addr), 3, flush_mr->lkey);

    SECTION("persistent: nosupp until the peer declares direct write to PMem") {
      before = fake.posted().size();
      auto r = s.conn.flush(peer_region, 0, 8, FlushType::persistent);
      REQUIRE_FALSE(r);
      CHECK(r.error().code() == errc::nosupp);
      CHECK_THAT(r.error().message(), Catch::Contains("direct write"));
      CHECK(posted_since(fake, before).empty());
      REQUIRE(s.conn.apply_remote_peer_config(PeerConfig{true}));
      REQUIRE(s.conn.flush(peer_region, 0, 8, FlushType::persistent));
      CHECK(posted_since(fake, before).size() == 1);
    }
    SECTION("a region without the flush type's usage: nosupp") {
      REQUIRE(s.conn.apply_remote_peer_config(PeerConfig{true}));
      const auto vis = remote(0x1000, 64, 1, MrUsage::flush_visibility | MrUsage::write_dst);
      const auto pers = remote(0x1000, 64, 1, MrUsage::flush_persistent | MrUsage::write_dst);
      before = fake.posted().size();
      auto r = s.conn.flush(vis, 0, 8, FlushType::persistent);
      REQUIRE_FALSE(r);
      CHECK(r.error().code() == errc::nosupp);
      CHECK_THAT(r.error().message(), Catch::Contains("flush_persistent"));
      r = s.conn.flush(pers, 0, 8, FlushType::visibility);
      REQUIRE_FALSE(r);
      CHECK(r.error().code() == errc::nosupp);
      CHECK_THAT(r.error().message(), Catch::Contains("flush_visibility"));
      CHECK(posted_since(fake, before).empty());
      CHECK(s.conn.flush(vis, 0, 8, FlushType::visibility));
      CHECK(s.conn.flush(pers, 0, 8, FlushType::persistent));
    }
    SECTION("bad arguments: inval") {
      before = fake.posted().size();
      check_inval(s.conn.flush(peer_region, 1 << 20, 1, FlushType::visibility).error(), "Conn::flush");
      check_inval(s.conn.flush(MrRemote{}, 0, 1, FlushType::visibility).error(), "Conn::flush", "empty");
      check_inval(s.conn.flush(peer_region, 0, 1, static_cast<FlushType>(7)).error(), "Conn::flush");
      check_inval(s.conn.flush(peer_region, 0, 1, FlushType::visibility, static_cast<Completion>(2)).error(),
                  "Conn::flush");
      CHECK(posted_since(fake, before).empty());
    }
  }
  fake.expect_clean();
}

TEST_CASE("Conn::flush natively: an RDMA FLUSH of the range where the build and the device have it",
          "[data][flush][native]") {
  namespace abi = rpmapp::detail::native_flush_abi;
  fake::FakeProvider fake;
  fake::DeviceCaps caps;
  caps.device_cap_flags_ex = fake::DeviceCaps::flush_flags;  // rxe from kernel 6.2
  fake.set_caps(0, caps);
  {
    Setup s(fake, {}, MrUsage::write_src | MrUsage::flush_visibility);
    if constexpr (!rpmapp::detail::build_has_native_flush) {
      // rdma-core 44 (Debian 12): no ibv_wr_flush in the build, so every flush is emulated
      // whatever the device reports, and regions get no flush right
      CHECK_FALSE(*s.peer.native_flush());
      CHECK(fake.last_qp_attr_ex.send_ops_flags == 0);  // a plain QP (rdma_create_qp)
      CHECK(fake.registrations().back().access == (IBV_ACCESS_REMOTE_READ | IBV_ACCESS_LOCAL_WRITE));
      const auto before = fake.posted().size();
      REQUIRE(s.conn.flush(peer_region, 64, 100, FlushType::visibility));
      CHECK(only_post(fake, before).opcode == IBV_WR_RDMA_READ);
    } else {
      REQUIRE(*s.peer.native_flush());
      CHECK(fake.last_qp_attr_ex.send_ops_flags == abi::qp_ex_with_flush);
      // the flush right librpma 1.3 gives, and REMOTE_READ for peers that emulate
      CHECK(fake.registrations().back().access ==
            (IBV_ACCESS_REMOTE_READ | IBV_ACCESS_LOCAL_WRITE | abi::access_flush_global));
      auto before = fake.posted().size();
      REQUIRE(s.conn.flush(peer_region, 128, 4000, FlushType::visibility, Completion::always, 3));
      auto wr = only_post(fake, before);
      CHECK(wr.native_flush);
      CHECK(wr.opcode == abi::wr_flush);
      CHECK(wr.send_flags == IBV_SEND_SIGNALED);
      CHECK(wr.remote_addr == 0x7f0000001000ull + 128);
      CHECK(wr.rkey == 0xabcdef01u);
      CHECK(wr.wr_id == 3);
      CHECK(wr.flush_len == 4000);  // the whole range, not 8 bytes
      CHECK(wr.flush_type == abi::type_global);
      CHECK(wr.flush_level == abi::level_range);
      CHECK(wr.sge.empty());
      fake.complete_sends(s.qp);
      ibv_wc wc;
      auto got = s.conn.cq()->get({&wc, 1});
      REQUIRE(got);
      REQUIRE(got->size() == 1);
      CHECK(static_cast<int>(wc.opcode) == abi::wc_flush);
      CHECK(rpmapp::to_string(wc.opcode) == "flush");

      REQUIRE(s.conn.apply_remote_peer_config(PeerConfig{true}));
      before = fake.posted().size();
      REQUIRE(s.conn.flush(peer_region, 0, 8, FlushType::persistent, Completion::on_error));
      wr = only_post(fake, before);
      CHECK(wr.flush_type == abi::type_persistent);
      CHECK(wr.send_flags == 0);

      fake.fail("ibv_wr_complete", kErr);
      before = fake.posted().size();
      auto failed = s.conn.flush(peer_region, 0, 8, FlushType::visibility);
      REQUIRE_FALSE(failed);
      check_injected(failed.error(), "ibv_wr_complete", kErr);
      CHECK(posted_since(fake, before).empty());

      // flush_persistent on memory that is not pmem: rxe's EINVAL, with the reason
      Buffer dram{4096};
      auto refused = MrLocal::reg(s.peer, dram.data(), dram.size, MrUsage::flush_persistent);
      REQUIRE_FALSE(refused);
      CHECK(refused.error().code() == errc::provider);
      CHECK(refused.error().sys_errno() == EINVAL);
      CHECK_THAT(refused.error().message(), Catch::Contains("not persistent"));
      Buffer pmem{4096};
      fake.persistent_memory(pmem.data());
      auto kept = MrLocal::reg(s.peer, pmem.data(), pmem.size, MrUsage::flush_persistent);
      REQUIRE(kept);
      CHECK(fake.registrations().back().access == (IBV_ACCESS_REMOTE_READ | abi::access_flush_persistent));
    }
  }
  fake.expect_clean();
}

TEST_CASE("native flush needs both flush types on the device, as librpma 1.3 decides", "[data][flush][native]") {
  fake::FakeProvider fake;
  fake::DeviceCaps global_only;
  global_only.device_cap_flags_ex = 1ull << 38;
  fake.set_caps(0, global_only);
  {
    Setup s(fake);
    CHECK_FALSE(*s.peer.native_flush());
    const auto before = fake.posted().size();
    REQUIRE(s.conn.flush(peer_region, 0, 8, FlushType::visibility));
    CHECK(only_post(fake, before).opcode == IBV_WR_RDMA_READ);
    CHECK((fake.registrations().back().access & rpmapp::detail::native_flush_abi::access_flush_global) == 0);
    Peer moved = open_peer(fake);
    Peer into = std::move(moved);
    check_inval(moved.native_flush().error(), "Peer::native_flush");
  }
  fake.expect_clean();
}

TEST_CASE("Conn::send and send_with_imm; Conn::recv", "[data][send]") {
  fake::FakeProvider fake;
  {
    Setup s(fake);
    auto before = fake.posted().size();
    REQUIRE(s.conn.send(s.mr, 100, 50, Completion::always, 11));
    auto wr = only_post(fake, before);
    CHECK(wr.opcode == IBV_WR_SEND);
    CHECK(wr.send_flags == IBV_SEND_SIGNALED);
    check_sge(wr, s.at(100), 50, s.lkey());
    CHECK(wr.wr_id == 11);
    CHECK(wr.imm_data == 0);

    before = fake.posted().size();
    REQUIRE(s.conn.send_with_imm(s.mr, 0, 0, 0xdeadbeefu, Completion::on_error, 12));
    wr = only_post(fake, before);
    CHECK(wr.opcode == IBV_WR_SEND_WITH_IMM);
    CHECK(wr.send_flags == 0);
    CHECK(wr.sge.empty());  // an empty message
    CHECK(wr.imm_data == htonl(0xdeadbeefu));

    before = fake.posted().size();
    REQUIRE(s.conn.recv(s.mr, 200, 300, 13));
    wr = only_post(fake, before);
    CHECK(wr.queue == fake::PostedWr::Queue::recv);
    CHECK(wr.qp_num == *s.conn.qp_num());
    check_sge(wr, s.at(200), 300, s.lkey());
    CHECK(wr.wr_id == 13);

    // The message lands in the receive's memory; its completion (with imm) goes to cq().
    const std::string msg = "hello";
    REQUIRE(fake.deliver_recv(s.qp, as_bytes(msg), 0x0a0b0c0du));
    ibv_wc wc[2];
    auto got = s.conn.cq()->get(wc);
    REQUIRE(got);
    REQUIRE(got->size() == 1);
    CHECK(wc[0].wr_id == 13);
    CHECK(wc[0].opcode == IBV_WC_RECV);
    CHECK(wc[0].byte_len == 5);
    CHECK(immediate(wc[0]) == 0x0a0b0c0du);
    CHECK(std::string(reinterpret_cast<const char*>(s.local.data()) + 200, 5) == "hello");
  }
  fake.expect_clean();
}

TEST_CASE("ConnReq::recv posts before the connection exists; a send there is refused by the QP",
          "[data][recv]") {
  fake::FakeProvider fake;
  {
    Peer peer = open_peer(fake);
    Buffer buf(64);
    MrLocal mr = reg(peer, buf, MrUsage::recv | MrUsage::send);
    Endpoint ep = listen_on(peer, "169.254.77.1");
    ConnReq req = take_request(fake, ep);
    const auto before = fake.posted().size();
    REQUIRE(req.recv(mr, 8, 16, 99));
    const auto wr = only_post(fake, before);
    CHECK(wr.queue == fake::PostedWr::Queue::recv);
    check_sge(wr, addr_of(buf.data()) + 8, 16, (*mr.native())->lkey);
    CHECK(wr.wr_id == 99);
    check_inval(req.recv(mr, 60, 16).error(), "ConnReq::recv");
    auto conn = std::move(req).connect();
    REQUIRE(conn);
    CHECK(fake.connected(*conn->qp()));  // rdma_accept moved it to RTS
    CHECK(fake.outstanding_recvs(*conn->qp()) == 1);
  }
  fake.expect_clean();
}

TEST_CASE("a send before the connection is established fails as rxe's does (EINVAL)", "[data]") {
  fake::FakeProvider fake;
  {
    Peer peer = open_peer(fake);
    Buffer buf(64);
    MrLocal mr = reg(peer, buf, all_usages);
    auto conn = outgoing(peer).connect();
    REQUIRE(conn);
    REQUIRE(conn->recv(mr, 0, 8));  // a receive is fine in INIT
    auto sent = conn->send(mr, 0, 8);
    REQUIRE_FALSE(sent);
    check_injected(sent.error(), "ibv_post_send", EINVAL);
  }
  fake.expect_clean();
}

TEST_CASE("every operation checks its local range, usage and Peer: inval, nothing posted", "[data][inval]") {
  fake::FakeProvider fake;
  {
    Setup s(fake);
    Peer other = open_peer(fake, 1);
    Buffer buf(64);
    MrLocal foreign = reg(other, buf, all_usages);
    MrLocal send_only = reg(s.peer, buf, MrUsage::send);
    MrLocal empty = reg(s.peer, buf, MrUsage::recv);
    REQUIRE(std::move(empty).dereg());
    const std::array<std::byte, 8> value{};
    const auto before = fake.posted().size();
    const auto mark = fake.mark();

    for (const MrLocal* mr : {&foreign, &send_only, &empty, &s.mr}) {
      const bool bounds = mr == &s.mr;  // the good region, out of its bounds
      const std::size_t off = bounds ? 4000 : 0, len = bounds ? 97 : 8;
      const char* words = mr == &foreign ? "another Peer" : mr == &empty ? "empty" : "";
      check_inval(s.conn.read(*mr, off, peer_region, 0, len).error(), "Conn::read", words);
      check_inval(s.conn.write(peer_region, 0, *mr, off, len).error(), "Conn::write", words);
      check_inval(s.conn.write_with_imm(peer_region, 0, *mr, off, len, 1).error(), "Conn::write_with_imm", words);
      check_inval(s.conn.recv(*mr, off, len).error(), "Conn::recv", words);
      if (mr != &send_only) check_inval(s.conn.send(*mr, off, len).error(), "Conn::send", words);
      if (mr != &send_only)
        check_inval(s.conn.send_with_imm(*mr, off, len, 1).error(), "Conn::send_with_imm", words);
    }
    check_inval(s.conn.read(send_only, 0, peer_region, 0, 8).error(), "Conn::read", "read_dst");
    check_inval(s.conn.write(peer_region, 0, send_only, 0, 8).error(), "Conn::write", "write_src");
    check_inval(s.conn.recv(send_only, 0, 8).error(), "Conn::recv", "recv");
    // offset + len overflowing
    check_inval(s.conn.read(s.mr, 1, peer_region, 0, SIZE_MAX).error(), "Conn::read");
    check_inval(s.conn.send(s.mr, SIZE_MAX, 2).error(), "Conn::send");
    // the remote side: bounds, usage, empty
    const auto read_only = remote(0x1000, 64, 1, MrUsage::read_src);
    check_inval(s.conn.write(read_only, 0, s.mr, 0, 8).error(), "Conn::write", "write_dst");
    check_inval(s.conn.read(s.mr, 0, remote(0x1000, 64, 1, MrUsage::write_dst), 0, 8).error(), "Conn::read",
                "read_src");
    check_inval(s.conn.read(s.mr, 0, read_only, 60, 5).error(), "Conn::read", "not within");
    check_inval(s.conn.read(s.mr, 0, MrRemote{}, 0, 1).error(), "Conn::read", "empty");
    check_inval(s.conn.write(read_only, SIZE_MAX, s.mr, 0, 2).error(), "Conn::write");
    check_inval(s.conn.atomic_write(MrRemote{}, 0, value).error(), "Conn::atomic_write");
    // completion flags librpma does not define
    for (int bad : {0, 2, 4}) {
      const auto when = static_cast<Completion>(bad);
      check_inval(s.conn.read(s.mr, 0, peer_region, 0, 8, when).error(), "Conn::read", "completion");
      check_inval(s.conn.write(peer_region, 0, s.mr, 0, 8, when).error(), "Conn::write", "completion");
      check_inval(s.conn.send(s.mr, 0, 8, when).error(), "Conn::send", "completion");
      check_inval(s.conn.atomic_write(peer_region, 0, value, when).error(), "Conn::atomic_write", "completion");
    }
    CHECK(posted_since(fake, before).empty());
    CHECK(fake.calls_since(mark).empty());  // no provider call at all
  }
  fake.expect_clean();
}

TEST_CASE("a failing post: provider with the errno; ENOMEM says the queue is full", "[data][post]") {
  fake::FakeProvider fake;
  {
    ConnConfig cfg;
    cfg.sq_size = 2;
    cfg.rq_size = 1;
    Setup s(fake, cfg);
    REQUIRE(s.conn.write(peer_region, 0, s.mr, 0, 8, Completion::on_error));
    REQUIRE(s.conn.read(s.mr, 0, peer_region, 0, 8, Completion::on_error));
    const auto before = fake.posted().size();
    // The send queue holds 2: the third is refused by the queue pair itself.
    auto full = s.conn.send(s.mr, 0, 8);
    REQUIRE_FALSE(full);
    CHECK(full.error().code() == errc::provider);
    CHECK(full.error().sys_errno() == ENOMEM);
    CHECK(full.error().call() == "ibv_post_send");
    CHECK_THAT(full.error().message(), Catch::Contains("queue is full"));
    REQUIRE(s.conn.recv(s.mr, 0, 8));
    auto rfull = s.conn.recv(s.mr, 0, 8);
    REQUIRE_FALSE(rfull);
    CHECK(rfull.error().sys_errno() == ENOMEM);
    CHECK(rfull.error().call() == "ibv_post_recv");
    CHECK_THAT(rfull.error().message(), Catch::Contains("queue is full"));
    CHECK(posted_since(fake, before).size() == 1);  // only the first receive
    // Completing frees the queue.
    CHECK(fake.complete_sends(s.qp) == 2);
    CHECK(s.conn.send(s.mr, 0, 8, Completion::on_error));

    const std::array<std::byte, 8> value{};
    struct Post {
      const char* call;
      std::function<expected<void>()> op;
    };
    const Post posts[] = {
        {"ibv_post_send", [&] { return s.conn.read(s.mr, 0, peer_region, 0, 8); }},
        {"ibv_post_send", [&] { return s.conn.write(peer_region, 0, s.mr, 0, 8); }},
        {"ibv_post_send", [&] { return s.conn.write_with_imm(peer_region, 0, s.mr, 0, 8, 1); }},
        {"ibv_post_send", [&] { return s.conn.atomic_write(peer_region, 0, value); }},
        {"ibv_post_send", [&] { return s.conn.flush(peer_region, 0, 8, FlushType::visibility); }},
        {"ibv_post_send", [&] { return s.conn.send(s.mr, 0, 8); }},
        {"ibv_post_send", [&] { return s.conn.send_with_imm(s.mr, 0, 8, 1); }},
        {"ibv_post_recv", [&] { return s.conn.recv(s.mr, 0, 8); }},
    };
    fake.complete_sends(s.qp);
    for (const auto& p : posts) {
      INFO(p.call);
      const auto b = fake.posted().size();
      fake.fail(p.call, kErr);
      auto r = p.op();
      REQUIRE_FALSE(r);
      check_injected(r.error(), p.call, kErr);
      CHECK(posted_since(fake, b).empty());
      // siw's provider returns the errno negated: the Error has it as an errno value.
      fake.fail(p.call, -kErr);
      auto negated = p.op();
      REQUIRE_FALSE(negated);
      check_injected(negated.error(), p.call, kErr);
      CHECK(negated.error().message().find("errno -") == std::string::npos);
      fake.fail(p.call, -ENOMEM);
      auto full_negated = p.op();
      REQUIRE_FALSE(full_negated);
      CHECK(full_negated.error().sys_errno() == ENOMEM);
      CHECK_THAT(full_negated.error().message(), Catch::Contains("queue is full"));
      CHECK(posted_since(fake, b).empty());
    }
  }
  fake.expect_clean();
}

TEST_CASE("on an iWARP device (siw's provider): a receive of 0 bytes has one empty entry, immediate "
          "data is nosupp before posting, a full queue is ENOMEM",
          "[data][iwarp]") {
  fake::FakeProvider fake;
  fake.set_caps(1, fake::DeviceCaps::siw());
  {
    ConnConfig cfg;
    cfg.rq_size = 2;
    Setup s(fake, cfg, all_usages, 1);
    auto before = fake.posted().size();
    REQUIRE(s.conn.recv(s.mr, 16, 0, 0x70));  // siw refuses a receive without an entry
    check_sge(only_post(fake, before), s.at(16), 0, s.lkey());
    REQUIRE(s.conn.recv(s.mr, 0, 8, 0x71));
    auto full = s.conn.recv(s.mr, 0, 8);  // siw: -ENOMEM
    REQUIRE_FALSE(full);
    CHECK(full.error().sys_errno() == ENOMEM);
    CHECK_THAT(full.error().message(), Catch::Contains("queue is full"));

    before = fake.posted().size();
    const auto mark = fake.mark();
    for (auto refused : {s.conn.write_with_imm(peer_region, 0, s.mr, 0, 8, 1), s.conn.send_with_imm(s.mr, 0, 8, 1)}) {
      REQUIRE_FALSE(refused);
      INFO(refused.error().message());
      CHECK(refused.error().code() == errc::nosupp);
      CHECK(refused.error().sys_errno() == 0);
      CHECK_THAT(refused.error().message(), Catch::Contains("fake1 is an iWARP device, and iWARP has no immediate data"));
    }
    CHECK(fake.calls_since(mark).empty());
    CHECK(posted_since(fake, before).empty());
    // What iWARP has still posts.
    REQUIRE(s.conn.write(peer_region, 0, s.mr, 0, 8, Completion::on_error));
    REQUIRE(s.conn.send(s.mr, 0, 0, Completion::on_error));
    CHECK(posted_since(fake, before).size() == 2);
  }
  {
    Setup s(fake);  // on InfiniBand and RoCE: a receive of 0 bytes has no entry (as librpma's)
    const auto before = fake.posted().size();
    REQUIRE(s.conn.recv(s.mr, 16, 0, 0x70));
    CHECK(only_post(fake, before).sge.empty());
  }
  fake.expect_clean();
}

TEST_CASE("on an iWARP device the accepting side posts sends, writes and reads only once it saw "
          "established (again naming the device; receives go before it); the connecting side and "
          "IB/RoCE are not held back",
          "[data][iwarp][first]") {
  fake::FakeProvider fake;
  fake.set_caps(1, fake::DeviceCaps::siw());
  {
    Peer siw = open_peer(fake, 1);
    Peer rxe = open_peer(fake, 0);
    Buffer local{4096};
    MrLocal siw_mr = reg(siw, local, all_usages);
    Buffer rxe_local{4096};
    MrLocal rxe_mr = reg(rxe, rxe_local, all_usages);
    Endpoint siw_ep = listen_on(siw, "169.254.78.1");
    Endpoint rxe_ep = listen_on(rxe, "169.254.77.1");
    const std::array<std::byte, 8> value{};
    auto every_post = [&](Conn& conn, const MrLocal& mr) {
      return std::vector<expected<void>>{conn.send(mr, 0, 8), conn.write(peer_region, 0, mr, 0, 8),
                                         conn.read(mr, 0, peer_region, 0, 8), conn.atomic_write(peer_region, 0, value),
                                         conn.flush(peer_region, 0, 8, FlushType::visibility)};
    };
    ConnConfig cfg;
    cfg.sq_size = 16;
    auto accepted = take_request(fake, siw_ep, {1, "", "169.254.78.20", 40001}, cfg).connect();
    REQUIRE(accepted);
    auto before = fake.posted().size();
    const auto mark = fake.mark();
    for (const auto& refused : every_post(*accepted, siw_mr)) {
      REQUIRE_FALSE(refused);
      INFO(refused.error().message());
      CHECK(refused.error().code() == errc::again);
      CHECK_THAT(refused.error().message(),
                 Catch::Contains("fake1 is an iWARP device: the accepting side may post sends, writes and reads "
                                 "only once it saw ConnEvent::established"));
    }
    CHECK(fake.calls_since(mark).empty());
    CHECK(posted_since(fake, before).empty());
    REQUIRE(accepted->recv(siw_mr, 0, 8));  // a receive waits for the peer: it may go first
    fake.inject_event(*accepted->fd(), RDMA_CM_EVENT_ESTABLISHED);
    REQUIRE(*accepted->try_next_event() == ConnEvent::established);
    before = fake.posted().size();
    for (const auto& posted : every_post(*accepted, siw_mr)) {
      INFO((posted ? std::string() : posted.error().message()));
      CHECK(posted);
    }
    CHECK(posted_since(fake, before).size() == 5);

    // The connecting side on iWARP, and an accepting side on IB/RoCE, post at once.
    Conn out = connected(fake, siw, cfg, "169.254.78.9");
    auto rxe_accepted = take_request(fake, rxe_ep, {0, "", "169.254.77.20", 40002}, cfg).connect();
    REQUIRE(rxe_accepted);
    for (auto* side : {&out, &*rxe_accepted}) {
      const MrLocal& mr = side == &out ? siw_mr : rxe_mr;
      for (const auto& posted : every_post(*side, mr)) {
        INFO((posted ? std::string() : posted.error().message()));
        CHECK(posted);
      }
    }
  }
  fake.expect_clean();
}

TEST_CASE("a moved-from Conn: every data-path call is inval", "[data][moved]") {
  fake::FakeProvider fake;
  {
    Setup s(fake);
    Conn other = std::move(s.conn);
    const std::array<std::byte, 8> value{};
    const auto mark = fake.mark();
    Conn& conn = s.conn;
    check_inval(conn.read(s.mr, 0, peer_region, 0, 8).error(), "Conn::read");
    check_inval(conn.write(peer_region, 0, s.mr, 0, 8).error(), "Conn::write");
    check_inval(conn.write_with_imm(peer_region, 0, s.mr, 0, 8, 1).error(), "Conn::write_with_imm");
    check_inval(conn.atomic_write(peer_region, 0, value).error(), "Conn::atomic_write");
    check_inval(conn.flush(peer_region, 0, 8, FlushType::visibility).error(), "Conn::flush");
    check_inval(conn.send(s.mr, 0, 8).error(), "Conn::send");
    check_inval(conn.send_with_imm(s.mr, 0, 8, 1).error(), "Conn::send_with_imm");
    check_inval(conn.recv(s.mr, 0, 8).error(), "Conn::recv");
    check_inval(conn.cq().error(), "Conn::cq");
    check_inval(conn.rcq().error(), "Conn::rcq");
    check_inval(conn.completion_fd().error(), "Conn::completion_fd");
    check_inval(conn.wait_completion().error(), "Conn::wait_completion");
    check_inval(conn.apply_remote_peer_config({}).error(), "Conn::apply_remote_peer_config");
    CHECK(fake.calls_since(mark).empty());
  }
  fake.expect_clean();
}

TEST_CASE("a disconnected queue pair flushes what is outstanding", "[data]") {
  fake::FakeProvider fake;
  {
    Setup s(fake);
    REQUIRE(s.conn.write(peer_region, 0, s.mr, 0, 8, Completion::on_error, 1));
    REQUIRE(s.conn.recv(s.mr, 0, 8, 2));
    REQUIRE(s.conn.disconnect());
    ibv_wc wc[4];
    auto got = s.conn.cq()->get(wc);
    REQUIRE(got);
    REQUIRE(got->size() == 2);  // unsignaled too: a flushed request always completes
    for (auto& w : *got) {
      CHECK(w.status == IBV_WC_WR_FLUSH_ERR);
      auto e = check(w);
      REQUIRE_FALSE(e);
      CHECK_THAT(e.error().message(), Catch::Contains(std::string(to_string(IBV_WC_WR_FLUSH_ERR))));
    }
  }
  fake.expect_clean();
}

TEST_CASE("a shared receive queue: Conn::recv is inval, the QP is created with the queue", "[data][srq]") {
  fake::FakeProvider fake;
  {
    Peer peer = open_peer(fake);
    auto srq = Srq::create(peer);
    REQUIRE(srq);
    ConnConfig cfg;
    cfg.srq = &*srq;
    Conn conn = connected(fake, peer, cfg);
    CHECK(fake.last_qp_attr.srq == *srq->native());
    CHECK((*conn.qp())->srq == *srq->native());
    CHECK(fake.last_qp_attr.cap.max_recv_wr == 0);
    Buffer buf(64);
    MrLocal mr = reg(peer, buf, MrUsage::recv);
    const auto mark = fake.mark();
    auto r = conn.recv(mr, 0, 8);
    REQUIRE_FALSE(r);
    check_inval(r.error(), "Conn::recv", "Srq::recv");
    CHECK(fake.calls_since(mark).empty());
    // Receives go through the queue; completions to its receive CQ.
    REQUIRE(srq->recv(mr, 0, 8, 42));
    REQUIRE(fake.deliver_recv(*conn.qp(), as_bytes("x")));
    CHECK(*conn.rcq() == *srq->rcq());
    ibv_wc wc;
    auto got = srq->rcq()->get({&wc, 1});
    REQUIRE(got);
    CHECK(wc.wr_id == 42);
    CHECK(wc.qp_num == *conn.qp_num());
  }
  fake.expect_clean();
}

TEST_CASE("review 2.6: atomic_write checks the remote address's alignment, not the offset's",
          "[data][atomic][review]") {
  const std::array<std::byte, 8> value{};
  fake::FakeProvider fake;
  {
    Setup s(fake);
    const MrRemote odd = remote(0x7f0000001004ull, 4096, 0x1234u, MrUsage::write_dst);
    const auto before = fake.posted().size();
    auto r = s.conn.atomic_write(odd, 0, value);
    REQUIRE_FALSE(r);
    check_inval(r.error(), "Conn::atomic_write", "remote address 0x7f0000001004");
    CHECK(posted_since(fake, before).empty());
    REQUIRE(s.conn.atomic_write(odd, 4, value));
    CHECK(only_post(fake, before).remote_addr == 0x7f0000001008ull);
  }
  fake.expect_clean();
}

TEST_CASE("review 2 (porting): atomic_write takes a std::uint64_t, its bytes as in memory",
          "[data][atomic][review]") {
  fake::FakeProvider fake;
  {
    Setup s(fake);
    const std::uint64_t value = 0x0807060504030201ull;
    const auto before = fake.posted().size();
    REQUIRE(s.conn.atomic_write(peer_region, 8, value, Completion::always, 9));
    const auto wr = only_post(fake, before);
    std::vector<std::byte> bytes(8);
    std::memcpy(bytes.data(), &value, 8);
    CHECK(wr.inline_data == bytes);
    CHECK(wr.remote_addr == 0x7f0000001008ull);
    CHECK(wr.wr_id == 9);
  }
  fake.expect_clean();
}

}  // namespace data_path_test
