// rpmapp's log hook: its state, its setters and the reporting of messages (cold code).
#pragma once

#include <rpmapp/log.hpp>

#include <atomic>
#include <cstddef>
#include <string_view>

RPMAPP_BEGIN_NAMESPACE

RPMAPP_DECL detail::LogState& detail::log_state() noexcept {
  static LogState state;
  return state;
}

RPMAPP_DECL void set_log_function(LogFunction function) noexcept {
  detail::log_state().function.store(function, std::memory_order_release);
}
RPMAPP_DECL void set_log_threshold(LogLevel level) noexcept {
  detail::log_state().threshold.store(level, std::memory_order_relaxed);
}
RPMAPP_DECL LogLevel log_threshold() noexcept {
  return detail::log_state().threshold.load(std::memory_order_relaxed);
}

RPMAPP_DECL bool detail::log_enabled(LogLevel level) noexcept {
  auto& state = log_state();
  return state.function.load(std::memory_order_acquire) != nullptr &&
         static_cast<int>(level) <= static_cast<int>(state.threshold.load(std::memory_order_relaxed));
}

RPMAPP_DECL void detail::log(LogLevel level, std::string_view where,
                             std::string_view text) noexcept {
  if (!log_enabled(level)) return;
  if (LogFunction fn = log_state().function.load(std::memory_order_acquire)) fn(level, where, text);
}

RPMAPP_DECL void detail::log(LogLevel level, std::string_view where, const Error& error) noexcept {
  if (!log_enabled(level)) return;
  char buf[Error::max_call + Error::max_reason + 200];
  const std::size_t n = write_message(error, buf, sizeof buf);
  log(level, where, std::string_view(buf, n < sizeof buf ? n : sizeof buf));
}

RPMAPP_END_NAMESPACE
