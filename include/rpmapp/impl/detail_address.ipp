// Definitions of rpmapp/detail/address.hpp: parsing, checking and printing numeric addresses.
#pragma once

#include <rpmapp/detail/address.hpp>

#include <ifaddrs.h>
#include <net/if.h>

#include <cstdlib>
#include <cstring>

RPMAPP_BEGIN_NAMESPACE
namespace detail {

RPMAPP_DECL expected<std::uint16_t> parse_port(const char* call, std::string_view port) noexcept {
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

RPMAPP_DECL ScopedText split_scope(std::string_view addr) noexcept {
  const auto percent = addr.find('%');
  if (percent == std::string_view::npos) return {addr, {}, false};
  return {addr.substr(0, percent), addr.substr(percent + 1), true};
}

RPMAPP_DECL bool parse_ipv4(std::string_view host, in_addr* out) noexcept {
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

RPMAPP_DECL bool parse_host(int family, std::string_view host, void* out) noexcept {
  if (family == AF_INET) return parse_ipv4(host, static_cast<in_addr*>(out));
  char text[INET6_ADDRSTRLEN + 1];
  if (host.empty() || host.size() >= sizeof text || host.find('\0') != std::string_view::npos)
    return false;
  host.copy(text, host.size());
  text[host.size()] = '\0';
  return inet_pton(family, text, out) == 1;
}

RPMAPP_DECL unsigned scope_index(std::string_view scope) noexcept {
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

RPMAPP_DECL SocketAddress SocketAddress::ipv4_any(std::uint16_t port) noexcept {
  SocketAddress a;  // zeroed
  a.v4.sin_family = AF_INET;
  a.v4.sin_port = htons(port);
  return a;
}

RPMAPP_DECL expected<void> check_numeric_address(const char* call, std::string_view addr,
                                                 SocketAddress* out) noexcept {
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

RPMAPP_DECL std::string scope_text(unsigned index) {
  char name[IF_NAMESIZE];
  if (if_indextoname(index, name) != nullptr) return name;
  return std::to_string(index);
}

RPMAPP_DECL std::string canonical_address(std::string_view addr) {
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

RPMAPP_DECL bool is_wildcard(std::string_view addr) noexcept {
  if (addr.empty()) return true;
  // IPv4 has one spelling of 0.0.0.0 (no leading zeros: parse_ipv4)
  if (addr.find(':') == std::string_view::npos) return addr == "0.0.0.0";
  in6_addr v6{};
  if (addr.find('%') != std::string_view::npos) return false;
  return parse_host(AF_INET6, addr, &v6) && IN6_IS_ADDR_UNSPECIFIED(&v6);
}

RPMAPP_DECL std::uint16_t port_of(const sockaddr* sa) noexcept {
  if (sa->sa_family == AF_INET) return ntohs(reinterpret_cast<const sockaddr_in*>(sa)->sin_port);
  if (sa->sa_family == AF_INET6)
    return ntohs(reinterpret_cast<const sockaddr_in6*>(sa)->sin6_port);
  return 0;
}

RPMAPP_DECL std::string address_of(const sockaddr* sa) {
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

RPMAPP_DECL unsigned interface_with(const in6_addr& local) noexcept {
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

RPMAPP_DECL std::string peer_address_of(rdma_cm_id* id) {
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

}  // namespace detail
RPMAPP_END_NAMESPACE
