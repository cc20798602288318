// rpmapp::Error and rpmapp::errc: what every fallible call returns on failure.
#pragma once

#include <rpmapp/expected.hpp>
#include <rpmapp/version.hpp>

// fmt 11 on: <fmt/base.h> has what rpmapp uses (its <fmt/core.h> is all of <fmt/format.h>)
#if __has_include(<fmt/base.h>)
#include <fmt/base.h>
#else
#include <fmt/core.h>
#if FMT_VERSION < 90000
// fmt 8: a formatter<std::string> that rpmapp's inline code instantiates through core.h
// conflicts with the partial specializations of a <fmt/format.h> the user includes later
#include <fmt/format.h>
#endif
#endif

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <iterator>
#include <string>
#include <string_view>
#include <system_error>

RPMAPP_BEGIN_NAMESPACE

/// Error codes, with librpma's names (RPMA_E_*) and numeric values.
enum class errc : int {
  unknown = -100000,          ///< an unexpected event or an unclassified failure
  nosupp = -100001,           ///< not supported
  provider = -100002,         ///< a librdmacm / libibverbs call failed (see sys_errno(), call())
  nomem = -100003,            ///< out of memory
  inval = -100004,            ///< invalid argument, or an object that was moved from
  no_completion = -100005,    ///< no completion available
  no_event = -100006,         ///< no event available (non-blocking call, or a timeout)
  again = -100007,            ///< try again
  shared_channel = -100008,   ///< the completion channel is shared
  not_shared_chnl = -100009,  ///< the completion channel is not shared
};

/// Short English description of `code`, e.g. "provider error". Never fails.
constexpr std::string_view to_string(errc code) noexcept {
  switch (code) {
    case errc::unknown: return "unknown error";
    case errc::nosupp: return "not supported";
    case errc::provider: return "provider error";
    case errc::nomem: return "out of memory";
    case errc::inval: return "invalid argument";
    case errc::no_completion: return "no completion available";
    case errc::no_event: return "no next event available";
    case errc::again: return "temporary error, try again";
    case errc::shared_channel: return "completion channel is shared";
    case errc::not_shared_chnl: return "completion channel is not shared";
  }
  return "unrecognized error code";
}

/// The std::error_category of errc ("rpmapp").
const std::error_category& rpmapp_category() noexcept;

inline std::error_code make_error_code(errc code) noexcept {
  return {static_cast<int>(code), rpmapp_category()};
}

class Error;
namespace detail {
std::size_t write_message(const Error& error, char* buffer, std::size_t room) noexcept;
}

/// A failure: the errc, the provider's errno where a provider call failed (0 otherwise),
/// the rpmapp function that failed (operation(), such as "ConnReq::to"), the name of the
/// failing call under it (a provider function such as "rdma_resolve_route", or the rpmapp
/// function itself when it rejected its arguments) and a reason. A value type of fixed
/// size: copying it never allocates or throws.
/// Thread safety: a const Error may be read from several threads.
class Error {
 public:
  static constexpr std::size_t max_operation = 31;
  static constexpr std::size_t max_call = 31;
  static constexpr std::size_t max_reason = 159;

  constexpr Error() noexcept = default;
  /// `call` and `reason` are copied (truncated to max_call and max_reason bytes). A `call`
  /// with a scope ("Conn::write": a function that rejected its arguments itself) is the
  /// operation too; a provider function's ("rdma_listen") leaves operation() to be named.
  Error(errc code, int sys_errno, std::string_view call, std::string_view reason = {}) noexcept
      : code_(code), errno_(sys_errno) {
    call_len_ = copy_truncated(call, call_, max_call);
    reason_len_ = copy_truncated(reason, reason_, max_reason);
    if (call.find("::") != std::string_view::npos) name_operation(call);
  }

  constexpr errc code() const noexcept { return code_; }
  /// The errno of the failed provider call, or 0.
  constexpr int sys_errno() const noexcept { return errno_; }
  /// The failing call's name, or "" when there is none.
  std::string_view call() const noexcept { return {call_, call_len_}; }
  /// Why it failed, in words (may be empty).
  std::string_view reason() const noexcept { return {reason_, reason_len_}; }
  /// The rpmapp function that failed, e.g. "Endpoint::listen" (every Error rpmapp returns,
  /// hands to a handler or resumes a coroutine with names one, but check(wc)'s: a failed
  /// work completion does not say which call posted it); "" for an Error made with the
  /// constructor and not named since.
  std::string_view operation() const noexcept { return {operation_, operation_len_}; }
  /// Names `operation` (truncated to max_operation bytes) as the function that failed,
  /// replacing the one named: rpmapp names the public function its caller called (the
  /// outer one where one calls another, e.g. Peer::from_address, not the Peer::open in
  /// it). Never fails.
  Error& name_operation(std::string_view operation) noexcept {
    operation_len_ = copy_truncated(operation, operation_, max_operation);
    return *this;
  }

  /// One line: "[<operation>: ]<call>: <errc text>[: <strerror> (errno N)][: <reason>]",
  /// the operation left out when it is the call itself (an rpmapp function that rejected
  /// its arguments) or not named.
  /// Example: "Endpoint::listen: rdma_listen: provider error: Address already in use
  /// (errno 98)".
  std::string message() const;

  std::error_code error_code() const noexcept { return make_error_code(code_); }
  /// The provider's errno as a std::system_category code (value 0 when there is none).
  std::error_code system_error_code() const noexcept { return {errno_, std::system_category()}; }

  friend bool operator==(const Error& a, const Error& b) noexcept {
    return a.code_ == b.code_ && a.errno_ == b.errno_ && a.operation() == b.operation() &&
           a.call() == b.call() && a.reason() == b.reason();
  }
  friend bool operator==(const Error& a, errc b) noexcept { return a.code_ == b; }

  /// message()'s text to an output iterator.
  template <class Out> Out format_to(Out out) const {
    char buf[max_message];
    const std::size_t size = detail::write_message(*this, buf, sizeof buf);
    if (size <= sizeof buf) return std::copy(buf, buf + size, out);
    const std::string text = message();
    return std::copy(text.begin(), text.end(), out);
  }

 private:
  static unsigned char copy_truncated(std::string_view from, char* to, std::size_t max) noexcept {
    // The null test is for g++ 12 at -O3, which otherwise warns (nonnull) on an empty view.
    if (from.data() == nullptr) return 0;
    const std::size_t len = std::min(from.size(), max);
    std::memcpy(to, from.data(), len);
    return static_cast<unsigned char>(len);
  }
  // Room for any message with a strerror text of up to 200 bytes (glibc's are below 60).
  static constexpr std::size_t max_message = max_operation + max_call + max_reason + 300;

  errc code_ = errc::unknown;
  int errno_ = 0;
  unsigned char operation_len_ = 0;
  unsigned char call_len_ = 0;
  unsigned char reason_len_ = 0;
  char operation_[max_operation] = {};
  char call_[max_call] = {};
  char reason_[max_reason] = {};
};

namespace detail {
// strerror_r comes in a GNU flavour (returns a pointer) and an XSI one (returns int).
inline const char* pick_strerror(const char* gnu_result, char*) noexcept { return gnu_result; }
inline const char* pick_strerror(int xsi_result, char* buf) noexcept {
  return xsi_result == 0 ? buf : "unknown errno";
}

/// Error::message()'s text into [buffer, buffer + room), cut off there (never allocates).
/// Returns the whole length.
std::size_t write_message(const Error& error, char* buffer, std::size_t room) noexcept;
}  // namespace detail

RPMAPP_END_NAMESPACE

template <> struct std::is_error_code_enum<rpmapp::errc> : std::true_type {};

template <> struct fmt::formatter<rpmapp::Error> {
  constexpr auto parse(format_parse_context& ctx) { return ctx.begin(); }
  template <class Ctx> auto format(const rpmapp::Error& e, Ctx& ctx) const {
    return e.format_to(ctx.out());
  }
};

/// errc formats as its name (to_string) with a string's format spec ("{:>15}"). The spec is
/// kept as text and applied with fmt::format_to and fmt::runtime, which fmt 9 to 12 declare in
/// the header rpmapp includes (fmt 10's <fmt/core.h> declares its string_view formatter's
/// format() but defines it only in <fmt/format.h>). A spec a string does not take is reported
/// when formatting (fmt::format_error); nested fields ("{:{}}") and specs over 29 characters
/// are refused at parse time (at compile time for a checked format string).
template <> struct fmt::formatter<rpmapp::errc> {
  constexpr auto parse(format_parse_context& ctx) {
    auto it = ctx.begin();
    for (; it != ctx.end() && *it != '}'; ++it) {
      if (*it == '{' || size_ == sizeof spec_ - 1) {
        refuse(ctx, "rpmapp::errc: nested or over-long format spec");
        return it;
      }
      spec_[size_++] = *it;
    }
    spec_[size_++] = '}';
    return it;
  }
  template <class Ctx> auto format(rpmapp::errc c, Ctx& ctx) const {
    const std::string_view name = rpmapp::to_string(c);
    if (size_ == 3) return std::copy(name.begin(), name.end(), ctx.out());   // "{:}": no spec
    return fmt::format_to(ctx.out(), fmt::runtime(fmt::string_view(spec_, size_)), name);
  }

 private:
  // fmt's own way of failing a parse, by version: report_error (11 on), throw_format_error
  // (10.1, 10.2), the parse context's on_error (9; 10.0 documents it but lacks it, so its
  // internal thrower). Not constexpr: reached only on a bad spec, which is then a compile error
  // for a checked format string.
  static void refuse([[maybe_unused]] format_parse_context& ctx, const char* why) {
#if FMT_VERSION >= 110000
    fmt::report_error(why);
#elif FMT_VERSION >= 100100
    fmt::throw_format_error(why);
#elif FMT_VERSION >= 100000
    fmt::detail::throw_format_error(why);
#else
    ctx.on_error(why);
#endif
  }
  char spec_[32] = {'{', ':'};
  std::size_t size_ = 2;
};

#if !defined(RPMAPP_SEPARATE_COMPILATION)
#  include <rpmapp/impl/error.ipp>
#endif
