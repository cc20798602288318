// The definitions of rpmapp/conn_id.hpp: the process's counter of connections.
#pragma once

#include <rpmapp/conn_id.hpp>

#include <atomic>

RPMAPP_BEGIN_NAMESPACE

RPMAPP_DECL ConnId detail::next_conn_id() noexcept {
  // 64 bits: at a million connections a second, half a million years before it wraps.
  static std::atomic<std::uint64_t> last{0};
  return ConnId{last.fetch_add(1, std::memory_order_relaxed) + 1};
}

RPMAPP_END_NAMESPACE
