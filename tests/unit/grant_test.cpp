// Grants (rpmapp::Grant, MrScope::grants) on the fake provider: what is registered, bound
// and posted, which accesses the responder's checks would let through (the fake models
// rxe's check_rkey), revocation by each of the three owners, every failure path. What a
// peer really sees is proven on rxe in tests/integration/grant_test.cpp.
#include "data_util.hpp"
#include "loop_util.hpp"

#include <thread>

namespace grant_test {

namespace {

using namespace test;
using namespace std::chrono_literals;

constexpr MrUsage remote_rw = MrUsage::read_src | MrUsage::write_dst;

MrLocal reg_for_grants(const Peer& peer, const Buffer& buf, MrUsage usage = remote_rw) {
  auto mr = MrLocal::reg(peer, buf.data(), buf.size, usage, MrScope::grants);
  INFO((mr ? std::string() : mr.error().message()));
  REQUIRE(mr);
  return std::move(*mr);
}

Grant grant(Conn& conn, const MrLocal& mr, std::size_t offset, std::size_t len, MrUsage usage = remote_rw) {
  auto g = Grant::make(conn, mr, offset, len, usage);
  INFO((g ? std::string() : g.error().message()));
  REQUIRE(g);
  return std::move(*g);
}

MrRemote remote_of(const Grant& g) {
  auto r = MrRemote::from_descriptor(*g.descriptor());
  REQUIRE(r);
  return *r;
}

std::uint32_t qp_num(const Conn& conn) { return *conn.qp_num(); }

std::uint64_t address_of(const Buffer& buf, std::size_t offset = 0) {
  return reinterpret_cast<std::uintptr_t>(buf.data()) + offset;
}

// The device completes the connection's outstanding work requests (its grants' binds) and
// the application reads the completions through Cq::get: each bind's is IBV_WC_BIND_MW
// with its context.
void complete_binds(fake::FakeProvider& fake, Conn& conn, std::size_t binds = 1,
                    std::uint64_t context = Grant::bind_wr_id) {
  REQUIRE(fake.complete_sends(*conn.qp()) == binds);
  std::vector<ibv_wc> wc(binds + 1);
  auto got = (*conn.cq()).get(wc);
  REQUIRE(got);
  REQUIRE(got->size() == binds);
  for (const ibv_wc& c : *got) {
    CHECK(c.status == IBV_WC_SUCCESS);
    CHECK(c.opcode == IBV_WC_BIND_MW);
    CHECK(c.wr_id == context);
  }
}

}  // namespace

TEST_CASE("MrScope::grants: the region's own key carries no remote right; it has no descriptor",
          "[grant]") {
  fake::FakeProvider fake;
  {
    Peer peer = open_peer(fake);
    REQUIRE(*peer.memory_windows());
    Conn conn = connected(fake, peer);
    Buffer buf(4096);
    MrLocal mr = reg_for_grants(peer, buf, remote_rw | MrUsage::recv);
    CHECK(*mr.scope() == MrScope::grants);
    const auto regs = fake.registrations();
    CHECK(regs.back().access == (IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_MW_BIND));
    const ibv_mr* raw = *mr.native();
    CHECK_FALSE(fake.remote_access(qp_num(conn), raw->rkey, address_of(buf), 8, IBV_ACCESS_REMOTE_READ));
    CHECK_FALSE(fake.remote_access(qp_num(conn), raw->rkey, address_of(buf), 8, IBV_ACCESS_REMOTE_WRITE));
    // the same memory registered with MrScope::peer: its key reaches it from the connection
    MrLocal shared = reg(peer, buf, remote_rw);
    CHECK(fake.remote_access(qp_num(conn), (*shared.native())->rkey, address_of(buf), 8,
                             IBV_ACCESS_REMOTE_READ));
    auto d = mr.descriptor();
    REQUIRE_FALSE(d);
    check_inval(d.error(), "MrLocal::descriptor", "MrScope::grants");
    Poisoned out;
    auto written = mr.write_descriptor(out.span());
    REQUIRE_FALSE(written);
    check_inval(written.error(), "MrLocal::write_descriptor", "Grant");
    CHECK(out.untouched());
    // a read-only grantable region needs no local right at all
    MrLocal read_only = reg_for_grants(peer, buf, MrUsage::read_src);
    CHECK(fake.registrations().back().access == IBV_ACCESS_MW_BIND);
  }
  fake.expect_clean();
}

TEST_CASE("without memory windows, grants are registrations; on iWARP a read_dst region cannot be "
          "granted",
          "[grant]") {
  fake::FakeProvider fake;
  fake.set_caps(0, fake::DeviceCaps::without_windows());
  fake::DeviceCaps iwarp;
  iwarp.transport = IBV_TRANSPORT_IWARP;
  fake.set_caps(1, iwarp);
  {
    Peer no_windows = open_peer(fake, 0);
    CHECK_FALSE(*no_windows.memory_windows());
    CHECK(*no_windows.grant_mode() == GrantMode::registrations);
    Peer on_iwarp = open_peer(fake, 1);
    CHECK(*on_iwarp.grant_mode() == GrantMode::windows);
    Buffer buf(64);
    MrLocal mr = reg_for_grants(no_windows, buf);
    CHECK(*mr.scope() == MrScope::grants);
    CHECK(*mr.grant_mode() == GrantMode::registrations);
    // the local rights only: no MW_BIND without windows
    CHECK(fake.registrations().back().access == IBV_ACCESS_LOCAL_WRITE);
    const auto mark = fake.mark();
    auto read_dst = MrLocal::reg(on_iwarp, buf.data(), buf.size, MrUsage::read_dst, MrScope::grants);
    REQUIRE_FALSE(read_dst);
    check_inval(read_dst.error(), "MrLocal::reg", "iWARP");
    auto forced = MrLocal::reg(on_iwarp, buf.data(), buf.size, MrUsage::read_dst, MrScope::grants_by_registration);
    REQUIRE_FALSE(forced);
    check_inval(forced.error(), "MrLocal::reg", "iWARP");
    auto no_scope = MrLocal::reg(on_iwarp, buf.data(), buf.size, MrUsage::read_src, static_cast<MrScope>(7));
    REQUIRE_FALSE(no_scope);
    check_inval(no_scope.error(), "MrLocal::reg", "no MrScope");
    CHECK(fake.calls_since(mark).empty());
    MrLocal shared = reg(no_windows, buf, remote_rw);
    auto mode = shared.grant_mode();
    REQUIRE_FALSE(mode);
    check_inval(mode.error(), "MrLocal::grant_mode", "MrScope::peer");
  }
  fake.expect_clean();
}

TEST_CASE("a grant by registration: the range registered with the granted rights, nothing posted; "
          "revoked by revoke(), its connection's release and its region's deregistration",
          "[grant]") {
  fake::FakeProvider fake;
  const bool forced = GENERATE(false, true);
  INFO("MrScope::grants_by_registration on a device with windows: " << forced);
  if (!forced) fake.set_caps(0, fake::DeviceCaps::without_windows());
  {
    Peer peer = open_peer(fake);
    Buffer buf(4096);
    std::optional<Conn> conn(connected(fake, peer));
    Conn other = connected(fake, peer);
    auto registered = MrLocal::reg(peer, buf.data(), buf.size, remote_rw | MrUsage::recv,
                                   forced ? MrScope::grants_by_registration : MrScope::grants);
    REQUIRE(registered);
    std::optional<MrLocal> mr(std::move(*registered));
    CHECK(*mr->grant_mode() == GrantMode::registrations);
    CHECK(*mr->scope() == (forced ? MrScope::grants_by_registration : MrScope::grants));
    CHECK(fake.registrations().back().access == IBV_ACCESS_LOCAL_WRITE);
    const auto mark = fake.mark();
    Grant g = grant(*conn, *mr, 1000, 100, MrUsage::read_src);
    CHECK(fake.calls_since(mark) == std::vector<std::string>{"ibv_reg_mr"});
    const fake::Registration range = fake.registrations().back();
    CHECK(range.addr == buf.data() + 1000);
    CHECK(range.length == 100);
    CHECK(range.access == IBV_ACCESS_REMOTE_READ);
    const MrRemote r = remote_of(g);
    CHECK(r.address() == address_of(buf, 1000));
    CHECK(r.size() == 100);
    CHECK(r.rkey() == range.mr->rkey);
    CHECK(r.usage() == MrUsage::read_src);
    CHECK(fake.complete_sends(*conn->qp()) == 0);  // no bind, no completion
    CHECK(fake.windows().empty());
    const auto n = qp_num(*conn);
    CHECK(fake.remote_access(n, r.rkey(), r.address(), 100, IBV_ACCESS_REMOTE_READ));
    CHECK_FALSE(fake.remote_access(n, r.rkey(), r.address(), 8, IBV_ACCESS_REMOTE_WRITE));
    CHECK_FALSE(fake.remote_access(n, r.rkey(), r.address() + 100, 1, IBV_ACCESS_REMOTE_READ));
    // a registration's key is good on every connection of the Peer (GrantMode::registrations)
    CHECK(fake.remote_access(qp_num(other), r.rkey(), r.address(), 8, IBV_ACCESS_REMOTE_READ));
    // a write grant: REMOTE_WRITE with the LOCAL_WRITE verbs require under it
    Grant w = grant(*conn, *mr, 0, 64, MrUsage::write_dst);
    CHECK(fake.registrations().back().access == (IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_LOCAL_WRITE));
    auto gone = [&] {
      CHECK_FALSE(g);
      CHECK_FALSE(fake.remote_access(n, r.rkey(), r.address(), 8, IBV_ACCESS_REMOTE_READ));
      CHECK_FALSE(fake.remote_access(qp_num(other), r.rkey(), r.address(), 8, IBV_ACCESS_REMOTE_READ));
    };
    SECTION("revoke()") {
      const auto revoking = fake.mark();
      REQUIRE(std::move(g).revoke());
      CHECK(fake.calls_since(revoking) == std::vector<std::string>{"ibv_dereg_mr"});
      gone();
      CHECK(w);
    }
    SECTION("the connection's release") {
      conn.reset();
      gone();
      CHECK_FALSE(w);
      CHECK(fake.alive("mr") == 2);  // the flush buffer and the region
    }
    SECTION("the region's deregistration") {
      const auto deregistering = fake.mark();
      REQUIRE(std::move(*mr).dereg());
      CHECK(fake.calls_since(deregistering) ==
            std::vector<std::string>{"ibv_dereg_mr", "ibv_dereg_mr", "ibv_dereg_mr"});
      gone();
      CHECK_FALSE(w);
    }
  }
  fake.expect_clean();
}

TEST_CASE("a grant by registration: its ibv_reg_mr and ibv_dereg_mr fail in turn; nothing stays "
          "registered",
          "[grant][fail-each]") {
  for (int err : {kErr, ENOMEM}) {
    fail_each_call({"ibv_reg_mr"}, err, [](fake::FakeProvider& fake, Probe& probe) {
      Peer peer = open_peer(fake);
      Conn conn = connected(fake, peer);
      Buffer buf(256);
      auto mr = MrLocal::reg(peer, buf.data(), buf.size, remote_rw, MrScope::grants_by_registration);
      REQUIRE(mr);
      probe.begin();
      auto g = Grant::make(conn, *mr, 0, 128, remote_rw);
      probe.end();
      if (!probe.check_outcome(g)) return;
      CHECK(fake.alive("mr") == 2);  // the flush buffer and the region
      CHECK(Grant::make(conn, *mr, 0, 64, MrUsage::read_src));
    });
  }
  fail_each_call({"ibv_dereg_mr"}, kErr, [](fake::FakeProvider& fake, Probe& probe) {
    Peer peer = open_peer(fake);
    Conn conn = connected(fake, peer);
    Buffer buf(256);
    auto mr = MrLocal::reg(peer, buf.data(), buf.size, remote_rw, MrScope::grants_by_registration);
    REQUIRE(mr);
    Grant g = grant(conn, *mr, 8, 8);
    probe.begin();
    auto revoked = std::move(g).revoke();
    probe.end();
    CHECK_FALSE(g);
    probe.check_outcome(revoked);
    CHECK(fake.alive("mr") == 2);
  });
}

TEST_CASE("Grant::make over a whole region: a type 2 window bound to the connection's queue pair, "
          "with the rights asked for and a random key byte",
          "[grant]") {
  fake::FakeProvider fake;
  {
    Peer peer = open_peer(fake);
    Conn conn = connected(fake, peer);
    Conn other = connected(fake, peer);
    Buffer buf(4096);
    MrLocal mr = reg_for_grants(peer, buf);
    fake.random_bytes({0xc3});
    const auto mark = fake.mark();
    Grant g = grant(conn, mr, 0, buf.size, MrUsage::read_src);
    CHECK(fake.calls_since(mark) == std::vector<std::string>{"ibv_alloc_mw", "getrandom", "ibv_post_send"});
    CHECK(g);

    const auto windows = fake.windows();
    REQUIRE(windows.size() == 1);
    const fake::Window& w = windows[0];
    CHECK(w.type == IBV_MW_TYPE_2);
    CHECK(w.bound);
    CHECK(w.qp == *conn.qp());
    CHECK(w.mr == *mr.native());
    CHECK(w.addr == address_of(buf));
    CHECK(w.length == buf.size);
    CHECK(w.access == IBV_ACCESS_REMOTE_READ);
    CHECK((w.rkey & 0xff) == 0xc3);

    const auto posted = fake.posted();
    REQUIRE(posted.size() == 1);
    CHECK(posted[0].opcode == IBV_WR_BIND_MW);
    CHECK(posted[0].wr_id == Grant::bind_wr_id);
    CHECK((posted[0].send_flags & IBV_SEND_SIGNALED) != 0);  // rpmapp learns it ran
    CHECK(posted[0].sge.empty());
    complete_binds(fake, conn);

    const MrRemote r = remote_of(g);
    CHECK(r.address() == address_of(buf));
    CHECK(r.size() == buf.size);
    CHECK(r.rkey() == w.rkey);
    CHECK(r.usage() == MrUsage::read_src);
    // the responder's view: this connection may read, not write; no other connection may
    CHECK(fake.remote_access(qp_num(conn), r.rkey(), r.address(), buf.size, IBV_ACCESS_REMOTE_READ));
    CHECK_FALSE(fake.remote_access(qp_num(conn), r.rkey(), r.address(), 8, IBV_ACCESS_REMOTE_WRITE));
    CHECK_FALSE(fake.remote_access(qp_num(other), r.rkey(), r.address(), 8, IBV_ACCESS_REMOTE_READ));

    // a write grant gives REMOTE_WRITE only (and the region has LOCAL_WRITE for it)
    auto writable_made = Grant::make(other, mr, 0, buf.size, MrUsage::write_dst, 0x77);
    REQUIRE(writable_made);
    Grant writable = std::move(*writable_made);
    CHECK(fake.posted().back().wr_id == 0x77);
    complete_binds(fake, other, 1, 0x77);
    CHECK(fake.windows().back().access == IBV_ACCESS_REMOTE_WRITE);
    CHECK(fake.remote_access(qp_num(other), remote_of(writable).rkey(), address_of(buf), 8,
                             IBV_ACCESS_REMOTE_WRITE));
    // nothing was recorded as a bind the kernel refuses
    CHECK(fake.failures().empty());
  }
  fake.expect_clean();
}

TEST_CASE("Grant::make over part of a region: a registration of the range under the window, so "
          "that the bounds the device checks are the grant's",
          "[grant]") {
  fake::FakeProvider fake;
  {
    Peer peer = open_peer(fake);
    Conn conn = connected(fake, peer);
    Buffer buf(4096);
    MrLocal mr = reg_for_grants(peer, buf);
    const auto mark = fake.mark();
    Grant g = grant(conn, mr, 1000, 100);
    CHECK(fake.calls_since(mark) ==
          std::vector<std::string>{"ibv_reg_mr", "ibv_alloc_mw", "getrandom", "ibv_post_send"});
    const fake::Registration part = fake.registrations().back();
    CHECK(part.addr == buf.data() + 1000);
    CHECK(part.length == 100);
    CHECK(part.access == (IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_MW_BIND));
    CHECK(fake.windows().at(0).mr == part.mr);
    const MrRemote r = remote_of(g);
    CHECK(r.address() == address_of(buf, 1000));
    CHECK(r.size() == 100);
    CHECK(r.usage() == remote_rw);
    const auto n = qp_num(conn);
    CHECK(fake.remote_access(n, r.rkey(), r.address(), 100, IBV_ACCESS_REMOTE_WRITE));
    CHECK(fake.remote_access(n, r.rkey(), r.address(), 100, IBV_ACCESS_REMOTE_READ));
    // one byte outside the range, on either side
    CHECK_FALSE(fake.remote_access(n, r.rkey(), r.address() - 1, 1, IBV_ACCESS_REMOTE_READ));
    CHECK_FALSE(fake.remote_access(n, r.rkey(), r.address() + 100, 1, IBV_ACCESS_REMOTE_READ));
    CHECK_FALSE(fake.remote_access(n, r.rkey(), r.address(), 101, IBV_ACCESS_REMOTE_WRITE));
    CHECK(fake.alive("mr") == 3);  // the flush buffer, the region, the range
  }
  fake.expect_clean();
}

TEST_CASE("a grant is revoked by revoke(), by its destruction, by its connection's release and by "
          "its region's deregistration, whichever is first",
          "[grant]") {
  fake::FakeProvider fake;
  {
    Peer peer = open_peer(fake);
    Buffer buf(4096);
    std::optional<Conn> conn(connected(fake, peer));
    std::optional<MrLocal> mr(reg_for_grants(peer, buf));
    Grant g = grant(*conn, *mr, 0, 512);
    complete_binds(fake, *conn);
    const MrRemote r = remote_of(g);
    const auto n = qp_num(*conn);
    REQUIRE(fake.remote_access(n, r.rkey(), r.address(), 8, IBV_ACCESS_REMOTE_READ));
    auto gone = [&] {
      CHECK_FALSE(g);
      CHECK(fake.windows().empty());
      CHECK(fake.alive("mw") == 0);
      CHECK_FALSE(fake.remote_access(n, r.rkey(), r.address(), 8, IBV_ACCESS_REMOTE_READ));
      auto d = g.descriptor();
      REQUIRE_FALSE(d);
      check_inval(d.error(), "Grant::descriptor", "revoked");
    };
    SECTION("revoke()") {
      const auto mark = fake.mark();
      REQUIRE(std::move(g).revoke());
      CHECK(fake.calls_since(mark) == std::vector<std::string>{"ibv_dealloc_mw", "ibv_dereg_mr"});
      gone();
      auto again = std::move(g).revoke();
      REQUIRE_FALSE(again);
      check_inval(again.error(), "Grant::revoke");
    }
    SECTION("destruction, and a move-assignment over it") {
      Grant second = grant(*conn, *mr, 512, 512);
      complete_binds(fake, *conn);
      { Grant taken = std::move(g); }
      CHECK(fake.windows().size() == 1);
      second = Grant();
      gone();
    }
    SECTION("the connection's release: the windows go before its queue pair") {
      const auto mark = fake.mark();
      conn.reset();
      const auto calls = fake.calls_since(mark);
      REQUIRE(calls.size() >= 3);
      CHECK(calls[0] == "ibv_dealloc_mw");
      CHECK(calls[1] == "ibv_dereg_mr");
      CHECK(calls[2] == "ibv_destroy_qp");
      gone();
      CHECK(std::move(g).revoke());  // already revoked: nothing to do
    }
    SECTION("Conn::close") {
      REQUIRE(std::move(*conn).close());
      gone();
    }
    SECTION("the region's deregistration: the grants first, then the region") {
      const auto mark = fake.mark();
      REQUIRE(std::move(*mr).dereg());
      CHECK(fake.calls_since(mark) ==
            std::vector<std::string>{"ibv_dealloc_mw", "ibv_dereg_mr", "ibv_dereg_mr"});
      gone();
    }
    SECTION("the region's destruction") {
      mr.reset();
      gone();
      CHECK(fake.alive("mr") == 1);  // the flush buffer
    }
  }
  fake.expect_clean();
}

TEST_CASE("Grant::make: bad arguments are inval and call nothing", "[grant]") {
  fake::FakeProvider fake;
  {
    Peer peer = open_peer(fake);
    Peer other_peer = open_peer(fake, 1);
    Conn conn = connected(fake, peer);
    Buffer buf(256);
    MrLocal mr = reg_for_grants(peer, buf, MrUsage::read_src | MrUsage::recv);
    MrLocal shared = reg(peer, buf, MrUsage::read_src);
    MrLocal elsewhere = reg_for_grants(other_peer, buf);
    Conn empty;
    MrLocal no_region;
    const auto mark = fake.mark();
    auto refused = [&](expected<Grant> g, std::string_view words) {
      REQUIRE_FALSE(g);
      check_inval(g.error(), "Grant::make", words);
    };
    refused(Grant::make(empty, mr, 0, 8, MrUsage::read_src), "empty");
    refused(Grant::make(conn, no_region, 0, 8, MrUsage::read_src), "empty");
    refused(Grant::make(conn, shared, 0, 8, MrUsage::read_src), "MrScope::peer");
    refused(Grant::make(conn, elsewhere, 0, 8, MrUsage::read_src), "another Peer");
    refused(Grant::make(conn, mr, 0, 0, MrUsage::read_src), "not within");
    refused(Grant::make(conn, mr, 200, 57, MrUsage::read_src), "not within");
    refused(Grant::make(conn, mr, 1, ~std::size_t{0}, MrUsage::read_src), "not within");
    refused(Grant::make(conn, mr, 0, 8, MrUsage{}), "remote usages");
    refused(Grant::make(conn, mr, 0, 8, MrUsage::read_src | MrUsage::recv), "remote usages");
    refused(Grant::make(conn, mr, 0, 8, MrUsage::write_dst), "not registered for usage 0x08");
    CHECK(fake.calls_since(mark).empty());
    CHECK(fake.windows().empty());
  }
  fake.expect_clean();
}

TEST_CASE("Grant::make and revoke: each provider call fails in turn; nothing stays bound or "
          "registered, and the connection still grants",
          "[grant][fail-each]") {
  for (int err : {kErr, ENOMEM}) {
    for (bool part : {false, true}) {
      INFO("a part of the region: " << part);
      std::vector<std::string> calls = {"ibv_alloc_mw", "getrandom", "ibv_post_send"};
      if (part) calls.insert(calls.begin(), "ibv_reg_mr");
      fail_each_call(calls, err, [part](fake::FakeProvider& fake, Probe& probe) {
        Peer peer = open_peer(fake);
        Conn conn = connected(fake, peer);
        Buffer buf(256);
        MrLocal mr = reg_for_grants(peer, buf);
        probe.begin();
        auto g = Grant::make(conn, mr, 0, part ? 128 : buf.size, remote_rw);
        probe.end();
        if (!probe.check_outcome(g)) return;
        CHECK(fake.windows().empty());
        CHECK(fake.alive("mr") == 2);  // the flush buffer and the region
        CHECK(fake.failures().empty());
        CHECK(Grant::make(conn, mr, 0, 64, MrUsage::read_src));
      });
    }
  }
  fail_each_call({"ibv_dealloc_mw", "ibv_dereg_mr"}, kErr, [](fake::FakeProvider& fake, Probe& probe) {
    Peer peer = open_peer(fake);
    Conn conn = connected(fake, peer);
    Buffer buf(256);
    MrLocal mr = reg_for_grants(peer, buf);
    Grant g = grant(conn, mr, 8, 8);
    complete_binds(fake, conn);
    probe.begin();
    auto revoked = std::move(g).revoke();
    probe.end();
    CHECK_FALSE(g);
    probe.check_outcome(revoked);
    CHECK(fake.windows().empty());
    CHECK(fake.alive("mr") == 2);
  });
}

TEST_CASE("a grant revoked before its bind's completion was read is released when it is; "
          "descriptor() is gone at once",
          "[grant]") {
  fake::FakeProvider fake;
  {
    Peer peer = open_peer(fake);
    Conn conn = connected(fake, peer);
    Buffer buf(256);
    MrLocal mr = reg_for_grants(peer, buf);
    Grant kept = grant(conn, mr, 0, 64);
    Grant g = grant(conn, mr, 64, 64);
    const auto mark = fake.mark();
    REQUIRE(std::move(g).revoke());
    CHECK(fake.calls_since(mark).empty());  // deallocating now would fail the bind
    CHECK(fake.windows().size() == 2);
    auto d = g.descriptor();
    REQUIRE_FALSE(d);
    complete_binds(fake, conn, 2);  // both binds: the revoked grant goes, the other stays
    const auto windows = fake.windows();
    REQUIRE(windows.size() == 1);
    CHECK(windows[0].addr == address_of(buf));
    CHECK(kept);
    CHECK(fake.alive("mr") == 3);  // the flush buffer, the region, the kept grant's range
    CHECK(fake.failures().empty());  // the device ran both binds
  }
  fake.expect_clean();
}

TEST_CASE("a failed completion settles the pending binds (the queue pair is in error: they "
          "will not run); a broken connection's bind is flushed with its context",
          "[grant]") {
  fake::FakeProvider fake;
  {
    Peer peer = open_peer(fake);
    Buffer buf(256);
    MrLocal mr = reg_for_grants(peer, buf);
    SECTION("a grant revoked, then a work request of the connection fails") {
      Conn conn = connected(fake, peer);
      Grant g = grant(conn, mr, 0, 64);
      REQUIRE(std::move(g).revoke());
      CHECK(fake.windows().size() == 1);
      fake.add_completion(*(*conn.cq()).native(), completion(0x99, IBV_WC_RETRY_EXC_ERR));
      std::array<ibv_wc, 4> wc{};
      REQUIRE((*conn.cq()).get(wc));
      CHECK(fake.windows().empty());  // released by the completion's read
    }
    SECTION("Grant::make on a disconnected connection") {
      Conn conn = connected(fake, peer);
      REQUIRE(conn.disconnect());
      Grant g = grant(conn, mr, 0, buf.size);
      std::array<ibv_wc, 2> wc{};
      auto got = (*conn.cq()).get(wc);
      REQUIRE(got);
      REQUIRE(got->size() == 1);
      CHECK(wc[0].wr_id == Grant::bind_wr_id);
      CHECK(wc[0].status == IBV_WC_WR_FLUSH_ERR);
      CHECK_FALSE(fake.windows().at(0).bound);
      const auto mark = fake.mark();
      REQUIRE(std::move(g).revoke());  // settled by the flush: released at once
      CHECK(fake.calls_since(mark) == std::vector<std::string>{"ibv_dealloc_mw"});
    }
  }
  fake.expect_clean();
}

TEST_CASE("the region deregistered while a grant's bind is pending: the grant goes at once, and "
          "that bind fails (only its connection sees it)",
          "[grant]") {
  fake::FakeProvider fake;
  {
    Peer peer = open_peer(fake);
    Conn conn = connected(fake, peer);
    Buffer buf(256);
    std::optional<MrLocal> mr(reg_for_grants(peer, buf));
    Grant g = grant(conn, *mr, 0, buf.size);
    REQUIRE(std::move(*mr).dereg());
    CHECK(fake.windows().empty());
    CHECK_FALSE(g);
    CHECK(fake.complete_sends(*conn.qp()) == 1);
    std::array<ibv_wc, 2> wc{};
    auto got = (*conn.cq()).get(wc);
    REQUIRE(got);
    CHECK(wc[0].status == IBV_WC_MW_BIND_ERR);
  }
  fake.expect_clean();
}

TEST_CASE("grants revoked on one thread while their connection is released on another",
          "[grant][threads]") {
  fake::FakeProvider fake;
  {
    Peer peer = open_peer(fake);
    Buffer buf(4096);
    MrLocal mr = reg_for_grants(peer, buf);
    for (int round = 0; round < 20; ++round) {
      Conn conn = connected(fake, peer);
      std::vector<Grant> grants;
      for (std::size_t i = 0; i < 8; ++i) grants.push_back(grant(conn, mr, i * 512, 512));
      complete_binds(fake, conn, 8);  // settled: the revoker releases them itself
      std::thread revoker([&] {
        for (auto& g : grants) (void)std::move(g).revoke();
      });
      { Conn closing = std::move(conn); }
      revoker.join();
      CHECK(fake.windows().empty());
    }
    CHECK(fake.failures().empty());
  }
  fake.expect_clean();
}

TEST_CASE("an EventLoop's completion handler settles grants as Cq::get does", "[grant][event_loop]") {
  fake::FakeProvider fake;
  {
    Peer peer = open_peer(fake);
    Conn conn = connected(fake, peer);
    Buffer buf(256);
    MrLocal mr = reg_for_grants(peer, buf);
    EventLoop loop = make_loop();
    std::vector<int> opcodes;
    auto reg = registered(loop.watch_completions(conn, [&](expected<std::span<const ibv_wc>> batch) {
      REQUIRE(batch);
      for (const ibv_wc& wc : *batch) opcodes.push_back(wc.opcode);
    }));
    Grant g = grant(conn, mr, 0, 128);
    REQUIRE(std::move(g).revoke());
    CHECK(fake.windows().size() == 1);  // the bind has not completed
    CHECK(fake.complete_sends(*conn.qp()) == 1);
    CHECK(ran(loop.run_once(0ms)) == 1);
    CHECK(opcodes == std::vector<int>{IBV_WC_BIND_MW});
    CHECK(fake.windows().empty());
    CHECK(fake.failures().empty());
  }
  CHECK(fake.closed_while_watched() == 0);
  fake.expect_clean();
}

}  // namespace grant_test
