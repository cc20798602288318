// rpmapp::expected<T>: std::expected<T, Error> where the standard library has it, else
// tl::expected<T, Error>. Internals use only the operations both provide (no monadic calls:
// g++ 12's std::expected lacks and_then/transform, tl-expected 1.0 lacks transform_error).
#pragma once

#include <rpmapp/version.hpp>

#if defined(RPMAPP_USE_STD_EXPECTED)
#  include <expected>
#else
#  include <tl/expected.hpp>
#endif

RPMAPP_BEGIN_NAMESPACE

class Error;

#if defined(RPMAPP_USE_STD_EXPECTED)
template <class T> using expected = std::expected<T, Error>;
using unexpected = std::unexpected<Error>;
/// Name of the back end in use: "std" or "tl".
inline constexpr const char* expected_backend = "std";
/// Constructs an expected's value in place (also when the value is itself an expected).
inline constexpr std::in_place_t expected_in_place{};
#else
template <class T> using expected = tl::expected<T, Error>;
using unexpected = tl::unexpected<Error>;
inline constexpr const char* expected_backend = "tl";
inline constexpr tl::in_place_t expected_in_place{};
#endif

RPMAPP_END_NAMESPACE
