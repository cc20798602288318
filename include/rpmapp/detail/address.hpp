// Validating addresses and ports, and asking rdma_getaddrinfo for them.
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

/// "", "0.0.0.0" and "::" listen on all devices.
inline bool is_wildcard(std::string_view addr) noexcept {
  return addr.empty() || addr == "0.0.0.0" || addr == "::";
}

/// A numeric IPv4 or IPv6 address (no name resolution, which could block for long).
inline expected<void> check_numeric_address(const char* call, std::string_view addr) noexcept {
  char text[INET6_ADDRSTRLEN + 1];
  in6_addr storage{};
  bool ok = !addr.empty() && addr.size() < sizeof text;
  if (ok) {
    addr.copy(text, addr.size());
    text[addr.size()] = '\0';
    ok = inet_pton(AF_INET, text, &storage) == 1 || inet_pton(AF_INET6, text, &storage) == 1;
  }
  if (!ok) return fail(invalid(call, "address \"{}\" is not a numeric IPv4 or IPv6 address", addr));
  return {};
}

/// rdma_getaddrinfo for a numeric address and port (RDMA_PS_TCP). `passive` binds.
inline expected<AddrInfo> get_addr_info(const std::string& node, const std::string& service,
                                        bool passive) noexcept {
  rdma_addrinfo hints{};
  hints.ai_flags = RAI_NUMERICHOST | (passive ? RAI_PASSIVE : 0);
  hints.ai_port_space = RDMA_PS_TCP;
  hints.ai_qp_type = IBV_QPT_RC;
  rdma_addrinfo* info = nullptr;
  errno = 0;
  int rc = provider().getaddrinfo(node.c_str(), service.empty() ? nullptr : service.c_str(),
                                  &hints, &info);
  if (rc != 0) {
    int e = errno != 0 ? errno : EADDRNOTAVAIL;
    return fail(make_error(e == ENOMEM ? errc::nomem : errc::provider, e, "rdma_getaddrinfo",
                           "cannot resolve {}:{} (code {})", node, service, rc));
  }
  return AddrInfo(info);
}

/// The canonical text of a numeric address ("::0" -> "::"); "" when it is not numeric.
inline std::string canonical_address(std::string_view addr) {
  const std::string text(addr);
  in6_addr storage{};
  char out[INET6_ADDRSTRLEN] = "";
  for (int family : {AF_INET, AF_INET6})
    if (inet_pton(family, text.c_str(), &storage) == 1 &&
        inet_ntop(family, &storage, out, sizeof out) != nullptr)
      return out;
  return {};
}

inline std::uint16_t port_of(const sockaddr* sa) noexcept {
  if (sa->sa_family == AF_INET) return ntohs(reinterpret_cast<const sockaddr_in*>(sa)->sin_port);
  if (sa->sa_family == AF_INET6)
    return ntohs(reinterpret_cast<const sockaddr_in6*>(sa)->sin6_port);
  return 0;
}

/// The numeric address of `sa` ("" for an unknown family).
inline std::string address_of(const sockaddr* sa) {
  char text[INET6_ADDRSTRLEN] = "";
  if (sa->sa_family == AF_INET)
    inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in*>(sa)->sin_addr, text, sizeof text);
  else if (sa->sa_family == AF_INET6)
    inet_ntop(AF_INET6, &reinterpret_cast<const sockaddr_in6*>(sa)->sin6_addr, text, sizeof text);
  return text;
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
