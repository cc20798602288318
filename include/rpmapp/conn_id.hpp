// rpmapp::ConnId: the number of a connection that tags its completions in a shared queue.
#pragma once

#include <rpmapp/version.hpp>

#include <compare>
#include <cstdint>
#include <functional>

RPMAPP_BEGIN_NAMESPACE

/// A connection's identity within the process: given when its request is made (ConnReq::id,
/// the same number as Conn::id afterwards) and never given again, so a completion tagged with
/// it names that connection even after it was released and its queue pair number reused.
/// A completion read from a queue shared by several connections (SharedCq, a shared receive
/// queue's CQ) comes tagged with its connection's ConnId (Cq::get with a `conns` span).
/// The empty ConnId (value 0) tags a completion of a queue pair that is no connection's
/// (one made with raw verbs).
struct ConnId {
  std::uint64_t value = 0;

  explicit operator bool() const noexcept { return value != 0; }
  friend bool operator==(ConnId, ConnId) noexcept = default;
  friend auto operator<=>(ConnId, ConnId) noexcept = default;
};

namespace detail {
/// The next unused ConnId (process-wide, never 0). Thread-safe.
ConnId next_conn_id() noexcept;
}  // namespace detail

RPMAPP_END_NAMESPACE

/// Hashing, for maps from a connection to the application's state of it.
template <>
struct std::hash<rpmapp::ConnId> {
  std::size_t operator()(rpmapp::ConnId id) const noexcept { return std::hash<std::uint64_t>{}(id.value); }
};

#if !defined(RPMAPP_SEPARATE_COMPILATION)
#  include <rpmapp/impl/conn_id.ipp>
#endif
