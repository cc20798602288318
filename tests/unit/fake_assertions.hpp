// The fake provider's own assertions (REQUIRE, CHECK, FAIL, INFO): Catch2's in the test
// programs; in the libFuzzer targets (RPMAPP_FAKE_ABORTING_ASSERTIONS, no Catch2 run) a
// failing one prints its expression, the INFO lines in scope and aborts, whatever Catch2
// version the machine has.
#pragma once

#if RPMAPP_FAKE_ABORTING_ASSERTIONS
#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <string>
#include <vector>

namespace fake::assertions {

inline std::vector<std::string>& infos() {
  thread_local std::vector<std::string> in_scope;
  return in_scope;
}

[[noreturn]] inline void failed(const char* file, int line, const char* what, const std::string& detail) {
  std::fprintf(stderr, "%s:%d: the fake provider's %s failed%s%s\n", file, line, what,
               detail.empty() ? "" : ": ", detail.c_str());
  for (const std::string& info : infos()) std::fprintf(stderr, "  with %s\n", info.c_str());
  std::abort();
}

// An INFO line, kept while its scope lasts
class Info {
 public:
  explicit Info(std::string text) { infos().push_back(std::move(text)); }
  ~Info() { infos().pop_back(); }
  Info(const Info&) = delete;
  Info& operator=(const Info&) = delete;
};

}  // namespace fake::assertions

#define RPMAPP_FAKE_CONCAT2(a, b) a##b
#define RPMAPP_FAKE_CONCAT(a, b) RPMAPP_FAKE_CONCAT2(a, b)
#define REQUIRE(...)                                                               \
  do {                                                                             \
    if (!(__VA_ARGS__)) ::fake::assertions::failed(__FILE__, __LINE__, "REQUIRE(" #__VA_ARGS__ ")", {}); \
  } while (0)
#define CHECK(...)                                                                 \
  do {                                                                             \
    if (!(__VA_ARGS__)) ::fake::assertions::failed(__FILE__, __LINE__, "CHECK(" #__VA_ARGS__ ")", {}); \
  } while (0)
#define FAIL(message)                                                              \
  do {                                                                             \
    std::ostringstream fake_text_;                                                 \
    fake_text_ << message;                                                         \
    ::fake::assertions::failed(__FILE__, __LINE__, "FAIL", fake_text_.str());      \
  } while (0)
#define INFO(message)                                                              \
  const ::fake::assertions::Info RPMAPP_FAKE_CONCAT(fake_info_, __LINE__)(         \
      [&] {                                                                        \
        std::ostringstream fake_text_;                                             \
        fake_text_ << message;                                                     \
        return fake_text_.str();                                                   \
      }())
#else
#include "catch2_compat.hpp"
#endif
