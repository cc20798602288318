// Catch2 for rpmapp's tests: v2 (one header) or v3 (a compiled library, headers per part),
// whichever tests/meson.build found; it defines RPMAPP_CATCH2_MAJOR. The tests are written
// against v2's names; the few v3 renamed are aliased here.
#pragma once

#if RPMAPP_CATCH2_MAJOR >= 3
#include <catch2/catch_template_test_macros.hpp>
#include <catch2/catch_test_macros.hpp>
#include <catch2/catch_tostring.hpp>
#include <catch2/generators/catch_generators.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>

#include <string>

namespace Catch {
// v2's Catch::Contains is v3's Matchers::ContainsSubstring (v3's Matchers::Contains is for ranges)
inline auto Contains(const std::string& text, CaseSensitive cs = CaseSensitive::Yes) {
  return Matchers::ContainsSubstring(text, cs);
}
using Matchers::EndsWith;
using Matchers::StartsWith;
}  // namespace Catch
#elif RPMAPP_CATCH2_MAJOR == 2
#include <catch2/catch.hpp>
#else
#error "RPMAPP_CATCH2_MAJOR is not set: include tests/catch2_compat.hpp through catch2_dep (tests/meson.build)"
#endif
