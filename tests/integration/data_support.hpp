// Helpers the data-path integration tests share (data_path_test, grant_test): filling and
// comparing buffers, reading one completion within a bound, a queue pair's state.
#pragma once

#include "support.hpp"

#include <infiniband/verbs.h>

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string_view>
#include <vector>

namespace itest {

using rpmapp::Cq;

using Bytes = std::vector<std::byte>;

// Pseudo-random bytes (splitmix64, 8 at a time: fast enough for 1 MiB under emulation): a
// misplaced or shifted copy never matches by chance.
inline void fill(std::span<std::byte> out, std::uint64_t seed) {
  std::uint64_t state = seed * 0x9e3779b97f4a7c15u;
  for (std::size_t at = 0; at < out.size(); at += 8) {
    std::uint64_t z = (state += 0x9e3779b97f4a7c15u);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9u;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebu;
    z ^= z >> 31;
    std::memcpy(out.data() + at, &z, std::min<std::size_t>(8, out.size() - at));
  }
}

// The index of the first byte where `a` and `b` differ; -1 when they are equal.
inline long first_difference(std::span<const std::byte> a, std::span<const std::byte> b) {
  if (a.size() != b.size()) return static_cast<long>(std::min(a.size(), b.size()));
  if (a.empty() || std::memcmp(a.data(), b.data(), a.size()) == 0) return -1;
  auto [ia, ib] = std::mismatch(a.begin(), a.end(), b.begin());
  return static_cast<long>(ia - a.begin());
}

// `before` with `n` bytes of `from` at `from_offset` copied in at `at`.
inline Bytes with_copy(Bytes before, std::size_t at, std::span<const std::byte> from,
                std::size_t from_offset, std::size_t n) {
  std::copy_n(from.begin() + static_cast<long>(from_offset), n, before.begin() + static_cast<long>(at));
  return before;
}

inline std::span<const std::byte> text_bytes(std::string_view text) { return rpmapp::as_bytes(text); }

inline Cq cq_of(const Conn& conn) { return MUST(conn.cq()); }
inline Cq rcq_of(const Conn& conn) { return MUST(conn.rcq()); }

// The next completion of `cq` within event_wait; FAILs naming `who` otherwise.
inline ibv_wc next_wc(Cq cq, const char* who) {
  std::array<ibv_wc, 1> wc{};
  auto got = cq.next_for(wc, event_wait);
  if (!got) FAIL(who << ": Cq::next_for: " << got.error().message());
  REQUIRE(got->size() == 1);
  return wc[0];
}

// A successful completion of `opcode` for the work request `id`.
inline void expect_done(const ibv_wc& wc, ibv_wc_opcode opcode, std::uint64_t id) {
  if (auto ok = rpmapp::check(wc); !ok) FAIL("completion failed: " << ok.error().message());
  CHECK(rpmapp::to_string(wc.opcode) == rpmapp::to_string(opcode));
  CHECK(wc.wr_id == id);
}

// No completion comes on `cq` within a short quiet period (nothing was posted, or
// everything was read already).
inline void expect_empty(Cq cq, const char* who) {
  std::array<ibv_wc, 1> wc{};
  auto got = cq.next_for(wc, 100ms);
  if (got) FAIL(who << ": an unexpected completion: wr_id " << wc[0].wr_id << ", "
                    << rpmapp::to_string(wc[0].status));
  CHECK(got.error().code() == errc::no_completion);
}


inline ibv_qp_state qp_state(const Conn& conn) {
  ibv_qp_attr attr{};
  ibv_qp_init_attr init{};
  REQUIRE(ibv_query_qp(MUST(conn.qp()), &attr, IBV_QP_STATE, &init) == 0);
  return attr.qp_state;
}

}  // namespace itest
