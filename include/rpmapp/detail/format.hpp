// The formatting of error reasons and log lines: fmt's "{}", "{:x}" and "{:0Nx}" over
// integers and strings, with fmt's output. One non-template function does the work and the
// format string is checked by a small consteval scan, so a call site costs the compiler a
// few conversions instead of fmt's per-call-site templates (its format_string checking and
// argument stores were a third of what including rpmapp cost).
#pragma once

#include <rpmapp/version.hpp>

#include <cstddef>
#include <initializer_list>
#include <string>
#include <string_view>

RPMAPP_BEGIN_NAMESPACE
namespace detail {

/// One argument, type-erased. Like fmt: bool and char are not numbers (not accepted here),
/// signed/unsigned char are.
class FormatArg {
 public:
  enum class Kind : unsigned char { signed_number, unsigned_number, text };

  constexpr FormatArg(signed char v) noexcept : FormatArg(static_cast<long long>(v)) {}
  constexpr FormatArg(short v) noexcept : FormatArg(static_cast<long long>(v)) {}
  constexpr FormatArg(int v) noexcept : FormatArg(static_cast<long long>(v)) {}
  constexpr FormatArg(long v) noexcept : FormatArg(static_cast<long long>(v)) {}
  constexpr FormatArg(long long v) noexcept : kind_(Kind::signed_number), signed_(v) {}
  constexpr FormatArg(unsigned char v) noexcept : FormatArg(static_cast<unsigned long long>(v)) {}
  constexpr FormatArg(unsigned short v) noexcept : FormatArg(static_cast<unsigned long long>(v)) {}
  constexpr FormatArg(unsigned v) noexcept : FormatArg(static_cast<unsigned long long>(v)) {}
  constexpr FormatArg(unsigned long v) noexcept : FormatArg(static_cast<unsigned long long>(v)) {}
  constexpr FormatArg(unsigned long long v) noexcept : kind_(Kind::unsigned_number), unsigned_(v) {}
  constexpr FormatArg(std::string_view v) noexcept : kind_(Kind::text), text_(v) {}
  constexpr FormatArg(const char* v) noexcept : kind_(Kind::text), text_(v) {}
  FormatArg(const std::string& v) noexcept : kind_(Kind::text), text_(v) {}
  FormatArg(bool) = delete;
  FormatArg(char) = delete;

  constexpr Kind kind() const noexcept { return kind_; }
  constexpr long long signed_value() const noexcept { return signed_; }
  constexpr unsigned long long unsigned_value() const noexcept { return unsigned_; }
  constexpr std::string_view text() const noexcept { return text_; }

 private:
  Kind kind_;
  long long signed_ = 0;
  unsigned long long unsigned_ = 0;
  std::string_view text_;
};

/// Appends to [begin, begin + room), counting what does not fit (as fmt::format_to_n).
class BoundedWriter {
 public:
  constexpr BoundedWriter(char* begin, std::size_t room) noexcept : begin_(begin), room_(room) {}
  constexpr void put(char c) noexcept {
    if (size_ < room_) begin_[size_] = c;
    ++size_;
  }
  constexpr void put(std::string_view text) noexcept {
    for (char c : text) put(c);
  }
  /// `value` in base 10 or 16 (lowercase), zero-padded to `width` characters, sign included.
  constexpr void put_number(bool negative, unsigned long long value, unsigned base, std::size_t width) noexcept {
    char digits[20];
    std::size_t n = 0;
    do {
      digits[n++] = "0123456789abcdef"[value % base];
      value /= base;
    } while (value != 0);
    if (negative) put('-');
    for (std::size_t len = n + (negative ? 1 : 0); len < width; ++len) put('0');
    while (n != 0) put(digits[--n]);
  }
  /// Every character asked for, also those that did not fit.
  constexpr std::size_t size() const noexcept { return size_; }

 private:
  char* begin_;
  std::size_t room_;
  std::size_t size_ = 0;
};

/// A replacement field's spec: "" (decimal or text), "x" or "0Nx" (hex, zero-padded to N).
struct FieldSpec {
  bool valid = false;
  bool hex = false;
  std::size_t width = 0;
};
constexpr FieldSpec parse_field_spec(std::string_view spec) noexcept {
  FieldSpec out;
  if (spec.empty()) {
    out.valid = true;
    return out;
  }
  if (spec.back() != 'x') return out;
  spec.remove_suffix(1);
  if (!spec.empty()) {
    if (spec.front() != '0' || spec.size() == 1) return out;
    for (char c : spec.substr(1)) {
      if (c < '0' || c > '9') return out;
      out.width = out.width * 10 + static_cast<std::size_t>(c - '0');
    }
  }
  out.valid = out.hex = true;
  return out;
}

/// The number of replacement fields of `format`, or -1 when it is not one this formatter
/// takes (an unknown spec, a lone brace, an argument index).
constexpr int count_fields(std::string_view format) noexcept {
  int fields = 0;
  for (std::size_t i = 0; i < format.size(); ++i) {
    if (format[i] == '}') {
      if (i + 1 == format.size() || format[i + 1] != '}') return -1;
      ++i;
    } else if (format[i] == '{') {
      if (i + 1 < format.size() && format[i + 1] == '{') {
        ++i;
        continue;
      }
      const std::size_t close = format.find('}', i);
      if (close == std::string_view::npos) return -1;
      std::string_view field = format.substr(i + 1, close - i - 1);
      if (!field.empty() && field.front() != ':') return -1;
      if (!parse_field_spec(field.empty() ? field : field.substr(1)).valid) return -1;
      ++fields;
      i = close;
    }
  }
  return fields;
}

// Not constexpr: reaching it in a consteval check is the compile error.
inline void format_string_does_not_match_its_arguments() noexcept {}

/// A format string for `Fields` arguments, checked at compile time.
template <int Fields> struct FormatString {
  consteval FormatString(const char* format) : text(format) {
    if (count_fields(text) != Fields) format_string_does_not_match_its_arguments();
  }
  std::string_view text;
};
template <class... Args> using FormatFor = FormatString<static_cast<int>(sizeof...(Args))>;

/// Writes `format` with `args` into `out` (fields in order; the string was checked).
void format_into(BoundedWriter& out, std::string_view format, std::initializer_list<FormatArg> args) noexcept;

/// format_into a buffer of `room` bytes; returns the whole length (what fits is written).
std::size_t format_to_buffer(char* buffer, std::size_t room, std::string_view format,
                             std::initializer_list<FormatArg> args) noexcept;

struct FormatToNResult {
  std::size_t size;  ///< the whole length, also what did not fit
};

/// fmt::format_to_n's counterpart: `format` with `args` into [buffer, buffer + room); what
/// did not fit is cut off.
template <class... Args>
FormatToNResult format_to_n(char* buffer, std::size_t room, FormatFor<Args...> format,
                            const Args&... args) noexcept {
  return {format_to_buffer(buffer, room, format.text, {FormatArg(args)...})};
}

}  // namespace detail
RPMAPP_END_NAMESPACE

#if !defined(RPMAPP_SEPARATE_COMPILATION)
#  include <rpmapp/impl/detail_format.ipp>
#endif
