// The log check every target installs.
#include "fuzz_support.hpp"

namespace fuzz {
namespace {

void log_checked(rpmapp::LogLevel, std::string_view where, std::string_view message) noexcept {
  if (where.empty() || message.empty()) {
    std::fprintf(stderr, "fuzz: a log message without a source or text: [%.*s] [%.*s]\n",
                 static_cast<int>(where.size()), where.data(), static_cast<int>(message.size()),
                 message.data());
    std::abort();
  }
}

}  // namespace

void check_logs() {
  rpmapp::set_log_function(&log_checked);
  rpmapp::set_log_threshold(rpmapp::LogLevel::debug);
}

}  // namespace fuzz
