// Building Errors: provider failures (errno -> provider / nomem) and invalid arguments.
#pragma once

#include <rpmapp/error.hpp>

#include <cerrno>
#include <new>
#include <utility>

RPMAPP_BEGIN_NAMESPACE
namespace detail {

/// A failed provider call: ENOMEM is nomem, anything else provider.
inline Error provider_error(std::string_view call, int sys_errno, std::string_view reason = {}) noexcept {
  return Error(sys_errno == ENOMEM ? errc::nomem : errc::provider, sys_errno, call, reason);
}

/// An error whose reason is formatted without allocating (truncated to Error::max_reason).
template <class... Args>
Error make_error(errc code, int sys_errno, const char* call, fmt::format_string<Args...> format,
                 Args&&... args) noexcept {
  char buf[Error::max_reason];
  auto result = fmt::format_to_n(buf, sizeof buf, format, std::forward<Args>(args)...);
  return Error(code, sys_errno, call, {buf, std::min(result.size, sizeof buf)});
}

template <class... Args>
Error invalid(const char* call, fmt::format_string<Args...> format, Args&&... args) noexcept {
  return make_error(errc::inval, 0, call, format, std::forward<Args>(args)...);
}

inline Error moved_from(const char* call) noexcept {
  return Error(errc::inval, 0, call, "the object is empty (moved from, or consumed)");
}

inline unexpected fail(Error e) noexcept { return unexpected(e); }

/// Runs `body` (returning expected<T>), turning std::bad_alloc into errc::nomem:
/// the library never throws.
template <class Body>
auto no_throw(const char* call, Body&& body) noexcept -> decltype(body()) {
  try {
    return body();
  } catch (const std::bad_alloc&) {
    return fail(Error(errc::nomem, ENOMEM, call, "memory allocation failed"));
  }
}

}  // namespace detail
RPMAPP_END_NAMESPACE
