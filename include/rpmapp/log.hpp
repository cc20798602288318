// rpmapp's log hook (librpma's rpma_log_set_function / rpma_log_set_threshold): where the
// library cannot return an error (destructors, teardown after a failure, events it
// acknowledges without reporting, exceptions escaping event-loop handlers) it reports it
// here. By default nothing is printed.
#pragma once

#include <rpmapp/error.hpp>

#include <atomic>
#include <string_view>

RPMAPP_BEGIN_NAMESPACE

/// Severity, most severe first (librpma's RPMA_LOG_LEVEL_* order).
enum class LogLevel { fatal, error, warning, notice, info, debug };

constexpr std::string_view to_string(LogLevel level) noexcept {
  switch (level) {
    case LogLevel::fatal: return "fatal";
    case LogLevel::error: return "error";
    case LogLevel::warning: return "warning";
    case LogLevel::notice: return "notice";
    case LogLevel::info: return "info";
    case LogLevel::debug: return "debug";
  }
  return "unknown";
}

/// Receives one message: `where` names the rpmapp function or destructor that reports,
/// `message` the failure (for an Error: Error::message()'s text). Both views are valid
/// during the call only. It may be called from any thread that uses rpmapp, concurrently:
/// make it thread-safe. It must not throw.
using LogFunction = void (*)(LogLevel level, std::string_view where, std::string_view message) noexcept;

namespace detail {
struct LogState {
  std::atomic<LogFunction> function{nullptr};
  std::atomic<LogLevel> threshold{LogLevel::warning};
};
LogState& log_state() noexcept;
}  // namespace detail

/// Installs `function` (nullptr: the default, which prints nothing). Thread-safe; a call
/// in flight in another thread may still reach the previous function.
void set_log_function(LogFunction function) noexcept;
/// Messages less severe than `level` are not passed on (default: warning). Thread-safe.
void set_log_threshold(LogLevel level) noexcept;
LogLevel log_threshold() noexcept;

namespace detail {

/// Whether a message at `level` would reach a log function (cheap: two atomic loads).
bool log_enabled(LogLevel level) noexcept;

/// Reports `text` from `where`. Formats nothing unless a function listens.
void log(LogLevel level, std::string_view where, std::string_view text) noexcept;

/// Reports an Error (its message, formatted into a fixed buffer: never allocates).
void log(LogLevel level, std::string_view where, const Error& error) noexcept;

}  // namespace detail
RPMAPP_END_NAMESPACE

#if !defined(RPMAPP_SEPARATE_COMPILATION)
#  include <rpmapp/impl/log.ipp>
#endif
