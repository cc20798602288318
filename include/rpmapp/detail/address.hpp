// Validating addresses and ports, and building the socket addresses rdma_cm binds and
// resolves.
#pragma once

#include <rpmapp/detail/errors.hpp>
#include <rpmapp/detail/handles.hpp>

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>

#include <bit>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <string_view>

RPMAPP_BEGIN_NAMESPACE
namespace detail {

/// A port string: decimal digits only, 0..65535 (no sign, no spaces, at most 5 digits).
inline expected<std::uint16_t> parse_port(const char* call, std::string_view port) noexcept {
  bool digits_only = !port.empty() && port.size() <= 5;
  unsigned value = 0;
  for (char c : port) {
    if (c < '0' || c > '9') {
      digits_only = false;
      break;
    }
    value = value * 10 + static_cast<unsigned>(c - '0');
  }
  if (!digits_only || value > 65535)
    return fail(invalid(call, "port \"{}\" is not a decimal number in 0..65535", port));
  return static_cast<std::uint16_t>(value);
}

/// A numeric address split at its '%': "fe80::1%eth0" -> "fe80::1" and "eth0".
struct ScopedText {
  std::string_view host;
  std::string_view scope;  // empty when there is no '%'
  bool has_scope = false;
};

inline ScopedText split_scope(std::string_view addr) noexcept {
  const auto percent = addr.find('%');
  if (percent == std::string_view::npos) return {addr, {}, false};
  return {addr.substr(0, percent), addr.substr(percent + 1), true};
}

/// Dotted-decimal IPv4 as inet_pton(AF_INET) accepts it: exactly four parts of 1-3 digits,
/// each 0..255 without a leading zero ("01" is refused), nothing else. Parsed here rather
/// than by inet_pton: every listen and connect checks its address, and this is several
/// times cheaper (the fuzz target fuzz_address compares the two).
inline bool parse_ipv4(std::string_view host, in_addr* out) noexcept {
  const auto digit = [](char c) noexcept { return static_cast<unsigned>(c - '0'); };
  const char* p = host.data();
  const char* const end = p + host.size();
  unsigned char bytes[4];
  for (int part = 0; part < 4; ++part) {
    if (part > 0 && (p == end || *p++ != '.')) return false;
    if (p == end || digit(*p) > 9) return false;
    unsigned value = digit(*p++);
    if (value == 0) {  // "0" alone: a leading zero is refused
      if (p != end && digit(*p) <= 9) return false;
    } else {
      for (int more = 0; more < 2 && p != end && digit(*p) <= 9; ++more)
        value = value * 10 + digit(*p++);
      if (value > 255) return false;
    }
    bytes[part] = static_cast<unsigned char>(value);
  }
  if (p != end) return false;
  std::memcpy(out, bytes, sizeof bytes);  // already in network order
  return true;
}

/// inet_pton of `host` for `family` into `out` (an in_addr or in6_addr). A NUL inside
/// `host` is refused: inet_pton (and getaddrinfo) would stop there and take the
/// prefix ("1.2.3.4\0junk" as 1.2.3.4).
inline bool parse_host(int family, std::string_view host, void* out) noexcept {
  if (family == AF_INET) return parse_ipv4(host, static_cast<in_addr*>(out));
  char text[INET6_ADDRSTRLEN + 1];
  if (host.empty() || host.size() >= sizeof text || host.find('\0') != std::string_view::npos)
    return false;
  host.copy(text, host.size());
  text[host.size()] = '\0';
  return inet_pton(family, text, out) == 1;
}

/// The interface index a scope names: a decimal index or an interface name; 0 when no
/// interface has it (getaddrinfo accepts both forms).
inline unsigned scope_index(std::string_view scope) noexcept {
  char text[IF_NAMESIZE + 1];
  if (scope.empty() || scope.size() >= sizeof text || scope.find('\0') != std::string_view::npos)
    return 0;
  scope.copy(text, scope.size());
  text[scope.size()] = '\0';
  if (scope.find_first_not_of("0123456789") == std::string_view::npos) {
    if (scope.size() > 10) return 0;
    const unsigned long long index = std::strtoull(text, nullptr, 10);
    char name[IF_NAMESIZE];
    if (index == 0 || index > UINT32_MAX ||
        if_indextoname(static_cast<unsigned>(index), name) == nullptr)
      return 0;
    return static_cast<unsigned>(index);
  }
  return if_nametoindex(text);
}

/// A socket address for rdma_bind_addr and rdma_resolve_addr, built from a checked numeric
/// address as getaddrinfo(AI_NUMERICHOST) builds it (family, address, port, scope id).
/// rpmapp builds it itself rather than asking rdma_getaddrinfo: that call runs
/// getaddrinfo(3), allocates three times and, for a destination, asks ibacm (where it runs)
/// for an InfiniBand route, which rdma_resolve_route finds anyway.
struct SocketAddress {
  union {
    sockaddr any;
    sockaddr_in v4;
    sockaddr_in6 v6;
  };
  SocketAddress() noexcept : v6{} {}
  sockaddr* get() noexcept { return &any; }
  void set_port(std::uint16_t port) noexcept {
    if (any.sa_family == AF_INET) v4.sin_port = htons(port);
    else v6.sin6_port = htons(port);
  }
  /// 0.0.0.0 (the IPv4 wildcard) and `port`.
  static SocketAddress ipv4_any(std::uint16_t port) noexcept {
    SocketAddress a;  // zeroed
    a.v4.sin_family = AF_INET;
    a.v4.sin_port = htons(port);
    return a;
  }
};

/// A numeric IPv4 or IPv6 address (no name resolution, which could block for long). An
/// IPv6 link-local address needs a scope, "fe80::1%eth0" or "fe80::1%3", naming an
/// existing interface: rdma_cm refuses a link-local bind without one (EINVAL) and cannot
/// route to one; a scope on any other address is refused (the kernel would ignore it).
/// When `out` is given, it gets the address with port 0 (only on success).
inline expected<void> check_numeric_address(const char* call, std::string_view addr,
                                            SocketAddress* out = nullptr) noexcept {
  in_addr v4;
  if (parse_ipv4(addr, &v4)) {  // the common case first: no '%' to look for
    if (out != nullptr) {
      *out = SocketAddress::ipv4_any(0);
      out->v4.sin_addr = v4;
    }
    return {};
  }
  const ScopedText parts = split_scope(addr);
  in6_addr v6{};
  if (parts.has_scope && parse_host(AF_INET, parts.host, &v4)) {
    return fail(invalid(call, "address \"{}\": a scope id is for IPv6 link-local addresses only",
                        addr));
  }
  if (!parse_host(AF_INET6, parts.host, &v6))
    return fail(invalid(call, "address \"{}\" is not a numeric IPv4 or IPv6 address", addr));
  const bool link_local = IN6_IS_ADDR_LINKLOCAL(&v6);
  unsigned scope = 0;
  if (!parts.has_scope) {
    if (link_local)
      return fail(invalid(call, "link-local address \"{}\" needs a scope: \"{}%<interface>\"",
                          addr, addr));
  } else {
    if (!link_local)
      return fail(invalid(call, "address \"{}\": a scope id is for IPv6 link-local addresses only",
                          addr));
    scope = scope_index(parts.scope);
    if (scope == 0)
      return fail(invalid(call, "address \"{}\": no network interface \"{}\"", addr, parts.scope));
  }
  if (out != nullptr) {
    *out = SocketAddress();
    out->v6.sin6_family = AF_INET6;
    out->v6.sin6_addr = v6;
    out->v6.sin6_scope_id = scope;
  }
  return {};
}

/// A scope id as text: the interface's name, or the number when no interface has it.
inline std::string scope_text(unsigned index) {
  char name[IF_NAMESIZE];
  if (if_indextoname(index, name) != nullptr) return name;
  return std::to_string(index);
}

/// The canonical text of a numeric address ("::0" -> "::", "FE80::0001%3" ->
/// "fe80::1%eth0": the scope as the interface's name when it has one); "" when it is not
/// numeric. Equals address_of() of the address check_numeric_address makes of `addr`.
inline std::string canonical_address(std::string_view addr) {
  const ScopedText parts = split_scope(addr);
  in6_addr storage{};
  char out[INET6_ADDRSTRLEN] = "";
  if (parse_host(AF_INET, parts.host, &storage)) {
    if (parts.has_scope) return {};
    inet_ntop(AF_INET, &storage, out, sizeof out);
    return out;
  }
  if (!parse_host(AF_INET6, parts.host, &storage)) return {};
  inet_ntop(AF_INET6, &storage, out, sizeof out);
  std::string text(out);
  if (parts.has_scope) {
    if (parts.scope.empty()) return {};
    const unsigned index = scope_index(parts.scope);
    text += '%';
    if (index != 0) text += scope_text(index);
    else text += parts.scope;
  }
  return text;
}

/// "", and any spelling of 0.0.0.0 or :: ("::0", "0::0"), listen on all devices.
inline bool is_wildcard(std::string_view addr) noexcept {
  if (addr.empty()) return true;
  // IPv4 has one spelling of 0.0.0.0 (no leading zeros: parse_ipv4)
  if (addr.find(':') == std::string_view::npos) return addr == "0.0.0.0";
  in6_addr v6{};
  if (addr.find('%') != std::string_view::npos) return false;
  return parse_host(AF_INET6, addr, &v6) && IN6_IS_ADDR_UNSPECIFIED(&v6);
}

inline std::uint16_t port_of(const sockaddr* sa) noexcept {
  if (sa->sa_family == AF_INET) return ntohs(reinterpret_cast<const sockaddr_in*>(sa)->sin_port);
  if (sa->sa_family == AF_INET6)
    return ntohs(reinterpret_cast<const sockaddr_in6*>(sa)->sin6_port);
  return 0;
}

/// The numeric address of `sa` ("" for an unknown family). An IPv6 address with a scope
/// id gets it back as "%<interface name>" (or "%<index>" when no interface has that
/// index), as getnameinfo(NI_NUMERICHOST) writes it, so that the text can be passed back
/// to ConnReq::to or Endpoint::listen.
inline std::string address_of(const sockaddr* sa) {
  char text[INET6_ADDRSTRLEN] = "";
  if (sa->sa_family == AF_INET) {
    inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in*>(sa)->sin_addr, text, sizeof text);
    return text;
  }
  if (sa->sa_family != AF_INET6) return text;
  const auto* sin6 = reinterpret_cast<const sockaddr_in6*>(sa);
  inet_ntop(AF_INET6, &sin6->sin6_addr, text, sizeof text);
  std::string out(text);
  if (sin6->sin6_scope_id != 0) out += '%' + scope_text(sin6->sin6_scope_id);
  return out;
}

/// The index of the one interface that carries the IPv6 address `local`; 0 when none or
/// several do, or getifaddrs fails.
inline unsigned interface_with(const in6_addr& local) noexcept {
  ifaddrs* list = nullptr;
  if (getifaddrs(&list) != 0) return 0;
  unsigned found = 0;
  bool several = false;
  for (const ifaddrs* i = list; i != nullptr; i = i->ifa_next) {
    if (i->ifa_addr == nullptr || i->ifa_addr->sa_family != AF_INET6) continue;
    const auto* a = reinterpret_cast<const sockaddr_in6*>(i->ifa_addr);
    if (std::memcmp(&a->sin6_addr, &local, sizeof local) != 0) continue;
    const unsigned index = if_nametoindex(i->ifa_name);
    if (found != 0 && index != found) several = true;
    found = index;
  }
  freeifaddrs(list);
  return several ? 0 : found;
}

/// The peer address of a connection's `id`, as address_of writes it. rdma_cm reports an
/// accepted request's addresses without a scope id (cma_save_ip6_info), so a link-local
/// peer gets the scope of the local address, or else of the one interface that carries
/// the local address (the request came in on that link).
inline std::string peer_address_of(rdma_cm_id* id) {
  const sockaddr* peer = rdma_get_peer_addr(id);
  if (peer->sa_family != AF_INET6) return address_of(peer);
  sockaddr_in6 scoped = *reinterpret_cast<const sockaddr_in6*>(peer);
  const sockaddr* local = rdma_get_local_addr(id);
  if (scoped.sin6_scope_id == 0 && IN6_IS_ADDR_LINKLOCAL(&scoped.sin6_addr) &&
      local->sa_family == AF_INET6) {
    const auto* own = reinterpret_cast<const sockaddr_in6*>(local);
    if (own->sin6_scope_id != 0) scoped.sin6_scope_id = own->sin6_scope_id;
    else if (IN6_IS_ADDR_LINKLOCAL(&own->sin6_addr))
      scoped.sin6_scope_id = interface_with(own->sin6_addr);
  }
  return address_of(reinterpret_cast<const sockaddr*>(&scoped));
}

/// The IB service ID rdma_cm derives for an RDMA_PS_TCP port, in network byte order.
constexpr std::uint64_t tcp_service_id(std::uint16_t port) noexcept {
  std::uint64_t host = (static_cast<std::uint64_t>(RDMA_PS_TCP) << 16) | port;
  if constexpr (std::endian::native == std::endian::little) {
    std::uint64_t net = 0;
    for (int i = 0; i < 8; ++i) net = (net << 8) | ((host >> (8 * i)) & 0xff);
    return net;
  } else {
    return host;
  }
}

inline std::string_view device_name(const ibv_context* ctx) noexcept {
  return ctx && ctx->device ? std::string_view(ctx->device->name) : std::string_view();
}

}  // namespace detail
RPMAPP_END_NAMESPACE
