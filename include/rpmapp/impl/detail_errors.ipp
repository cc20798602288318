// The builders of Errors (cold: failure paths only): provider failures and formatted reasons.
#pragma once

#include <rpmapp/detail/errors.hpp>

#include <algorithm>
#include <cerrno>
#include <cstddef>
#include <initializer_list>
#include <string_view>

RPMAPP_BEGIN_NAMESPACE

RPMAPP_DECL Error detail::provider_error(std::string_view call, int sys_errno,
                                         std::string_view reason) noexcept {
  // siw's provider fails a queue whose mmap key is its "invalid key" (page 144 of the
  // context) without setting errno: the message must still say what happened
  if (sys_errno == 0 && reason.empty()) reason = "the call failed without setting errno";
  return Error(sys_errno == ENOMEM ? errc::nomem : errc::provider, sys_errno, call, reason);
}

RPMAPP_DECL Error detail::make_error_from(errc code, int sys_errno, const char* call,
                                          std::string_view format,
                                          std::initializer_list<FormatArg> args) noexcept {
  char buf[Error::max_reason];
  const std::size_t size = format_to_buffer(buf, sizeof buf, format, args);
  return Error(code, sys_errno, call, {buf, std::min(size, sizeof buf)});
}

RPMAPP_DECL Error detail::provider_error_in(const char* operation, std::string_view call,
                                            int sys_errno,
                                            std::string_view reason) noexcept {
  Error e = provider_error(call, sys_errno, reason);
  e.name_operation(operation);
  return e;
}

RPMAPP_END_NAMESPACE
