// Validating addresses and ports, and building the socket addresses rdma_cm binds and
// resolves.
#pragma once

#include <rpmapp/detail/errors.hpp>
#include <rpmapp/detail/handles.hpp>

#include <arpa/inet.h>
#include <netinet/in.h>

#include <bit>
#include <cstdint>
#include <string>
#include <string_view>

RPMAPP_BEGIN_NAMESPACE
namespace detail {

/// A port string: decimal digits only, 0..65535 (no sign, no spaces, at most 5 digits).
expected<std::uint16_t> parse_port(const char* call, std::string_view port) noexcept;

/// A numeric address split at its '%': "fe80::1%eth0" -> "fe80::1" and "eth0".
struct ScopedText {
  std::string_view host;
  std::string_view scope;  // empty when there is no '%'
  bool has_scope = false;
};

ScopedText split_scope(std::string_view addr) noexcept;

/// Dotted-decimal IPv4 as inet_pton(AF_INET) accepts it: exactly four parts of 1-3 digits,
/// each 0..255 without a leading zero ("01" is refused), nothing else. Parsed here rather
/// than by inet_pton: every listen and connect checks its address, and this is several
/// times cheaper (the fuzz target fuzz_address compares the two).
bool parse_ipv4(std::string_view host, in_addr* out) noexcept;

/// inet_pton of `host` for `family` into `out` (an in_addr or in6_addr). A NUL inside
/// `host` is refused: inet_pton (and getaddrinfo) would stop there and take the
/// prefix ("1.2.3.4\0junk" as 1.2.3.4).
bool parse_host(int family, std::string_view host, void* out) noexcept;

/// The interface index a scope names: a decimal index or an interface name; 0 when no
/// interface has it (getaddrinfo accepts both forms).
unsigned scope_index(std::string_view scope) noexcept;

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
  static SocketAddress ipv4_any(std::uint16_t port) noexcept;
};

/// A numeric IPv4 or IPv6 address (no name resolution, which could block for long). An
/// IPv6 link-local address needs a scope, "fe80::1%eth0" or "fe80::1%3", naming an
/// existing interface: rdma_cm refuses a link-local bind without one (EINVAL) and cannot
/// route to one; a scope on any other address is refused (the kernel would ignore it).
/// When `out` is given, it gets the address with port 0 (only on success).
expected<void> check_numeric_address(const char* call, std::string_view addr,
                                     SocketAddress* out = nullptr) noexcept;

/// A scope id as text: the interface's name, or the number when no interface has it.
std::string scope_text(unsigned index);

/// The canonical text of a numeric address ("::0" -> "::", "FE80::0001%3" ->
/// "fe80::1%eth0": the scope as the interface's name when it has one); "" when it is not
/// numeric. Equals address_of() of the address check_numeric_address makes of `addr`.
std::string canonical_address(std::string_view addr);

/// "", and any spelling of 0.0.0.0 or :: ("::0", "0::0"), listen on all devices.
bool is_wildcard(std::string_view addr) noexcept;

std::uint16_t port_of(const sockaddr* sa) noexcept;

/// The numeric address of `sa` ("" for an unknown family). An IPv6 address with a scope
/// id gets it back as "%<interface name>" (or "%<index>" when no interface has that
/// index), as getnameinfo(NI_NUMERICHOST) writes it, so that the text can be passed back
/// to ConnReq::to or Endpoint::listen.
std::string address_of(const sockaddr* sa);

/// The index of the one interface that carries the IPv6 address `local`; 0 when none or
/// several do, or getifaddrs fails.
unsigned interface_with(const in6_addr& local) noexcept;

/// The peer address of a connection's `id`, as address_of writes it. rdma_cm reports an
/// accepted request's addresses without a scope id (cma_save_ip6_info), so a link-local
/// peer gets the scope of the local address, or else of the one interface that carries
/// the local address (the request came in on that link).
std::string peer_address_of(rdma_cm_id* id);

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

#if !defined(RPMAPP_SEPARATE_COMPILATION)
#  include <rpmapp/impl/detail_address.ipp>
#endif
