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
inline LogState& log_state() noexcept {
  static LogState state;
  return state;
}
}  // namespace detail

/// Installs `function` (nullptr: the default, which prints nothing). Thread-safe; a call
/// in flight in another thread may still reach the previous function.
inline void set_log_function(LogFunction function) noexcept {
  detail::log_state().function.store(function, std::memory_order_release);
}
/// Messages less severe than `level` are not passed on (default: warning). Thread-safe.
inline void set_log_threshold(LogLevel level) noexcept {
  detail::log_state().threshold.store(level, std::memory_order_relaxed);
}
inline LogLevel log_threshold() noexcept {
  return detail::log_state().threshold.load(std::memory_order_relaxed);
}

namespace detail {

/// Whether a message at `level` would reach a log function (cheap: two atomic loads).
inline bool log_enabled(LogLevel level) noexcept {
  auto& state = log_state();
  return state.function.load(std::memory_order_acquire) != nullptr &&
         static_cast<int>(level) <= static_cast<int>(state.threshold.load(std::memory_order_relaxed));
}

/// Reports `text` from `where`. Formats nothing unless a function listens.
inline void log(LogLevel level, std::string_view where, std::string_view text) noexcept {
  if (!log_enabled(level)) return;
  if (LogFunction fn = log_state().function.load(std::memory_order_acquire)) fn(level, where, text);
}

/// Reports an Error (its message, formatted into a fixed buffer: never allocates).
inline void log(LogLevel level, std::string_view where, const Error& error) noexcept {
  if (!log_enabled(level)) return;
  char buf[Error::max_call + Error::max_reason + 200];
  const std::size_t n = write_message(error, buf, sizeof buf);
  log(level, where, std::string_view(buf, n < sizeof buf ? n : sizeof buf));
}

}  // namespace detail
RPMAPP_END_NAMESPACE
