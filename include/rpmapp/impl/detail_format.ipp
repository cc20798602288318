// The formatter of error reasons and log lines: its non-template work (cold code).
#pragma once

#include <rpmapp/detail/format.hpp>

#include <cstddef>
#include <initializer_list>
#include <string_view>

RPMAPP_BEGIN_NAMESPACE

RPMAPP_DECL void detail::format_into(BoundedWriter& out, std::string_view format,
                                     std::initializer_list<FormatArg> args) noexcept {
  const FormatArg* arg = args.begin();
  for (std::size_t i = 0; i < format.size(); ++i) {
    const char c = format[i];
    if (c != '{' && c != '}') {
      out.put(c);
      continue;
    }
    if (i + 1 < format.size() && format[i + 1] == c) {  // "{{" or "}}"
      out.put(c);
      ++i;
      continue;
    }
    const std::size_t close = format.find('}', i);
    const std::string_view field = format.substr(i + 1, close - i - 1);
    const FieldSpec spec = parse_field_spec(field.empty() ? field : field.substr(1));
    i = close;
    if (arg == args.end()) continue;
    const unsigned base = spec.hex ? 16 : 10;
    switch (arg->kind()) {
      case FormatArg::Kind::text: out.put(arg->text()); break;
      case FormatArg::Kind::unsigned_number: out.put_number(false, arg->unsigned_value(), base, spec.width); break;
      case FormatArg::Kind::signed_number: {
        const long long v = arg->signed_value();
        const auto magnitude = v < 0 ? 0ull - static_cast<unsigned long long>(v) : static_cast<unsigned long long>(v);
        out.put_number(v < 0, magnitude, base, spec.width);
        break;
      }
    }
    ++arg;
  }
}

RPMAPP_DECL std::size_t detail::format_to_buffer(char* buffer, std::size_t room,
                                                 std::string_view format,
                                                 std::initializer_list<FormatArg> args) noexcept {
  BoundedWriter out(buffer, room);
  format_into(out, format, args);
  return out.size();
}

RPMAPP_END_NAMESPACE
