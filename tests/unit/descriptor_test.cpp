// MrRemote::from_descriptor and PeerConfig descriptors: round trips, every malformed form,
// and random input: what from_descriptor accepts never makes an operation post outside the
// peer's region or without the usage it needs.
#include "data_util.hpp"

#include <random>

namespace descriptor_test {

using namespace test;

TEST_CASE("MrRemote::from_descriptor: a local region's descriptor round trips", "[descriptor]") {
  fake::FakeProvider fake;
  {
    Peer peer = open_peer(fake);
    Buffer buf(1000);
    for (MrUsage usage : {MrUsage::read_src, MrUsage::write_dst | MrUsage::flush_visibility,
                          MrUsage::flush_persistent | MrUsage::read_src, all_usages}) {
      MrLocal mr = reg(peer, buf, usage);
      auto r = MrRemote::from_descriptor(*mr.descriptor());
      REQUIRE(r);
      CHECK(*r);
      CHECK(r->address() == addr_of(buf.data()));
      CHECK(r->size() == 1000);
      CHECK(r->rkey() == (*mr.native())->rkey);
      CHECK(r->usage() == usage);
      CHECK(r->flush_type() == (usage & (MrUsage::flush_visibility | MrUsage::flush_persistent)));
      CHECK(r->descriptor() == *mr.descriptor());
    }
  }
  fake.expect_clean();
}

TEST_CASE("MrRemote::from_descriptor: extreme but valid values", "[descriptor]") {
  const std::uint64_t max = ~0ull;
  struct Case {
    std::uint64_t addr, len;
    std::uint32_t rkey;
    std::uint8_t usage;
  };
  for (auto c : {Case{0, 1, 0, 1}, Case{0, max, max & 0xffffffffu, 0xff}, Case{max - 1, 1, 7, 0x80},
                 Case{0x0102030405060708ull, 0x1112131415161718ull, 0x21222324u, 0x40}}) {
    auto r = MrRemote::from_descriptor(descriptor_of(c.addr, c.len, c.rkey, c.usage));
    REQUIRE(r);
    CHECK(r->address() == c.addr);
    CHECK(r->size() == c.len);
    CHECK(r->rkey() == c.rkey);
    CHECK(to_underlying(r->usage()) == c.usage);
    CHECK(r->descriptor() == descriptor_of(c.addr, c.len, c.rkey, c.usage));
  }
}

TEST_CASE("MrRemote::from_descriptor: every malformed form is inval", "[descriptor][inval]") {
  const auto good = descriptor_of(0x1000, 64, 5, 0x08);
  REQUIRE(MrRemote::from_descriptor(good));
  std::array<std::byte, 40> bytes{};
  std::copy(good.begin(), good.end(), bytes.begin());
  for (std::size_t size : {0u, 1u, 20u, 22u, 40u}) {
    INFO("size " << size);
    auto r = MrRemote::from_descriptor(std::span<const std::byte>(bytes.data(), size));
    REQUIRE_FALSE(r);
    check_inval(r.error(), "MrRemote::from_descriptor",
                "is " + std::to_string(size) + " bytes, not 21");
  }
  auto no_usage = MrRemote::from_descriptor(descriptor_of(0x1000, 64, 5, 0));
  REQUIRE_FALSE(no_usage);
  check_inval(no_usage.error(), "MrRemote::from_descriptor", "usage");
  auto no_length = MrRemote::from_descriptor(descriptor_of(0x1000, 0, 5, 0x08));
  REQUIRE_FALSE(no_length);
  check_inval(no_length.error(), "MrRemote::from_descriptor", "length");
  for (auto [addr, len] : {std::pair<std::uint64_t, std::uint64_t>{~0ull, 1}, {1, ~0ull},
                           {0x8000000000000000ull, 0x8000000000000000ull}, {~0ull, ~0ull}}) {
    auto r = MrRemote::from_descriptor(descriptor_of(addr, len, 5, 0x08));
    REQUIRE_FALSE(r);
    check_inval(r.error(), "MrRemote::from_descriptor", "overflows");
  }
  const MrRemote empty;
  CHECK_FALSE(empty);
  CHECK(empty.size() == 0);
  CHECK(to_underlying(empty.usage()) == 0);
}

namespace {
struct Op {
  MrUsage need;  // the usage the peer's region must have
  bool atomic = false;
};
}  // namespace

TEST_CASE("random descriptors and ranges: nothing posted outside the region or without its usage",
          "[descriptor][random]") {
  fake::FakeProvider fake;
  {
    Peer peer = open_peer(fake);
    ConnConfig cfg;
    cfg.sq_size = 4;
    Conn conn = connected(fake, peer, cfg);
    Buffer local(4096);
    MrLocal mr = reg(peer, local, all_usages);
    ibv_qp* qp = *conn.qp();
    const auto lkey = (*mr.native())->lkey;
    std::mt19937_64 rng(20261130);
    auto pick = [&](std::uint64_t size) -> std::uint64_t {  // offsets/lengths near the edges
      switch (rng() % 6) {
        case 0: return 0;
        case 1: return rng() % 16;
        case 2: return size;
        case 3: return size - std::min<std::uint64_t>(size, rng() % 16);
        case 4: return size + rng() % 16;
        default: return rng();
      }
    };
    std::size_t accepted = 0, posted = 0;
    for (int round = 0; round < 4000; ++round) {
      std::vector<std::byte> bytes(round % 5 == 0 ? rng() % 30 : 21);
      for (auto& b : bytes) b = static_cast<std::byte>(rng());
      if (round % 3 == 0 && bytes.size() == 21) {  // plausible regions too
        const auto d = descriptor_of(rng() >> (rng() % 64), 1 + rng() % 8192,
                                     static_cast<std::uint32_t>(rng()), static_cast<std::uint8_t>(rng()));
        std::copy(d.begin(), d.end(), bytes.begin());
      }
      auto r = MrRemote::from_descriptor(bytes);
      if (!r) {
        CHECK(r.error().code() == errc::inval);
        continue;
      }
      ++accepted;
      const std::uint64_t addr = r->address(), size = r->size();
      REQUIRE(size != 0);
      REQUIRE(addr + size >= addr);
      REQUIRE(to_underlying(r->usage()) != 0);
      CHECK(std::equal(bytes.begin(), bytes.end(), r->descriptor().begin()));
      if (rng() % 2) CHECK(conn.apply_remote_peer_config(PeerConfig{rng() % 2 == 0}));

      for (int k = 0; k < 3; ++k) {
        const std::uint64_t offset = pick(size);
        const std::uint64_t len = pick(size);
        const std::size_t local_len = static_cast<std::size_t>(std::min<std::uint64_t>(len, 4096));
        const auto before = fake.posted().size();
        Op op;
        expected<void> result;
        switch (rng() % 5) {
          case 0:
            op.need = MrUsage::read_src;
            result = conn.read(mr, 0, *r, offset, local_len, Completion::on_error);
            break;
          case 1:
            op.need = MrUsage::write_dst;
            result = conn.write(*r, offset, mr, 0, local_len, Completion::on_error);
            break;
          case 2:
            op.need = MrUsage::write_dst;
            result = conn.write_with_imm(*r, offset, mr, 0, local_len, 7, Completion::on_error);
            break;
          case 3: {
            op.need = MrUsage::write_dst;
            op.atomic = true;
            const std::array<std::byte, 8> value{};
            result = conn.atomic_write(*r, offset, value, Completion::on_error);
            break;
          }
          default: {
            const bool persistent = rng() % 2;
            op.need = persistent ? MrUsage::flush_persistent : MrUsage::flush_visibility;
            result = conn.flush(*r, offset, local_len,
                                persistent ? FlushType::persistent : FlushType::visibility,
                                Completion::on_error);
            break;
          }
        }
        const auto now = posted_since(fake, before);
        if (!result) {
          INFO(result.error().message());
          CHECK((result.error().code() == errc::inval || result.error().code() == errc::nosupp));
          CHECK(now.empty());
          continue;
        }
        ++posted;
        REQUIRE(now.size() == 1);
        const auto& wr = now[0];
        INFO("addr " << addr << " size " << size << " offset " << offset << " len " << len);
        CHECK(has(r->usage(), op.need));
        CHECK(wr.rkey == r->rkey());
        CHECK(wr.remote_addr >= addr);
        const std::uint64_t at = wr.remote_addr - addr;
        std::uint64_t wr_len = 0;
        for (const auto& sge : wr.sge) wr_len += sge.length;
        if (op.atomic) wr_len = 8;
        CHECK(at <= size);
        CHECK(wr_len <= size - at);  // within [0, size)
        for (const auto& sge : wr.sge)
          if (!(wr.send_flags & IBV_SEND_INLINE) && sge.lkey == lkey)
            CHECK(sge.addr + sge.length <= addr_of(local.data()) + local.size);
        fake.complete_sends(qp);
      }
    }
    INFO("accepted " << accepted << " posted " << posted);
    CHECK(accepted > 1000);  // the test exercises what it claims to
    CHECK(posted > 100);
    CHECK(fake.cq_entries(*conn.cq()->native()) == 0);  // nothing unsignaled completed
  }
  fake.expect_clean();
}

TEST_CASE("PeerConfig: descriptor round trip and malformed descriptors", "[descriptor][peer_config]") {
  for (bool direct : {false, true}) {
    const PeerConfig cfg{direct};
    const auto d = cfg.descriptor();
    REQUIRE(d.size() == 1);
    CHECK(std::to_integer<int>(d[0]) == (direct ? 1 : 0));
    auto back = PeerConfig::from_descriptor(d);
    REQUIRE(back);
    CHECK(*back == cfg);
  }
  const std::array<std::byte, 2> two{std::byte{1}, std::byte{0}};
  for (std::size_t size : {0u, 2u}) {
    auto r = PeerConfig::from_descriptor(std::span<const std::byte>(two.data(), size));
    REQUIRE_FALSE(r);
    check_inval(r.error(), "PeerConfig::from_descriptor", "1 byte");
  }
  for (int value : {2, 0x80, 0xff}) {
    const std::array<std::byte, 1> bad{static_cast<std::byte>(value)};
    auto r = PeerConfig::from_descriptor(bad);
    REQUIRE_FALSE(r);
    check_inval(r.error(), "PeerConfig::from_descriptor", "not 0 or 1");
  }
}

TEST_CASE("review 2 (porting): descriptors to and from char buffers, as librpma programs keep them",
          "[mr][descriptor][review]") {
  fake::FakeProvider fake;
  {
    Peer peer = open_peer(fake);
    Buffer buf(256);
    MrLocal mr = reg(peer, buf, MrUsage::read_src | MrUsage::write_dst);
    char data[32];
    std::memset(data, 0x5a, sizeof data);
    auto written = mr.write_descriptor(data);
    REQUIRE(written);
    REQUIRE(*written == mr_descriptor_size);
    CHECK(static_cast<unsigned char>(data[mr_descriptor_size]) == 0x5a);  // nothing past it
    auto remote = MrRemote::from_descriptor(std::span<const char>(data, *written));
    REQUIRE(remote);
    CHECK(remote->address() == addr_of(buf.data()));
    CHECK(remote->size() == 256);
    CHECK(remote->usage() == (MrUsage::read_src | MrUsage::write_dst));
    char small[20];
    check_inval(mr.write_descriptor(small).error(), "MrLocal::write_descriptor", "too small");
    check_inval(MrRemote::from_descriptor(std::span<const char>(data, 20)).error(), "MrRemote::from_descriptor");
  }
  fake.expect_clean();
}

}  // namespace descriptor_test
