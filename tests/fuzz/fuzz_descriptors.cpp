// Descriptors from the wire: MrRemote::from_descriptor (21 bytes: addr, len, rkey, usage)
// and PeerConfig::from_descriptor (1 byte), then the remote-range checks every operation
// makes with a parsed MrRemote.
// Input: the whole input is offered to both parsers as is (any size); when it has at
// least 21 bytes, its first 21 are a descriptor and the bytes after it an operation on
// the region: offset (8 bytes LE), length (8 bytes LE), usage bit index (1 byte).
#include "fuzz_support.hpp"

#include <rpmapp/detail/data_path.hpp>
#include <rpmapp/peer_config.hpp>

#include <cstring>

using namespace rpmapp;

namespace {

std::uint64_t le(std::span<const std::byte> b, std::size_t at, int n) {
  std::uint64_t v = 0;
  for (int i = 0; i < n; ++i) v |= std::uint64_t(std::to_integer<std::uint8_t>(b[at + i])) << (8 * i);
  return v;
}

void mr_remote(std::span<const std::byte> in, fuzz::Reader& op) {
  auto parsed = MrRemote::from_descriptor(in);
  if (in.size() != mr_descriptor_size) {
    FUZZ_CHECK(!parsed);
    fuzz::check_inval(parsed.error(), "MrRemote::from_descriptor");
    return;
  }
  const std::uint64_t addr = le(in, 0, 8), len = le(in, 8, 8);
  const auto rkey = static_cast<std::uint32_t>(le(in, 16, 4));
  const auto usage = std::to_integer<std::uint8_t>(in[20]);
  const bool valid = usage != 0 && len != 0 && addr + len >= addr;
  if (!valid) {
    FUZZ_CHECK(!parsed);
    fuzz::check_inval(parsed.error(), "MrRemote::from_descriptor");
    return;
  }
  FUZZ_CHECK_MSG(parsed.has_value(), parsed.error().message());
  const MrRemote& mr = *parsed;
  // The fields are what the bytes say, nothing more.
  FUZZ_CHECK(static_cast<bool>(mr));
  FUZZ_CHECK(mr.address() == addr);
  FUZZ_CHECK(mr.size() == len);
  FUZZ_CHECK(mr.rkey() == rkey);
  FUZZ_CHECK(to_underlying(mr.usage()) == usage);
  FUZZ_CHECK(has(mr.usage(), mr.flush_type()));
  FUZZ_CHECK((to_underlying(mr.flush_type()) &
              ~to_underlying(MrUsage::flush_visibility | MrUsage::flush_persistent)) == 0);
  // Round trip: the descriptor it gives back is the bytes it was parsed from.
  const MrDescriptor back = mr.descriptor();
  FUZZ_CHECK(std::memcmp(back.data(), in.data(), mr_descriptor_size) == 0);
  const MrRemote copy = mr;
  FUZZ_CHECK(copy.descriptor() == back);

  // An operation on [offset, offset + length) needing one usage bit.
  auto word = op.bytes(8);
  std::uint64_t offset = 0, length = 0;
  for (std::size_t i = 0; i < word.size(); ++i) offset |= std::uint64_t(std::to_integer<std::uint8_t>(word[i])) << (8 * i);
  word = op.bytes(8);
  for (std::size_t i = 0; i < word.size(); ++i) length |= std::uint64_t(std::to_integer<std::uint8_t>(word[i])) << (8 * i);
  const auto need = static_cast<MrUsage>(1u << (op.u8() & 7));
  auto checked = detail::check_remote("Conn::read", mr, offset, length, need);
  const bool fits = offset <= len && length <= len - offset;  // no overflow
  const bool allowed = fits && length <= 0xffffffffu && has(mr.usage(), need);
  if (allowed) {
    FUZZ_CHECK_MSG(checked.has_value(), checked.error().message());
    // What the work request would carry stays inside the region the bytes described.
    FUZZ_CHECK(addr + offset >= addr && addr + offset + length <= addr + len);
  } else {
    FUZZ_CHECK(!checked);
    fuzz::check_inval(checked.error(), "Conn::read");
  }
}

void peer_config(std::span<const std::byte> in) {
  auto parsed = PeerConfig::from_descriptor(in);
  const bool valid = in.size() == 1 && std::to_integer<unsigned>(in[0]) <= 1;
  if (!valid) {
    FUZZ_CHECK(!parsed);
    fuzz::check_inval(parsed.error(), "PeerConfig::from_descriptor");
    return;
  }
  FUZZ_CHECK_MSG(parsed.has_value(), parsed.error().message());
  FUZZ_CHECK(parsed->direct_write_to_pmem == (in[0] == std::byte{1}));
  FUZZ_CHECK(parsed->descriptor()[0] == in[0]);  // round trip
  auto again = PeerConfig::from_descriptor(parsed->descriptor());
  FUZZ_CHECK(again && *again == *parsed);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::span<const std::byte> all(reinterpret_cast<const std::byte*>(data), size);
  fuzz::Reader none(nullptr, 0);
  mr_remote(all, none);
  peer_config(all);
  if (size >= mr_descriptor_size) {
    fuzz::Reader op(data + mr_descriptor_size, size - mr_descriptor_size);
    mr_remote(all.first(mr_descriptor_size), op);
    peer_config(all.first(1));
  }
  return 0;
}
