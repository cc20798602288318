// rpmapp::Error and errc: values, messages, std::error_code and fmt.
#include "test_util.hpp"

#include <fmt/format.h>

#include <cstdint>
#include <limits>
#include <set>
#include <system_error>

namespace errors_test {

using namespace test;

TEST_CASE("errc values equal librpma's RPMA_E_* codes", "[error]") {
  CHECK(static_cast<int>(errc::unknown) == -100000);
  CHECK(static_cast<int>(errc::nosupp) == -100001);
  CHECK(static_cast<int>(errc::provider) == -100002);
  CHECK(static_cast<int>(errc::nomem) == -100003);
  CHECK(static_cast<int>(errc::inval) == -100004);
  CHECK(static_cast<int>(errc::no_completion) == -100005);
  CHECK(static_cast<int>(errc::no_event) == -100006);
  CHECK(static_cast<int>(errc::again) == -100007);
  CHECK(static_cast<int>(errc::shared_channel) == -100008);
  CHECK(static_cast<int>(errc::not_shared_chnl) == -100009);
}

TEST_CASE("every errc has its own text", "[error]") {
  std::set<std::string> texts;
  for (int v = -100009; v <= -100000; ++v) {
    auto text = str(to_string(static_cast<errc>(v)));
    CHECK(!text.empty());
    CHECK(text != "unrecognized error code");
    texts.insert(text);
  }
  CHECK(texts.size() == 10);
  CHECK(str(to_string(static_cast<errc>(42))) == "unrecognized error code");
}

TEST_CASE("Error::message names the call, the errno text and the reason", "[error]") {
  Error e(errc::provider, EADDRINUSE, "rdma_listen", "port 7471");
  CHECK(e.code() == errc::provider);
  CHECK(e.sys_errno() == EADDRINUSE);
  CHECK(e.call() == "rdma_listen");
  CHECK(e.reason() == "port 7471");
  CHECK(e.message() ==
        fmt::format("rdma_listen: provider error: {} (errno {}): port 7471",
                    std::generic_category().message(EADDRINUSE), EADDRINUSE));

  SECTION("no errno, no reason") {
    Error inval(errc::inval, 0, "Endpoint::listen");
    CHECK(inval.message() == "Endpoint::listen: invalid argument");
  }
  SECTION("no call") {
    Error bare(errc::no_event, 0, "");
    CHECK(bare.call() == "");
    CHECK(bare.message() == "no next event available");
  }
  SECTION("default constructed") {
    Error none;
    CHECK(none.code() == errc::unknown);
    CHECK(none.sys_errno() == 0);
    CHECK(none.message() == "unknown error");
  }
  SECTION("a long reason is truncated, not overflowed") {
    std::string reason(500, 'x');
    Error long_one(errc::inval, 0, "f", reason);
    CHECK(long_one.reason().size() == Error::max_reason);
    CHECK(long_one.reason() == std::string(Error::max_reason, 'x'));
  }
}

TEST_CASE("Error::operation names the rpmapp function; message() leads with it", "[error]") {
  Error e(errc::provider, ECONNREFUSED, "rdma_resolve_route");
  CHECK(e.operation() == "");  // a provider function's name is not the operation
  const std::string tail = e.message();
  e.name_operation("ConnReq::to");
  CHECK(e.operation() == "ConnReq::to");
  CHECK(e.call() == "rdma_resolve_route");
  CHECK(e.message() == "ConnReq::to: " + tail);
  SECTION("the outer name replaces the inner one") {
    e.name_operation("Peer::open").name_operation("Peer::from_address");
    CHECK(e.operation() == "Peer::from_address");
  }
  SECTION("a call with a scope is its own operation, said once") {
    Error inval(errc::inval, 0, "Conn::write", "out of bounds");
    CHECK(inval.operation() == "Conn::write");
    CHECK(inval.message() == "Conn::write: invalid argument: out of bounds");
  }
  SECTION("truncated, not overflowed") {
    e.name_operation(std::string(100, 'o'));
    CHECK(e.operation() == std::string(Error::max_operation, 'o'));
  }
  SECTION("compared") {
    Error other(errc::provider, ECONNREFUSED, "rdma_resolve_route");
    CHECK_FALSE(e == other);
    other.name_operation("ConnReq::to");
    CHECK(e == other);
  }
}

TEST_CASE("review 2 (porting): an Error from a provider failure names the public function that "
          "was called",
          "[error]") {
  fake::FakeProvider fake;
  {
    Peer peer = open_peer(fake);
    // ConnReq::to runs PendingConnReq::wait: the name is the caller's
    fake.fail("rdma_resolve_route", ENETUNREACH);
    auto req = ConnReq::to(peer, "169.254.77.9", "7471");
    REQUIRE_FALSE(req);
    check_injected(req.error(), "rdma_resolve_route", ENETUNREACH);
    CHECK(req.error().operation() == "ConnReq::to");
    CHECK_THAT(req.error().message(), Catch::StartsWith("ConnReq::to: rdma_resolve_route: provider error: "));
    // Peer::from_address runs Peer::open
    fake.fail("ibv_alloc_pd", EACCES);
    auto other = Peer::from_address(fake::FakeProvider::address(0), AddressKind::local);
    REQUIRE_FALSE(other);
    check_injected(other.error(), "ibv_alloc_pd", EACCES);
    CHECK(other.error().operation() == "Peer::from_address");
  }
  fake.expect_clean();
}

TEST_CASE("Error compares by value and with an errc", "[error]") {
  Error a(errc::provider, EIO, "rdma_listen", "x");
  Error b = a;
  CHECK(a == b);
  CHECK(a == errc::provider);
  CHECK_FALSE(a == errc::inval);
  CHECK_FALSE(a == Error(errc::provider, EIO, "rdma_listen", "y"));
  CHECK_FALSE(a == Error(errc::provider, EPERM, "rdma_listen", "x"));
  CHECK_FALSE(a == Error(errc::provider, EIO, "rdma_bind_addr", "x"));
}

TEST_CASE("errc and Error interoperate with std::error_code", "[error]") {
  std::error_code ec = errc::inval;  // is_error_code_enum
  CHECK(ec.category().name() == std::string("rpmapp"));
  CHECK(ec.value() == -100004);
  CHECK(ec.message() == "invalid argument");
  CHECK(ec == make_error_code(errc::inval));
  CHECK(&ec.category() == &rpmapp_category());

  Error e(errc::provider, EADDRINUSE, "rdma_listen");
  CHECK(e.error_code() == errc::provider);
  CHECK(e.system_error_code() == std::error_code(EADDRINUSE, std::system_category()));
  CHECK(e.system_error_code() == std::errc::address_in_use);
  CHECK(Error(errc::inval, 0, "f").system_error_code().value() == 0);
}

TEST_CASE("fmt formats Error and errc", "[error]") {
  Error e(errc::provider, EIO, "rdma_connect", "why");
  CHECK(fmt::format("{}", e) == e.message());
  CHECK(fmt::format("[{}]", errc::no_event) == "[no next event available]");
  CHECK(fmt::format("{:>15}", errc::nomem) == "  out of memory");
  CHECK(fmt::format("{:*^17}|{:.3}", errc::nomem, errc::inval) == "**out of memory**|inv");
  // what a string does not take fails at run time (the spec is applied with fmt::runtime);
  // nested fields and over-long specs fail in parse
  CHECK_THROWS_AS(fmt::format(fmt::runtime("{:d}"), errc::nomem), fmt::format_error);
  CHECK_THROWS_AS(fmt::format(fmt::runtime("{:{}}"), errc::nomem, 3), fmt::format_error);
  CHECK_THROWS_AS(fmt::format(fmt::runtime("{:>" + std::string(40, '9') + "}"), errc::nomem),
                  fmt::format_error);
  CHECK(fmt::format("{:>29}", errc::nomem).size() == 29);   // 3 characters of spec: kept
}

TEST_CASE("Error is a small value type that does not allocate", "[error]") {
  STATIC_REQUIRE(std::is_nothrow_copy_constructible_v<Error>);
  STATIC_REQUIRE(std::is_trivially_copyable_v<Error>);
  STATIC_REQUIRE(sizeof(Error) <= 256);
}

TEST_CASE("expected_backend matches the build", "[error]") {
#if defined(RPMAPP_USE_STD_EXPECTED)
  CHECK(str(expected_backend) == "std");
  STATIC_REQUIRE(std::is_same_v<expected<int>, std::expected<int, Error>>);
#else
  CHECK(str(expected_backend) == "tl");
  STATIC_REQUIRE(std::is_same_v<expected<int>, tl::expected<int, Error>>);
#if defined(__cpp_lib_expected) && !defined(RPMAPP_USE_TL_EXPECTED)
  FAIL("the standard library has std::expected but the tl back end was chosen");
#endif
#endif
}

TEST_CASE("a provider ENOMEM is nomem, other errnos are provider", "[error]") {
  auto nomem = detail::provider_error("ibv_create_cq", ENOMEM);
  CHECK(nomem.code() == errc::nomem);
  CHECK(nomem.sys_errno() == ENOMEM);
  auto other = detail::provider_error("ibv_create_cq", EINVAL);
  CHECK(other.code() == errc::provider);
  CHECK(other.call() == "ibv_create_cq");
}

TEST_CASE("a provider call that fails without errno says so", "[error]") {
  CHECK(detail::provider_error("ibv_create_cq", 0).message() ==
        "ibv_create_cq: provider error: the call failed without setting errno");
  CHECK(detail::provider_error("ibv_poll_cq", 0, "returned -1").message() ==
        "ibv_poll_cq: provider error: returned -1");
  // through a Peer's queue: what siw's provider does at its 145th CQ in a context
  fake::FakeProvider fake;
  Peer peer = open_peer(fake);
  fake.fail("ibv_create_cq", 0);
  auto cq = SharedCq::create(peer, {});
  REQUIRE_FALSE(cq);
  CHECK(cq.error().code() == errc::provider);
  CHECK(cq.error().sys_errno() == 0);
  CHECK_THAT(str(cq.error().message()), Catch::Contains("ibv_create_cq: provider error: the call failed without setting errno"));
}

TEST_CASE("reasons are formatted as fmt formats them", "[error]") {
  // detail::format_to_n stands in for fmt::format_to_n in every reason and log line (a
  // macro: the format string must stay a literal for the compile-time check).
#define ours(...)                                                                    \
  [&] {                                                                              \
    char buf[200];                                                                   \
    const std::size_t n = rpmapp::detail::format_to_n(buf, sizeof buf, __VA_ARGS__).size; \
    return std::string(buf, std::min(n, sizeof buf));                                \
  }()
  const long long extremes[] = {0, 1, -1, 9, 10, -10, 255, 0x7fffffffLL, -0x80000000LL,
                                std::numeric_limits<long long>::max(), std::numeric_limits<long long>::min()};
  for (long long v : extremes) {
    CHECK(ours("{}", v) == fmt::format("{}", v));
    CHECK(ours("0x{:x}", v) == fmt::format("0x{:x}", v));
    CHECK(ours("{:02x}|{:08x}", v, v) == fmt::format("{:02x}|{:08x}", v, v));
  }
  const unsigned long long uextremes[] = {0, 7, 0xab, 0xffffffffULL, std::numeric_limits<unsigned long long>::max()};
  for (unsigned long long v : uextremes) {
    CHECK(ours("{} {:x} {:04x}", v, v, v) == fmt::format("{} {:x} {:04x}", v, v, v));
  }
  const std::uint8_t byte = 0x5;
  CHECK(ours("usage 0x{:02x}", byte) == fmt::format("usage 0x{:02x}", byte));
  CHECK(ours("{} {} {}", std::int16_t{-3}, std::uint16_t{65535}, static_cast<signed char>(-128)) ==
        fmt::format("{} {} {}", std::int16_t{-3}, std::uint16_t{65535}, static_cast<signed char>(-128)));
  const std::string s = "text";
  CHECK(ours("\"{}\" {}:{} ({})", s, std::string_view("sv"), "lit", static_cast<const char*>("ptr")) ==
        "\"text\" sv:lit (ptr)");
  CHECK(ours("{{}} {{{}}}", 1) == fmt::format("{{}} {{{}}}", 1));
  CHECK(ours("no fields") == "no fields");
#undef ours

  SECTION("cut off at the buffer, whole length returned, like fmt::format_to_n") {
    char small[5];
    const auto n = rpmapp::detail::format_to_n(small, sizeof small, "{}-{}", 12345, "abc").size;
    char theirs[5];
    const auto m = fmt::format_to_n(theirs, sizeof theirs, "{}-{}", 12345, "abc").size;
    CHECK(n == m);
    CHECK(std::string_view(small, sizeof small) == std::string_view(theirs, sizeof theirs));
  }
  SECTION("an Error's message, also cut off") {
    Error e(errc::provider, EADDRINUSE, "rdma_listen", "port 7471");
    char buf[16];
    const auto n = rpmapp::detail::write_message(e, buf, sizeof buf);
    CHECK(n == e.message().size());
    CHECK(std::string_view(buf, sizeof buf) == e.message().substr(0, sizeof buf));
    CHECK(fmt::format("{}", Error(errc::inval, -5, "f")) == Error(errc::inval, -5, "f").message());
    CHECK(Error(errc::inval, -5, "f").message().ends_with(" (errno -5)"));
  }
}

TEST_CASE("the reason formatter's compile-time check", "[error]") {
  using rpmapp::detail::count_fields;
  STATIC_REQUIRE(count_fields("a {} b {:x} c {:02x}") == 3);
  STATIC_REQUIRE(count_fields("{{}}") == 0);
  STATIC_REQUIRE(count_fields("{0}") == -1);
  STATIC_REQUIRE(count_fields("{:>8}") == -1);
  STATIC_REQUIRE(count_fields("{:2x}") == -1);
  STATIC_REQUIRE(count_fields("{:d}") == -1);
  STATIC_REQUIRE(count_fields("a } b") == -1);
  STATIC_REQUIRE(count_fields("a {") == -1);
}

}  // namespace errors_test
