// MrLocal: registration (librpma's usage -> access mapping, the iWARP rule, the ODP retry),
// argument checks, provider failures, deregistration, descriptors and advice.
#include "data_util.hpp"

namespace mr_test {

using namespace test;

namespace {

const MrUsage every_bit[] = {MrUsage::read_src,  MrUsage::read_dst,         MrUsage::write_src,
                             MrUsage::write_dst, MrUsage::flush_visibility, MrUsage::flush_persistent,
                             MrUsage::send,      MrUsage::recv};

// librpma 1.2's rpma_peer_usage2access, bit by bit, written out here so that the
// library's mapping is checked against it (not against itself).
int librpma_access(MrUsage bit, bool iwarp) {
  switch (bit) {
    case MrUsage::read_src: return IBV_ACCESS_REMOTE_READ;
    case MrUsage::read_dst:
      return IBV_ACCESS_LOCAL_WRITE | (iwarp ? IBV_ACCESS_REMOTE_WRITE : 0);
    case MrUsage::write_src: return IBV_ACCESS_LOCAL_WRITE;
    case MrUsage::write_dst: return IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_LOCAL_WRITE;
    case MrUsage::flush_visibility: return IBV_ACCESS_REMOTE_READ;
    case MrUsage::flush_persistent: return IBV_ACCESS_REMOTE_READ;
    case MrUsage::send: return 0;
    case MrUsage::recv: return IBV_ACCESS_LOCAL_WRITE;
  }
  return -1;
}

int librpma_access(std::uint8_t usage, bool iwarp) {
  int access = 0;
  for (MrUsage bit : every_bit)
    if (usage & to_underlying(bit)) access |= librpma_access(bit, iwarp);
  return access;
}

}  // namespace

TEST_CASE("MrLocal::reg: each usage bit maps to librpma's access flags", "[mr]") {
  for (bool iwarp : {false, true}) {
    INFO("iwarp " << iwarp);
    fake::FakeProvider fake;
    fake::DeviceCaps caps;
    caps.transport = iwarp ? IBV_TRANSPORT_IWARP : IBV_TRANSPORT_IB;
    fake.set_caps(0, caps);
    {
      Peer peer = open_peer(fake);
      Buffer buf(64);
      // every bit alone, then every combination of them
      for (unsigned usage = 1; usage <= 0xff; ++usage) {
        INFO("usage 0x" << std::hex << usage);
        const std::size_t before = fake.registrations().size();
        auto mr = MrLocal::reg(peer, buf.data() + 8, 40, static_cast<MrUsage>(usage));
        REQUIRE(mr);
        const auto regs = fake.registrations();
        REQUIRE(regs.size() == before + 1);  // no retry
        const auto& r = regs.back();
        CHECK(r.access == librpma_access(static_cast<std::uint8_t>(usage), iwarp));
        CHECK(r.pd == *peer.pd());
        CHECK(r.addr == buf.data() + 8);
        CHECK(r.length == 40);
        CHECK(*mr->ptr() == buf.data() + 8);
        CHECK(*mr->size() == 40);
        CHECK(to_underlying(*mr->usage()) == usage);
        ibv_mr* raw = *mr->native();
        CHECK(raw == r.mr);
        CHECK(raw->pd == *peer.pd());
        CHECK(raw->addr == buf.data() + 8);
        CHECK(raw->length == 40);
        CHECK(raw->lkey != raw->rkey);
        CHECK(fake.alive("mr") == 2);  // with the Peer's flush buffer
      }
      CHECK(fake.alive("mr") == 1);
    }
    fake.expect_clean();
  }
}

TEST_CASE("MrLocal::reg: the iWARP rule: a READ destination also gets REMOTE_WRITE", "[mr]") {
  fake::FakeProvider fake;
  fake::DeviceCaps caps;
  caps.transport = IBV_TRANSPORT_IWARP;
  fake.set_caps(1, caps);
  {
    Peer ib = open_peer(fake, 0);
    Peer iwarp = open_peer(fake, 1);
    Buffer buf(16);
    auto a = reg(ib, buf, MrUsage::read_dst);
    auto b = reg(iwarp, buf, MrUsage::read_dst);
    const auto regs = fake.registrations();
    CHECK(regs[regs.size() - 2].access == IBV_ACCESS_LOCAL_WRITE);
    CHECK(regs.back().access == (IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE));
  }
  fake.expect_clean();
}

TEST_CASE("MrLocal::reg: keys are distinct across registrations", "[mr]") {
  fake::FakeProvider fake;
  {
    Peer peer = open_peer(fake);
    Buffer buf(32);
    std::vector<MrLocal> mrs;
    std::set<std::uint32_t> keys;
    for (int i = 0; i < 8; ++i) {
      mrs.push_back(reg(peer, buf, MrUsage::write_dst));
      keys.insert((*mrs.back().native())->lkey);
      keys.insert((*mrs.back().native())->rkey);
    }
    CHECK(keys.size() == 16);
  }
  fake.expect_clean();
}

TEST_CASE("MrLocal::reg: memory refused with EOPNOTSUPP is retried with ODP when supported", "[mr][odp]") {
  SECTION("ODP for RC read and write: retried, and registered") {
    fake::FakeProvider fake;
    fake.set_caps(0, fake::DeviceCaps::with_odp());
    {
      Peer peer = open_peer(fake);
      CHECK(*peer.odp_capable());
      Buffer buf(64);
      fake.needs_odp(buf.data());
      auto mr = MrLocal::reg(peer, buf.data(), buf.size, MrUsage::write_dst | MrUsage::read_src);
      REQUIRE(mr);
      const auto regs = fake.registrations();
      REQUIRE(regs.size() == 3);  // flush buffer, refused, retried
      const int access = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ;
      CHECK(regs[1].access == access);
      CHECK(regs[1].err == EOPNOTSUPP);
      CHECK(regs[2].access == (access | IBV_ACCESS_ON_DEMAND));
      CHECK(regs[2].mr == *mr->native());
    }
    fake.expect_clean();
  }
  SECTION("the retry fails: its errno, and the reason says it was the ODP retry") {
    fake::FakeProvider fake;
    fake.set_caps(0, fake::DeviceCaps::with_odp());
    {
      Peer peer = open_peer(fake);
      Buffer buf(64);
      fake.needs_odp(buf.data());
      fake.fail("ibv_reg_mr", kErr, 2);
      auto mr = MrLocal::reg(peer, buf.data(), buf.size, MrUsage::recv);
      REQUIRE_FALSE(mr);
      check_injected(mr.error(), "ibv_reg_mr", kErr);
      CHECK_THAT(mr.error().message(), Catch::Contains("IBV_ACCESS_ON_DEMAND"));
      CHECK(fake.alive("mr") == 1);
    }
    fake.expect_clean();
  }
  SECTION("without ODP (or with ODP for reads only) there is no retry")
  for (auto caps : {fake::DeviceCaps{}, [] {
                      auto c = fake::DeviceCaps::with_odp();
                      c.rc_odp_caps = IBV_ODP_SUPPORT_READ;  // no ODP write: librpma says no
                      return c;
                    }()}) {
    fake::FakeProvider fake;
    fake.set_caps(0, caps);
    {
      Peer peer = open_peer(fake);
      CHECK_FALSE(*peer.odp_capable());
      Buffer buf(64);
      fake.needs_odp(buf.data());
      auto mr = MrLocal::reg(peer, buf.data(), buf.size, MrUsage::recv);
      REQUIRE_FALSE(mr);
      check_injected(mr.error(), "ibv_reg_mr", EOPNOTSUPP);
      CHECK(fake.registrations().size() == 2);  // no retry without ODP
    }
    fake.expect_clean();
  }
  SECTION("another errno is not retried, even with ODP") {
    fake::FakeProvider fake;
    fake.set_caps(0, fake::DeviceCaps::with_odp());
    {
      Peer peer = open_peer(fake);
      Buffer buf(64);
      fake.fail("ibv_reg_mr", EFAULT);
      auto mr = MrLocal::reg(peer, buf.data(), buf.size, MrUsage::recv);
      REQUIRE_FALSE(mr);
      check_injected(mr.error(), "ibv_reg_mr", EFAULT);
      CHECK(fake.registrations().size() == 2);
    }
    fake.expect_clean();
  }
}

TEST_CASE("Peer::open: the device's ODP and atomic-write capabilities", "[mr][peer]") {
  fake::FakeProvider fake;
  auto caps = fake::DeviceCaps::with_odp();
  caps.device_cap_flags_ex = fake::DeviceCaps::atomic_write_flag;
  fake.set_caps(1, caps);
  {
    Peer plain = open_peer(fake, 0);
    Peer rich = open_peer(fake, 1);
    CHECK_FALSE(*plain.odp_capable());
    CHECK_FALSE(*plain.native_atomic_write());
    CHECK(*rich.odp_capable());
    // (only where the build's rdma-core can post it: 44 on)
    CHECK(*rich.native_atomic_write() == rpmapp::detail::build_has_native_atomic_write);
  }
  fake.expect_clean();
}

TEST_CASE("MrLocal::reg: bad arguments are inval before any provider call", "[mr][inval]") {
  fake::FakeProvider fake;
  {
    Peer peer = open_peer(fake);
    Buffer buf(16);
    const auto mark = fake.mark();
    auto null = MrLocal::reg(peer, nullptr, 16, MrUsage::send);
    REQUIRE_FALSE(null);
    check_inval(null.error(), "MrLocal::reg", "null");
    auto empty = MrLocal::reg(peer, buf.data(), 0, MrUsage::send);
    REQUIRE_FALSE(empty);
    check_inval(empty.error(), "MrLocal::reg", "size");
    auto no_usage = MrLocal::reg(peer, buf.data(), 16, MrUsage{});
    REQUIRE_FALSE(no_usage);
    check_inval(no_usage.error(), "MrLocal::reg", "usage");
    auto span = MrLocal::reg(peer, std::span<std::byte>(), MrUsage::send);
    REQUIRE_FALSE(span);
    check_inval(span.error(), "MrLocal::reg");
    Peer moved = std::move(peer);
    auto from_moved = MrLocal::reg(peer, buf.data(), 16, MrUsage::send);
    REQUIRE_FALSE(from_moved);
    check_inval(from_moved.error(), "MrLocal::reg");
    CHECK(fake.calls_since(mark).empty());
  }
  fake.expect_clean();
}

TEST_CASE("MrLocal::reg and dereg: each provider call fails in turn", "[mr][fail-each]") {
  for (int err : {kErr, ENOMEM, EFAULT}) {
    fail_each_call({"ibv_reg_mr"}, err, [](fake::FakeProvider& fake, Probe& probe) {
      Peer peer = open_peer(fake);
      Buffer buf(32, std::byte{0x11});
      probe.begin();
      auto mr = MrLocal::reg(peer, buf.data(), buf.size, MrUsage::write_dst);
      probe.end();
      if (!probe.check_outcome(mr)) return;
      CHECK(fake.alive("mr") == 1);  // the flush buffer only: nothing leaked
      for (std::size_t i = 0; i < buf.size; ++i) CHECK(buf.data()[i] == std::byte{0x11});
      CHECK(*peer.pd() != nullptr);  // the Peer is still usable
      CHECK(MrLocal::reg(peer, buf.data(), buf.size, MrUsage::write_dst));
    });
  }
  fail_each_call({"ibv_dereg_mr"}, kErr, [](fake::FakeProvider& fake, Probe& probe) {
    Peer peer = open_peer(fake);
    Buffer buf(32);
    MrLocal mr = reg(peer, buf, MrUsage::recv);
    probe.begin();
    auto done = std::move(mr).dereg();
    probe.end();
    CHECK_FALSE(mr);  // empty whatever the result
    probe.check_outcome(done);
    CHECK(fake.alive("mr") == 1);
  });
}

TEST_CASE("MrLocal::dereg: the errno ibv_dereg_mr returns; a second dereg is inval", "[mr]") {
  fake::FakeProvider fake;
  {
    Peer peer = open_peer(fake);
    Buffer buf(32);
    MrLocal mr = reg(peer, buf, MrUsage::recv);
    fake.fail("ibv_dereg_mr", EBUSY);
    errno = 0;
    auto done = std::move(mr).dereg();
    REQUIRE_FALSE(done);
    check_injected(done.error(), "ibv_dereg_mr", EBUSY);
    const auto mark = fake.mark();
    auto again = std::move(mr).dereg();
    REQUIRE_FALSE(again);
    check_inval(again.error(), "MrLocal::dereg");
    CHECK(fake.calls_since(mark).empty());
  }
  fake.expect_clean();
}

TEST_CASE("MrLocal keeps the protection domain alive after its Peer is closed", "[mr]") {
  fake::FakeProvider fake;
  Buffer buf(32);
  std::optional<MrLocal> mr;
  {
    Peer peer = open_peer(fake);
    mr.emplace(reg(peer, buf, MrUsage::send));
    CHECK(std::move(peer).close());
  }
  CHECK(fake.alive("pd") == 1);
  CHECK(fake.alive("mr") == 2);
  mr.reset();  // deregisters both, then deallocates the pd (the fake records any other order)
  fake.expect_clean();
}

TEST_CASE("a moved-from MrLocal: every call is inval and calls nothing", "[mr][moved]") {
  fake::FakeProvider fake;
  {
    Peer peer = open_peer(fake);
    Buffer buf(32);
    MrLocal mr = reg(peer, buf, MrUsage::send);
    MrLocal other = std::move(mr);
    CHECK_FALSE(mr);
    const auto mark = fake.mark();
    check_inval(mr.ptr().error(), "MrLocal::ptr");
    check_inval(mr.size().error(), "MrLocal::size");
    check_inval(mr.usage().error(), "MrLocal::usage");
    check_inval(mr.native().error(), "MrLocal::native");
    check_inval(mr.descriptor().error(), "MrLocal::descriptor");
    Poisoned out;
    check_inval(mr.write_descriptor(out.span()).error(), "MrLocal::write_descriptor");
    CHECK(out.untouched());
    check_inval(mr.advise(0, 8, IBV_ADVISE_MR_ADVICE_PREFETCH).error(), "MrLocal::advise");
    check_inval(std::move(mr).dereg().error(), "MrLocal::dereg");
    CHECK(fake.calls_since(mark).empty());
  }
  fake.expect_clean();
}

TEST_CASE("MrLocal::descriptor: librpma's 21 bytes, little-endian", "[mr][descriptor]") {
  fake::FakeProvider fake;
  {
    Peer peer = open_peer(fake);
    Buffer buf(300);
    MrLocal mr = reg(peer, buf, MrUsage::write_dst | MrUsage::flush_persistent);
    const ibv_mr* raw = *mr.native();
    const auto d = *mr.descriptor();
    REQUIRE(d.size() == 21);
    const auto addr = addr_of(buf.data());
    for (int i = 0; i < 8; ++i) CHECK(std::to_integer<std::uint64_t>(d[i]) == ((addr >> (8 * i)) & 0xff));
    const std::uint8_t len_bytes[8] = {0x2c, 0x01, 0, 0, 0, 0, 0, 0};  // 300
    for (int i = 0; i < 8; ++i) CHECK(std::to_integer<std::uint8_t>(d[8 + i]) == len_bytes[i]);
    for (int i = 0; i < 4; ++i)
      CHECK(std::to_integer<std::uint32_t>(d[16 + i]) == ((raw->rkey >> (8 * i)) & 0xff));
    CHECK(std::to_integer<std::uint8_t>(d[20]) == (8 | 32));
    CHECK(d == descriptor_of(addr, 300, raw->rkey, 8 | 32));

    SECTION("write_descriptor: exactly the descriptor, nothing past it") {
      Poisoned out;
      auto n = mr.write_descriptor(out.span().first(30));
      REQUIRE(n);
      CHECK(*n == 21);
      CHECK(std::equal(d.begin(), d.end(), out.bytes.begin()));
      for (std::size_t i = 21; i < out.bytes.size(); ++i) CHECK(out.bytes[i] == std::byte{0xAB});
    }
    SECTION("write_descriptor: a buffer too small is inval and left untouched") {
      Poisoned out;
      auto n = mr.write_descriptor(out.span().first(20));
      REQUIRE_FALSE(n);
      check_inval(n.error(), "MrLocal::write_descriptor", "too small");
      CHECK(out.untouched());
      CHECK_FALSE(mr.write_descriptor(std::span<std::byte>()));
      CHECK(out.untouched());
    }
  }
  fake.expect_clean();
}

TEST_CASE("MrLocal::advise: the range and ibv_advise_mr's errors", "[mr][advise]") {
  fake::FakeProvider fake;
  fake.set_caps(0, fake::DeviceCaps::with_odp());
  {
    Peer peer = open_peer(fake);
    Buffer buf(4096);
    MrLocal mr = reg(peer, buf, MrUsage::write_dst);
    const ibv_mr* raw = *mr.native();

    REQUIRE(mr.advise(100, 200, IBV_ADVISE_MR_ADVICE_PREFETCH_WRITE, IBV_ADVISE_MR_FLAG_FLUSH));
    auto advices = fake.advices();
    REQUIRE(advices.size() == 1);
    CHECK(advices[0].pd == *peer.pd());
    CHECK(advices[0].advice == IBV_ADVISE_MR_ADVICE_PREFETCH_WRITE);
    CHECK(advices[0].flags == IBV_ADVISE_MR_FLAG_FLUSH);
    REQUIRE(advices[0].sge.size() == 1);
    CHECK(advices[0].sge[0].addr == addr_of(buf.data()) + 100);
    CHECK(advices[0].sge[0].length == 200);
    CHECK(advices[0].sge[0].lkey == raw->lkey);
    CHECK(advices[0].result == 0);
    CHECK(mr.advise(0, 4096, IBV_ADVISE_MR_ADVICE_PREFETCH));  // the whole region

    const auto mark = fake.mark();
    for (auto [offset, len] : {std::pair<std::size_t, std::size_t>{0, 0}, {4096, 1}, {4000, 97},
                               {1, SIZE_MAX}, {SIZE_MAX, 2}}) {
      INFO("offset " << offset << " len " << len);
      check_inval(mr.advise(offset, len, IBV_ADVISE_MR_ADVICE_PREFETCH).error(), "MrLocal::advise");
    }
    CHECK(fake.calls_since(mark).empty());

    struct Case {
      int err;
      errc code;
    };
    for (auto c : {Case{EOPNOTSUPP, errc::nosupp}, Case{ENOTSUP, errc::nosupp},
                   Case{EINVAL, errc::inval}, Case{EFAULT, errc::inval},
                   Case{kErr, errc::provider}, Case{ENOMEM, errc::nomem}}) {
      INFO("errno " << c.err);
      fake.fail("ibv_advise_mr", c.err);
      auto advised = mr.advise(0, 8, IBV_ADVISE_MR_ADVICE_PREFETCH);
      REQUIRE_FALSE(advised);
      CHECK(advised.error().code() == c.code);
      CHECK(advised.error().sys_errno() == c.err);
      CHECK(advised.error().call() == "ibv_advise_mr");
    }
  }
  fake.expect_clean();
}

TEST_CASE("MrLocal::advise on a device without advice support is nosupp", "[mr][advise]") {
  fake::FakeProvider fake;  // no ODP: libibverbs gives EOPNOTSUPP (rxe has no advise_mr)
  {
    Peer peer = open_peer(fake);
    Buffer buf(64);
    MrLocal mr = reg(peer, buf, MrUsage::read_dst);
    auto advised = mr.advise(0, 64, IBV_ADVISE_MR_ADVICE_PREFETCH);
    REQUIRE_FALSE(advised);
    CHECK(advised.error().code() == errc::nosupp);
    CHECK(advised.error().sys_errno() == EOPNOTSUPP);
  }
  fake.expect_clean();
}

}  // namespace mr_test
