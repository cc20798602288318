// Building Errors: provider failures (errno -> provider / nomem) and invalid arguments.
#pragma once

#include <rpmapp/detail/format.hpp>
#include <rpmapp/error.hpp>

#include <cerrno>
#include <initializer_list>
#include <new>

RPMAPP_BEGIN_NAMESPACE
namespace detail {

// The builders of Errors are cold: failure paths, kept out of line so that the callers'
// successful paths stay small (for the optimizer, which otherwise inlines them into every
// fallible call of a TU, and for the instruction cache).

/// A failed provider call: ENOMEM is nomem, anything else provider.
[[gnu::cold]] Error provider_error(std::string_view call, int sys_errno, std::string_view reason = {}) noexcept;

/// The one place reasons are formatted: without allocating, cut to Error::max_reason.
[[gnu::cold]] Error make_error_from(errc code, int sys_errno, const char* call, std::string_view format,
                                    std::initializer_list<FormatArg> args) noexcept;

/// An error whose reason is `format` with `args` (see detail/format.hpp for what it takes).
template <class... Args>
Error make_error(errc code, int sys_errno, const char* call, FormatFor<Args...> format,
                 const Args&... args) noexcept {
  return make_error_from(code, sys_errno, call, format.text, {FormatArg(args)...});
}

template <class... Args>
Error invalid(const char* call, FormatFor<Args...> format, const Args&... args) noexcept {
  return make_error_from(errc::inval, 0, call, format.text, {FormatArg(args)...});
}

// Not cold: every data-path call starts with this check, and marking it cold costs each
// post + poll about 20 instructions (g++ 12 then keeps post_send and the checks out of
// line: bench_instr write 264 -> 285 Ir).
inline Error moved_from(const char* call) noexcept {
  return Error(errc::inval, 0, call, "the object is empty (moved from, or consumed)");
}

inline unexpected fail(Error e) noexcept { return unexpected(e); }

/// Names `operation`, the public function returning `result`, in its Error (replacing
/// the name an inner public function gave it). Called on the way out of every public
/// function that can fail in a provider call; the success path tests one flag.
template <class T> void name_in(expected<T>& result, const char* operation) noexcept {
  if (!result) [[unlikely]]
    result.error().name_operation(operation);
}

/// name_in for a result returned at once (the control path: one move more):
/// `return named(call, step());`.
template <class T> expected<T> named(const char* operation, expected<T> result) noexcept {
  name_in(result, operation);
  return result;
}

/// The errno a verbs call's nonzero return value stands for: the verbs return an errno
/// value, but siw's provider returns it negated (-EINVAL, -ENOMEM).
constexpr int verbs_errno(int rc) noexcept { return rc < 0 ? -rc : rc; }

/// An error of `operation` (an rpmapp function) in the provider call `call`.
[[gnu::cold]] Error provider_error_in(const char* operation, std::string_view call,
                                      int sys_errno, std::string_view reason = {}) noexcept;

/// Runs `body` (returning expected<T>) as the public function `call`, turning
/// std::bad_alloc into errc::nomem (the library never throws); an error names `call`
/// (name_in).
template <class Body>
auto no_throw(const char* call, Body&& body) noexcept -> decltype(body()) {
  try {
    auto result = body();
    name_in(result, call);
    return result;
  } catch (const std::bad_alloc&) {
    return fail(Error(errc::nomem, ENOMEM, call, "memory allocation failed"));
  }
}

}  // namespace detail
RPMAPP_END_NAMESPACE

#if !defined(RPMAPP_SEPARATE_COMPILATION)
#  include <rpmapp/impl/detail_errors.ipp>
#endif
