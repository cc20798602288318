// 13-coroutine: what the server and the client agree on (how many connections, the private
// data and the message of each, where they sit in the registered regions), and the
// completion wait both sides share.
#pragma once

#include "../common/common.hpp"

#include <rpmapp/rpmapp.hpp>
#include <rpmapp/task.hpp>

#include <fmt/core.h>

#include <array>
#include <cstddef>
#include <span>
#include <string>
#include <string_view>

namespace echo {

/// The client opens this many connections at once; the server serves this many and exits.
inline constexpr int connections = 32;
/// Each connection's message fits in one slot of a registered region.
inline constexpr std::size_t slot_size = 64;

/// The private data connection `number` (1..connections) sends: this prefix and the
/// number. The server checks the prefix and echoes the whole text.
inline constexpr std::string_view private_data_prefix = "13-coroutine connection ";
inline std::string private_data_of(int number) { return fmt::format("{}{:02}", private_data_prefix, number); }
/// The message connection `number` sends; the server sends it back.
inline std::string message_of(int number) {
  return fmt::format("message of connection {:02} from the 13-coroutine client", number);
}

/// An error of this example, named after `where`.
inline rpmapp::Error mismatch(const char* where, std::string_view reason) {
  return rpmapp::Error(rpmapp::errc::unknown, 0, where, reason);
}

/// The completions still awaited on a connection's queue: a send's and a receive's may
/// come in either order.
struct Pending {
  bool send = false;
  bool recv = false;
  std::uint32_t received = 0;  // the receive's byte count, once it has come
};

/// Takes completions of `conn`'s queue (bounded by example::wait_bound each) until none of
/// `pending` is left, checking each one's status and opcode.
inline rpmapp::Task<rpmapp::expected<void>> complete(rpmapp::EventLoop& loop, rpmapp::Conn& conn,
                                                     Pending& pending) {
  std::array<ibv_wc, 2> wcs{};
  while (pending.send || pending.recv) {
    auto got = co_await loop.completions(conn, wcs, rpmapp::CqKind::main, example::wait_bound);
    if (!got) co_return rpmapp::unexpected(got.error());
    for (const ibv_wc& wc : *got) {
      if (auto ok = rpmapp::check(wc); !ok) co_return ok;
      if (wc.opcode == IBV_WC_SEND && pending.send) {
        pending.send = false;
      } else if (wc.opcode == IBV_WC_RECV && pending.recv) {
        pending.recv = false;
        pending.received = wc.byte_len;
      } else {
        co_return rpmapp::unexpected(example::unexpected_completion(wc, "a send or a receive"));
      }
    }
  }
  co_return rpmapp::expected<void>{};
}

}  // namespace echo
