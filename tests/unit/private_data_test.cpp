// Text as private data (as_bytes, as_bytes_with_nul, as_text), and the texts of
// to_string(errc) and to_string(ConnEvent) as the docs list them (log scrapers rely on them).
#include "test_util.hpp"

#include <cstring>
#include <fstream>
#include <map>
#include <sstream>

namespace private_data_test {

using namespace test;

namespace {

/// The rows of `page` (under docs/) whose first cell is `<prefix>NAME`: NAME -> the
/// second cell without its backquotes.
std::map<std::string, std::string> doc_texts(const std::string& page, const std::string& prefix) {
  std::ifstream in(std::string(RPMAPP_SOURCE_ROOT) + "/docs/" + page);
  REQUIRE(in);
  std::map<std::string, std::string> rows;
  const std::string start = "| `" + prefix;
  for (std::string line; std::getline(in, line);) {
    if (line.rfind(start, 0) != 0) continue;
    const auto name_end = line.find('`', start.size());
    const auto text_begin = line.find("| `", name_end);
    const auto text_end = line.find("` |", text_begin + 3);
    REQUIRE(name_end != std::string::npos);
    REQUIRE(text_begin != std::string::npos);
    REQUIRE(text_end != std::string::npos);
    const std::string name = line.substr(start.size(), name_end - start.size());
    INFO(page << ": " << line);
    CHECK(rows.count(name) == 0);  // one row per value
    rows[name] = line.substr(text_begin + 3, text_end - text_begin - 3);
  }
  return rows;
}

}  // namespace

TEST_CASE("as_bytes_with_nul: the C string and its NUL, nothing past it", "[private_data]") {
  // A buffer with sentinels after the NUL: the span must stop at the NUL.
  const char buffer[] = {'h', 'e', 'l', 'l', 'o', '\0', 'X', 'Y', '\0'};
  auto bytes = as_bytes_with_nul(buffer);
  REQUIRE(bytes.size() == 6);
  CHECK(bytes.data() == reinterpret_cast<const std::byte*>(buffer));  // a view, not a copy
  CHECK(bytes[5] == std::byte{0});
  CHECK(as_text(bytes) == "hello");
  CHECK(as_bytes(std::string_view(buffer)).size() == 5);  // the form without the NUL

  CHECK(as_bytes_with_nul("").size() == 1);  // the empty string is its NUL
  CHECK(as_bytes_with_nul(nullptr).empty());
  const std::string text = "from a std::string";
  CHECK(as_bytes_with_nul(text.c_str()).size() == text.size() + 1);

  // as_text stops at the first NUL, or takes all bytes when there is none.
  const std::byte no_nul[] = {std::byte{'a'}, std::byte{'b'}};
  CHECK(as_text(no_nul) == "ab");
}

TEST_CASE("as_bytes_with_nul: the NUL counts against the private data limits", "[private_data]") {
  fake::FakeProvider fake;
  {
    Peer peer = open_peer(fake);
    ConnReq req = outgoing(peer);
    const std::string full(max_connect_private_data, 'x');  // 56 + NUL = 57: too long
    auto bad = std::move(req).connect(as_bytes_with_nul(full.c_str()));
    REQUIRE_FALSE(bad);
    check_inval(bad.error(), "ConnReq::connect", "57");
    CHECK(req);  // left as it was
    CHECK(fake.connects.empty());
    const std::string fits(max_connect_private_data - 1, 'y');
    auto conn = std::move(req).connect(as_bytes_with_nul(fits.c_str()));
    REQUIRE(conn);
    REQUIRE(fake.connects.size() == 1);
    const auto& sent = fake.connects[0].data;
    REQUIRE(sent.size() == max_connect_private_data);
    CHECK(sent.back() == std::byte{0});
    CHECK(as_text(sent) == fits);
  }
  fake.expect_clean();
}

TEST_CASE("docs/error.md lists to_string(errc) exactly", "[private_data][docs]") {
  const auto rows = doc_texts("error.md", "errc::");
  // every errc: librpma's contiguous codes from RPMA_E_UNKNOWN down
  std::size_t values = 0;
  for (int v = static_cast<int>(errc::unknown);; --v) {
    const auto text = to_string(static_cast<errc>(v));
    if (text == "unrecognized error code") break;
    ++values;
    bool listed = false;
    for (const auto& [name, doc] : rows) listed = listed || doc == text;
    INFO("errc " << v << ": \"" << text << "\"");
    CHECK(listed);
  }
  CHECK(values == 10);
  CHECK(rows.size() == values);  // no row for a text that is gone
  CHECK(rows.at("unknown") == to_string(errc::unknown));
  CHECK(rows.at("nosupp") == to_string(errc::nosupp));
  CHECK(rows.at("provider") == to_string(errc::provider));
  CHECK(rows.at("nomem") == to_string(errc::nomem));
  CHECK(rows.at("inval") == to_string(errc::inval));
  CHECK(rows.at("no_completion") == to_string(errc::no_completion));
  CHECK(rows.at("no_event") == to_string(errc::no_event));
  CHECK(rows.at("again") == to_string(errc::again));
  CHECK(rows.at("shared_channel") == to_string(errc::shared_channel));
  CHECK(rows.at("not_shared_chnl") == to_string(errc::not_shared_chnl));
}

TEST_CASE("docs/conn.md lists to_string(ConnEvent) exactly", "[private_data][docs]") {
  const auto rows = doc_texts("conn.md", "ConnEvent::");
  const std::map<std::string, ConnEvent> events = {
      {"established", ConnEvent::established}, {"closed", ConnEvent::closed},
      {"lost", ConnEvent::lost},                {"rejected", ConnEvent::rejected},
      {"unreachable", ConnEvent::unreachable}};
  CHECK(rows.size() == events.size());
  for (const auto& [name, event] : events) {
    INFO(name);
    REQUIRE(rows.count(name) == 1);
    CHECK(rows.at(name) == to_string(event));
  }
  // beyond the last enumerator: the fallback text, listed too
  CHECK(to_string(static_cast<ConnEvent>(static_cast<int>(ConnEvent::unreachable) + 1)) == "undefined");
}

}  // namespace private_data_test
