// What the libFuzzer targets share: reading an input front to back, invariant checks that
// abort (libFuzzer then saves the input as a crash), and running the unit tests' fake
// provider outside a Catch2 test run.
#pragma once

#include <rpmapp/error.hpp>
#include <rpmapp/log.hpp>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <span>
#include <string>
#include <string_view>

namespace fuzz {

/// Reports a broken invariant and aborts: libFuzzer records the input as a crash.
[[noreturn]] inline void broken(const char* file, int line, const char* what, std::string_view detail) {
  std::fprintf(stderr, "%s:%d: invariant broken: %s%s%.*s\n", file, line, what,
               detail.empty() ? "" : ": ", static_cast<int>(detail.size()), detail.data());
  std::abort();
}

#define FUZZ_CHECK(cond) \
  do {                                                         \
    if (!(cond)) ::fuzz::broken(__FILE__, __LINE__, #cond, {}); \
  } while (0)
#define FUZZ_CHECK_MSG(cond, detail) \
  do {                                                             \
    if (!(cond)) ::fuzz::broken(__FILE__, __LINE__, #cond, (detail)); \
  } while (0)

/// An Error every public call may return: its message names something and is not empty;
/// an inval never carries an errno (it is the caller's mistake, not the provider's).
inline void check_error(const rpmapp::Error& e) {
  const std::string text = e.message();
  FUZZ_CHECK_MSG(!text.empty(), "empty message");
  FUZZ_CHECK_MSG(!e.call().empty(), text);
  if (e.code() == rpmapp::errc::inval) FUZZ_CHECK_MSG(e.sys_errno() == 0, text);
}

/// An inval Error from `call` with a reason.
inline void check_inval(const rpmapp::Error& e, std::string_view call) {
  check_error(e);
  FUZZ_CHECK_MSG(e.code() == rpmapp::errc::inval, e.message());
  FUZZ_CHECK_MSG(e.call() == call, e.message());
  FUZZ_CHECK_MSG(!e.reason().empty(), e.message());
}

/// Reads an input front to back; past its end every read gives zeros (so that a short
/// input is still a whole scenario). Front to back keeps hand-written seeds readable.
class Reader {
 public:
  Reader(const std::uint8_t* data, std::size_t size) : data_(data), size_(size) {}
  bool empty() const { return pos_ >= size_; }
  std::size_t left() const { return empty() ? 0 : size_ - pos_; }
  std::uint8_t u8() { return empty() ? 0 : data_[pos_++]; }
  std::uint16_t u16() { return static_cast<std::uint16_t>(u8() | (u8() << 8)); }
  bool flag() { return (u8() & 1) != 0; }
  /// `n` bytes (fewer when the input ends).
  std::span<const std::byte> bytes(std::size_t n) {
    n = std::min(n, left());
    std::span<const std::byte> out(reinterpret_cast<const std::byte*>(data_ + pos_), n);
    pos_ += n;
    return out;
  }
  /// A length-prefixed (one byte) string.
  std::string_view text() {
    auto b = bytes(u8());
    return {reinterpret_cast<const char*>(b.data()), b.size()};
  }
  /// The rest of the input.
  std::span<const std::byte> rest() { return bytes(left()); }

 private:
  const std::uint8_t* data_;
  std::size_t size_;
  std::size_t pos_ = 0;
};

/// A log function that checks every message the library logs is non-empty (and names
/// where it comes from), at every level, so that the logging paths are exercised too.
void check_logs();

}  // namespace fuzz
