// librpma 1.2 and rpmapp agree on what travels in private data: librpma's common_data
// layout, and memory region descriptors made by one and read by the other (registered on
// the same device in one process). Malformed common_data is reported as inval, never read
// past its bytes. Needs $SOFTROCE_IP for the registrations; fails, never skips, without it.
#include "../support.hpp"
#include "../../../examples/common/librpma_data.hpp"
#include "librpma_common.hpp"

#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

namespace {

using namespace itest;
using rpmapp::errc;
using rpmapp::MrUsage;

// A librpma peer on the device of `ip`, deleted at the end of the test.
struct RpmaPeer {
  rpma_peer* peer = nullptr;
  explicit RpmaPeer(const std::string& ip) {
    ibv_context* device = nullptr;
    REQUIRE(rpma_utils_get_ibv_context(ip.c_str(), RPMA_UTIL_IBV_CONTEXT_LOCAL, &device) == 0);
    REQUIRE(rpma_peer_new(device, &peer) == 0);
  }
  ~RpmaPeer() {
    if (peer) (void)rpma_peer_delete(&peer);
  }
};

// `mr`'s descriptor, checked to be rpmapp's size.
std::array<std::byte, rpmapp::mr_descriptor_size> rpma_descriptor(const rpma_mr_local* mr) {
  std::size_t size = 0;
  REQUIRE(rpma_mr_get_descriptor_size(mr, &size) == 0);
  REQUIRE(size == rpmapp::mr_descriptor_size);
  std::array<std::byte, rpmapp::mr_descriptor_size> desc{};
  REQUIRE(rpma_mr_get_descriptor(mr, desc.data()) == 0);
  return desc;
}

// A valid common_data as librpma's example servers send it, padded as rdma_cm delivers
// an accept's private data (196 bytes).
std::vector<std::byte> padded(const rpmapp::CommonData& data) {
  std::vector<std::byte> out(rpmapp::max_accept_private_data);
  std::memcpy(out.data(), &data, sizeof data);
  return out;
}

}  // namespace

TEST_CASE("common_data: rpmapp's declaration has librpma's examples' layout", "[interop]") {
  STATIC_REQUIRE(sizeof(rpmapp::CommonData) == sizeof(interop::common_data));
  STATIC_REQUIRE(offsetof(rpmapp::CommonData, data_offset) == offsetof(interop::common_data, data_offset));
  STATIC_REQUIRE(offsetof(rpmapp::CommonData, mr_desc_size) == offsetof(interop::common_data, mr_desc_size));
  STATIC_REQUIRE(offsetof(rpmapp::CommonData, pcfg_desc_size) ==
                 offsetof(interop::common_data, pcfg_desc_size));
  STATIC_REQUIRE(offsetof(rpmapp::CommonData, descriptors) == offsetof(interop::common_data, descriptors));

  // The bytes librpma's servers send parse as they were written.
  interop::common_data c{};
  c.data_offset = 0x1234;
  c.mr_desc_size = 21;
  c.pcfg_desc_size = 1;
  for (int i = 0; i < 24; ++i) c.descriptors[i] = static_cast<char>(i + 1);
  std::vector<std::byte> wire(rpmapp::max_accept_private_data);
  std::memcpy(wire.data(), &c, sizeof c);
  auto parsed = MUST(rpmapp::CommonData::from_private_data(wire));
  CHECK(parsed.data_offset == 0x1234);
  CHECK(parsed.mr_desc_size == 21);
  CHECK(parsed.pcfg_desc_size == 1);
  CHECK(std::memcmp(parsed.descriptors.data(), c.descriptors, 24) == 0);
  CHECK(std::memcmp(parsed.bytes().data(), &c, sizeof c) == 0);
}

TEST_CASE("common_data: malformed private data from a server is inval, never read past its bytes",
          "[interop]") {
  // A valid descriptor to spoil: address 0x1000, length 64, rkey 7, read_src.
  const auto good_desc = rpmapp::detail::encode_descriptor(0x1000, 64, 7, MrUsage::read_src);
  rpmapp::CommonData good;
  good.mr_desc_size = static_cast<std::uint8_t>(good_desc.size());
  std::copy(good_desc.begin(), good_desc.end(), good.descriptors.begin());
  {
    auto parsed = MUST(rpmapp::CommonData::from_private_data(padded(good)));
    auto remote = MUST(parsed.region());
    CHECK(remote.address() == 0x1000);
    CHECK(remote.size() == 64);
    CHECK(remote.rkey() == 7);
    CHECK(remote.usage() == MrUsage::read_src);
  }

  SECTION("shorter than common_data (no private data at all, or a truncated one)") {
    const auto full = padded(good);
    for (std::size_t size : {std::size_t{0}, std::size_t{1}, sizeof(rpmapp::CommonData) - 1}) {
      // Only `size` bytes: ASan would catch a read of the rest.
      std::vector<std::byte> data(full.begin(), full.begin() + static_cast<std::ptrdiff_t>(size));
      auto e = MUST_FAIL(rpmapp::CommonData::from_private_data(data));
      CHECK(e.code() == errc::inval);
      CHECK(e.call() == "CommonData::from_private_data");
    }
  }
  SECTION("descriptor sizes beyond the 24 bytes of descriptors") {
    auto bad = good;
    bad.mr_desc_size = 21;
    bad.pcfg_desc_size = 4;
    CHECK(MUST_FAIL(rpmapp::CommonData::from_private_data(padded(bad))).code() == errc::inval);
    bad.mr_desc_size = 255;
    bad.pcfg_desc_size = 0;
    CHECK(MUST_FAIL(rpmapp::CommonData::from_private_data(padded(bad))).code() == errc::inval);
    // region() on an unchecked CommonData does not read past descriptors either.
    CHECK(MUST_FAIL(bad.region()).code() == errc::inval);
  }
  SECTION("a descriptor of another size") {
    for (std::uint8_t size : {0, 20, 22, 24}) {
      auto bad = good;
      bad.mr_desc_size = size;
      auto parsed = MUST(rpmapp::CommonData::from_private_data(padded(bad)));
      auto e = MUST_FAIL(parsed.region());
      CHECK(e.code() == errc::inval);
      CHECK(e.call() == "MrRemote::from_descriptor");
    }
  }
  SECTION("a descriptor with no usage, a length of 0, or an address range that overflows") {
    auto bad = good;
    bad.descriptors[20] = std::byte{0};  // usage
    CHECK(MUST_FAIL(bad.region()).call() == "MrRemote::from_descriptor");
    bad = good;
    std::fill(bad.descriptors.begin() + 8, bad.descriptors.begin() + 16, std::byte{0});  // length
    CHECK(MUST_FAIL(bad.region()).call() == "MrRemote::from_descriptor");
    bad = good;
    std::fill(bad.descriptors.begin(), bad.descriptors.begin() + 8, std::byte{0xff});  // address
    CHECK(MUST_FAIL(bad.region()).call() == "MrRemote::from_descriptor");
  }
}

TEST_CASE("descriptors: librpma's parse in rpmapp, rpmapp's in librpma", "[interop]") {
  const std::string ip = ip1();
  auto peer = local_peer(ip);
  RpmaPeer rpma(ip);

  std::array<std::byte, 4096> memory{};
  const auto usage = MrUsage::read_src | MrUsage::write_dst | MrUsage::flush_visibility;
  const int rpma_usage = RPMA_MR_USAGE_READ_SRC | RPMA_MR_USAGE_WRITE_DST | RPMA_MR_USAGE_FLUSH_TYPE_VISIBILITY;
  // Both register the same memory, at an offset, so that the address is not the start.
  std::byte* start = memory.data() + 64;
  const std::size_t size = 1000;

  SECTION("librpma's descriptor as an MrRemote") {
    rpma_mr_local* mr = nullptr;
    REQUIRE(rpma_mr_reg(rpma.peer, start, size, rpma_usage, &mr) == 0);
    const auto desc = rpma_descriptor(mr);
    auto remote = rpmapp::MrRemote::from_descriptor(desc);
    (void)rpma_mr_dereg(&mr);
    REQUIRE(remote);
    CHECK(remote->address() == reinterpret_cast<std::uintptr_t>(start));
    CHECK(remote->size() == size);
    CHECK(remote->usage() == usage);
    CHECK(remote->flush_type() == MrUsage::flush_visibility);
    CHECK(remote->descriptor() == desc);
  }
  SECTION("rpmapp's descriptor as an rpma_mr_remote") {
    auto mr = MUST(rpmapp::MrLocal::reg(peer, start, size, usage));
    const auto desc = MUST(mr.descriptor());
    rpma_mr_remote* remote = nullptr;
    REQUIRE(rpma_mr_remote_from_descriptor(desc.data(), desc.size(), &remote) == 0);
    std::size_t remote_size = 0;
    int flush_type = 0;
    CHECK(rpma_mr_remote_get_size(remote, &remote_size) == 0);
    CHECK(rpma_mr_remote_get_flush_type(remote, &flush_type) == 0);
    (void)rpma_mr_remote_delete(&remote);
    CHECK(remote_size == size);
    CHECK(flush_type == RPMA_MR_USAGE_FLUSH_TYPE_VISIBILITY);
    // The rkey in it is the registration's, at the offset librpma reads it from.
    CHECK(rpmapp::detail::get_le(desc.data() + 16, 4) == MUST(mr.native())->rkey);
  }
}
