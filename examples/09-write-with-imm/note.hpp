// 09-write-with-imm: what the client sends after its write where the device has no
// immediate data (iWARP): the value and the number of bytes written, in host order (both
// ends are one transport, and this example runs them on one machine's kind).
#pragma once

#include <cstdint>

struct ImmNote {
  std::uint32_t value;
  std::uint32_t length;
};
static_assert(sizeof(ImmNote) == 8);
