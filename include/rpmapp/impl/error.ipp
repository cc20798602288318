// rpmapp::Error's definitions: its category, and the formatting of its message (cold code).
#pragma once

#include <rpmapp/error.hpp>

#include <rpmapp/detail/format.hpp>

#include <cstddef>
#include <cstring>
#include <string>
#include <string_view>
#include <system_error>

RPMAPP_BEGIN_NAMESPACE

RPMAPP_DECL const std::error_category& rpmapp_category() noexcept {
  struct category final : std::error_category {
    const char* name() const noexcept override { return "rpmapp"; }
    std::string message(int value) const override {
      return std::string(to_string(static_cast<errc>(value)));
    }
  };
  static const category instance;
  return instance;
}

RPMAPP_DECL std::string Error::message() const {
  std::string text(max_message, '\0');
  std::size_t size = detail::write_message(*this, text.data(), text.size());
  if (size > text.size()) {  // a longer strerror text than any known
    text.resize(size);
    size = detail::write_message(*this, text.data(), text.size());
  }
  text.resize(size);
  return text;
}

RPMAPP_DECL std::size_t detail::write_message(const Error& error, char* buffer,
                                              std::size_t room) noexcept {
  BoundedWriter out(buffer, room);
  if (!error.operation().empty() && error.operation() != error.call()) {
    out.put(error.operation());
    out.put(": ");
  }
  if (!error.call().empty()) {
    out.put(error.call());
    out.put(": ");
  }
  out.put(to_string(error.code()));
  if (const int e = error.sys_errno(); e != 0) {
    char buf[128];
    out.put(": ");
    out.put(std::string_view(pick_strerror(strerror_r(e, buf, sizeof buf), buf)));
    out.put(" (errno ");
    out.put_number(e < 0, e < 0 ? 0u - static_cast<unsigned>(e) : static_cast<unsigned>(e), 10, 0);
    out.put(')');
  }
  if (!error.reason().empty()) {
    out.put(": ");
    out.put(error.reason());
  }
  return out.size();
}

RPMAPP_END_NAMESPACE
