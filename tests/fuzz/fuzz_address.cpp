// Address and port strings: detail::parse_port, check_numeric_address, canonical_address
// and is_wildcard against an independent model (inet_pton on the text as a C string,
// if_nametoindex/if_indextoname for a scope), then the same strings through
// Endpoint::listen, ConnReq::to and Peer::from_address on the fake provider. The socket
// address check_numeric_address builds is compared with getaddrinfo(AI_NUMERICHOST)'s.
// Input: flags byte (bit 0: listen, bit 1: connect, bit 2: Peer::from_address, bit 3:
// remote), then a length-prefixed address and a length-prefixed port.
#include "fuzz_fake.hpp"

#include <rpmapp/detail/address.hpp>
#include <rpmapp/rpmapp.hpp>

#include <arpa/inet.h>
#include <net/if.h>
#include <netdb.h>

#include <climits>
#include <cstring>
#include <string>

using namespace rpmapp;

namespace {

// ---- the model: what the documentation says is accepted

std::optional<unsigned> model_port(std::string_view port) {
  if (port.empty() || port.size() > 5) return std::nullopt;
  unsigned value = 0;
  for (char c : port) {
    if (c < '0' || c > '9') return std::nullopt;
    value = value * 10 + static_cast<unsigned>(c - '0');
  }
  if (value > 65535) return std::nullopt;
  return value;
}

/// The text is one C string (no NUL inside: what getaddrinfo would see is all of it).
bool c_string(std::string_view s) { return s.find('\0') == std::string_view::npos; }

bool scope_names_interface(std::string_view scope) {
  if (scope.empty() || !c_string(scope) || scope.size() > IF_NAMESIZE) return false;
  const std::string text(scope);
  if (text.find_first_not_of("0123456789") == std::string::npos) {
    if (text.size() > 10) return false;
    const unsigned long long index = std::strtoull(text.c_str(), nullptr, 10);
    char name[IF_NAMESIZE];
    return index != 0 && index <= UINT32_MAX && if_indextoname(static_cast<unsigned>(index), name) != nullptr;
  }
  return if_nametoindex(text.c_str()) != 0;
}

/// Whether `addr` is a numeric address the library must accept (check_numeric_address).
bool model_address(std::string_view addr) {
  if (!c_string(addr)) return false;
  const auto percent = addr.find('%');
  const std::string host(addr.substr(0, percent));
  in_addr v4{};
  in6_addr v6{};
  if (inet_pton(AF_INET, host.c_str(), &v4) == 1) return percent == std::string_view::npos;
  if (inet_pton(AF_INET6, host.c_str(), &v6) != 1) return false;
  if (percent == std::string_view::npos) return !IN6_IS_ADDR_LINKLOCAL(&v6);
  return IN6_IS_ADDR_LINKLOCAL(&v6) && scope_names_interface(addr.substr(percent + 1));
}

void pure(std::string_view addr, std::string_view port) {
  auto number = detail::parse_port("fuzz", port);
  const auto want = model_port(port);
  FUZZ_CHECK_MSG(number.has_value() == want.has_value(), std::string(port));
  if (number) FUZZ_CHECK(*number == *want);
  else fuzz::check_inval(number.error(), "fuzz");

  detail::SocketAddress built;
  auto checked = detail::check_numeric_address("fuzz", addr, &built);
  const bool accepted = model_address(addr);
  FUZZ_CHECK_MSG(checked.has_value() == accepted, std::string(addr));
  if (!checked) fuzz::check_inval(checked.error(), "fuzz");
  if (checked) {  // the address getaddrinfo makes of the text, as rdma_getaddrinfo would
    addrinfo hints{};
    hints.ai_flags = AI_NUMERICHOST | AI_PASSIVE;
    hints.ai_socktype = SOCK_STREAM;
    addrinfo* theirs = nullptr;
    const std::string text(addr);
    FUZZ_CHECK_MSG(getaddrinfo(text.c_str(), nullptr, &hints, &theirs) == 0, text);
    const std::size_t size =
        built.any.sa_family == AF_INET ? sizeof(sockaddr_in) : sizeof(sockaddr_in6);
    FUZZ_CHECK_MSG(theirs->ai_addrlen == size && std::memcmp(built.get(), theirs->ai_addr, size) == 0,
                   text);
    freeaddrinfo(theirs);
  }

  const std::string canonical = detail::canonical_address(addr);
  if (accepted) {
    FUZZ_CHECK_MSG(!canonical.empty(), std::string(addr));
    // Canonical text is a fixed point and still an accepted address.
    FUZZ_CHECK_MSG(detail::canonical_address(canonical) == canonical, canonical);
    FUZZ_CHECK_MSG(detail::check_numeric_address("fuzz", canonical).has_value(), canonical);
  }
  if (detail::is_wildcard(addr))
    FUZZ_CHECK_MSG(addr.empty() || canonical == "0.0.0.0" || canonical == "::", std::string(addr));
}

void check_result_error(const Error& e, bool inputs_valid) {
  fuzz::check_error(e);
  // Valid text may still be refused by the "system" (no device has it, unreachable...),
  // but never for being malformed; invalid text is always inval.
  if (!inputs_valid) FUZZ_CHECK_MSG(e.code() == errc::inval, e.message());
}

void through_fake(std::uint8_t flags, std::string_view addr, std::string_view port) {
  fake::FakeProvider fake;
  fake.watchdog = std::chrono::milliseconds(200);
  {
    Peer peer = fuzz::open_peer(fake);
    const auto port_value = model_port(port);
    if (flags & 1) {
      auto ep = Endpoint::listen(peer, addr, port);
      const bool valid = port_value && (detail::is_wildcard(addr) || model_address(addr));
      if (!ep) {
        check_result_error(ep.error(), valid);
      } else {
        FUZZ_CHECK_MSG(valid, std::string(addr) + ":" + std::string(port));
        auto bound = ep->port();
        FUZZ_CHECK(bound.has_value());
        if (*port_value != 0) FUZZ_CHECK(*bound == *port_value);
        else FUZZ_CHECK(*bound != 0);
        auto local = ep->local_address();
        FUZZ_CHECK(local.has_value());
        if (!detail::is_wildcard(addr)) FUZZ_CHECK_MSG(*local == detail::canonical_address(addr), *local);
      }
    }
    if (flags & 2) {
      ConnConfig cfg;
      cfg.timeout = std::chrono::milliseconds(50);
      auto req = ConnReq::to(peer, addr, port, cfg);
      const bool valid = port_value && *port_value != 0 && model_address(addr);
      if (!req) {
        check_result_error(req.error(), valid);
      } else {
        FUZZ_CHECK_MSG(valid, std::string(addr) + ":" + std::string(port));
        auto to = req->peer_address();
        FUZZ_CHECK(to.has_value());
        FUZZ_CHECK_MSG(*to == detail::canonical_address(addr), *to);
        FUZZ_CHECK(req->peer_port().has_value() && *req->peer_port() == *port_value);
      }
    }
  }
  if (flags & 4) {
    auto found = Peer::from_address(addr, (flags & 8) ? AddressKind::remote : AddressKind::local,
                                    std::chrono::milliseconds(50));
    if (!found) check_result_error(found.error(), model_address(addr));
    else FUZZ_CHECK_MSG(model_address(addr), std::string(addr));
  }
  fuzz::check_clean(fake);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  fuzz::Reader in(data, size);
  const std::uint8_t flags = in.u8();
  const std::string_view addr = in.text();
  const std::string_view port = in.text();
  pure(addr, port);
  if (flags & 7) through_fake(flags, addr, port);
  return 0;
}
