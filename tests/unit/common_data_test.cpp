// CommonData: librpma's examples' private data, byte for byte, and the checks on what a peer
// sends in it.
#include "data_util.hpp"

#include <rpmapp/common_data.hpp>

#include <cstring>
#include <vector>

namespace common_data_test {

using namespace test;

TEST_CASE("CommonData: a server's description reads back on the client, byte for byte as librpma's "
          "examples lay it out",
          "[common_data]") {
  fake::FakeProvider fake;
  {
    Peer peer = open_peer(fake);
    Buffer buf(4096);
    MrLocal mr = reg(peer, buf, MrUsage::read_src | MrUsage::write_dst);
    SECTION("without a peer configuration") {
      auto data = CommonData::describe(mr, 64);
      REQUIRE(data);
      const auto bytes = data->bytes();
      REQUIRE(bytes.size() == 28);
      const std::uint16_t offset = 64;
      CHECK(std::memcmp(bytes.data(), &offset, 2) == 0);  // host byte order, as librpma sends it
      CHECK(std::to_integer<int>(bytes[2]) == 21);
      CHECK(std::to_integer<int>(bytes[3]) == 0);
      const auto descriptor = *mr.descriptor();
      CHECK(std::memcmp(bytes.data() + 4, descriptor.data(), descriptor.size()) == 0);
      // rdma_cm pads the accept's private data with zeros.
      std::vector<std::byte> received(bytes.begin(), bytes.end());
      received.resize(196);
      auto parsed = CommonData::from_private_data(received);
      REQUIRE(parsed);
      CHECK(parsed->data_offset == 64);
      auto region = parsed->region();
      REQUIRE(region);
      CHECK(region->address() == addr_of(buf.data()));
      CHECK(region->size() == 4096);
      auto config = parsed->peer_config();
      REQUIRE(config);
      CHECK_FALSE(*config);
    }
    SECTION("with one") {
      PeerConfig pcfg;
      pcfg.direct_write_to_pmem = true;
      auto data = CommonData::describe(mr, 0, pcfg);
      REQUIRE(data);
      CHECK(data->pcfg_desc_size == 1);
      auto config = data->peer_config();
      REQUIRE(config);
      REQUIRE(*config);
      CHECK((*config)->direct_write_to_pmem);
    }
    SECTION("from a descriptor already made (a grant's), the same bytes") {
      PeerConfig pcfg;
      pcfg.direct_write_to_pmem = true;
      const CommonData from_descriptor = CommonData::describe(*mr.descriptor(), 8, pcfg);
      auto from_region = CommonData::describe(mr, 8, pcfg);
      REQUIRE(from_region);
      CHECK(std::memcmp(from_descriptor.bytes().data(), from_region->bytes().data(), sizeof(CommonData)) == 0);
      CHECK(from_descriptor.mr_desc_size == 21);
      CHECK(from_descriptor.pcfg_desc_size == 1);
    }
  }
  fake.expect_clean();
}

TEST_CASE("CommonData: what a peer sends is untrusted: short data, sizes past the descriptors, bad "
          "descriptors are inval",
          "[common_data][inval]") {
  std::vector<std::byte> short_data(27);
  check_inval(CommonData::from_private_data(short_data).error(), "CommonData::from_private_data", "27 bytes");
  CommonData data;
  data.mr_desc_size = 21;
  data.pcfg_desc_size = 4;  // 25 > 24: librpma's examples would read past the struct
  std::vector<std::byte> sent(data.bytes().begin(), data.bytes().end());
  check_inval(CommonData::from_private_data(sent).error(), "CommonData::from_private_data", "21 + 4 exceed");
  check_inval(data.region().error(), "CommonData::region", "exceed");
  check_inval(data.peer_config().error(), "CommonData::peer_config", "exceed");
  data.pcfg_desc_size = 0;
  check_inval(data.region().error(), "MrRemote::from_descriptor");  // usage 0, length 0
  data.mr_desc_size = 20;
  check_inval(data.region().error(), "MrRemote::from_descriptor", "not 21");
  const Error empty = CommonData::describe(MrLocal()).error();
  check_inval(empty, "MrLocal::descriptor");
  CHECK(empty.operation() == "CommonData::describe");
}

}  // namespace common_data_test
