// Private data framing: what a peer's CONNECT_REQUEST, ESTABLISHED and REJECTED events
// deliver (any length rdma_cm's 8-bit length can declare, padded as rdma_cm pads or not)
// is exactly what ConnReq/Conn::private_data() and copy_private_data() give; what the
// caller sends with accept/connect/reject is checked against the protocol's limits and
// reaches the provider byte for byte; a refused send (inval) leaves the request usable.
// Input (front to back): flags, then length-prefixed byte strings (see Reader::text):
//   flags bit 0: server side (an incoming request) else client side (ConnReq::to)
//   server: request data, copy buffer size, action (0 accept, 1 reject, 2 drop),
//           data to send, then events on the connection as for the client
//   client: data to send with connect, then up to 4 events: type (0 ESTABLISHED,
//           1 REJECTED, 2 DISCONNECTED, 3 CONNECT_ERROR), pad flag, data; each followed
//           by a copy buffer size.
#include "fuzz_fake.hpp"

#include <rpmapp/rpmapp.hpp>

#include <algorithm>
#include <array>
#include <cstring>
#include <vector>

using namespace rpmapp;

namespace {

using Bytes = std::vector<std::byte>;

Bytes bytes_of(std::string_view s, std::size_t pad_to = 0) {
  Bytes b(reinterpret_cast<const std::byte*>(s.data()), reinterpret_cast<const std::byte*>(s.data()) + s.size());
  if (b.size() < pad_to) b.resize(pad_to, std::byte{0});
  return b;
}

bool same(std::span<const std::byte> a, const Bytes& b) {
  return a.size() == b.size() && std::equal(a.begin(), a.end(), b.begin());
}

/// copy_private_data into a poisoned buffer of `size` bytes: all of it or nothing.
template <class T>
void check_copy(const T& owner, const Bytes& expected, std::size_t size, std::string_view call) {
  std::array<std::byte, 300> buf;
  buf.fill(std::byte{0xAB});
  auto copied = owner.copy_private_data(std::span<std::byte>(buf.data(), size));
  if (size < expected.size()) {
    FUZZ_CHECK(!copied);
    fuzz::check_inval(copied.error(), call);
    FUZZ_CHECK(std::all_of(buf.begin(), buf.end(), [](std::byte b) { return b == std::byte{0xAB}; }));
    return;
  }
  FUZZ_CHECK_MSG(copied.has_value(), copied.error().message());
  FUZZ_CHECK(*copied == expected.size());
  FUZZ_CHECK(std::equal(expected.begin(), expected.end(), buf.begin()));
  FUZZ_CHECK(std::all_of(buf.begin() + static_cast<long>(expected.size()), buf.end(),
                         [](std::byte b) { return b == std::byte{0xAB}; }));
}

template <class T>
void check_private(const T& owner, const Bytes& expected, fuzz::Reader& in, std::string_view call) {
  auto data = owner.private_data();
  FUZZ_CHECK_MSG(data.has_value(), data.error().message());
  FUZZ_CHECK(same(*data, expected));
  const std::string_view text = as_text(*data);
  FUZZ_CHECK(text.find('\0') == std::string_view::npos);
  FUZZ_CHECK(text.size() <= data->size());
  FUZZ_CHECK(std::equal(text.begin(), text.end(), reinterpret_cast<const char*>(data->data())));
  check_copy(owner, expected, std::min<std::size_t>(in.u8() + in.u8(), 300), call);
}

/// Up to 4 events on a connection; the private data the Conn holds follows the model:
/// the first non-empty ESTABLISHED data when none is held yet, any non-empty REJECTED data.
void events(fake::FakeProvider& fake, Conn& conn, Bytes held, fuzz::Reader& in) {
  const int fd = *conn.fd();
  for (int i = 0; i < 4 && !in.empty(); ++i) {
    static constexpr rdma_cm_event_type types[] = {RDMA_CM_EVENT_ESTABLISHED, RDMA_CM_EVENT_REJECTED,
                                                   RDMA_CM_EVENT_DISCONNECTED,
                                                   RDMA_CM_EVENT_CONNECT_ERROR};
    const rdma_cm_event_type type = types[in.u8() & 3];
    const bool pad = in.flag();
    const std::string_view sent = in.text();
    fake.inject_event(fd, type, sent, 0, pad);
    const std::size_t pad_to = !pad ? 0 : type == RDMA_CM_EVENT_ESTABLISHED ? 196
                                         : type == RDMA_CM_EVENT_REJECTED  ? 148 : 0;
    const Bytes delivered = bytes_of(sent, pad_to);
    auto event = conn.try_next_event();
    if (!event) {
      // DISCONNECTED after an earlier end of the connection is swallowed: nothing to report.
      fuzz::check_error(event.error());
      FUZZ_CHECK_MSG(event.error().code() == errc::no_event && type == RDMA_CM_EVENT_DISCONNECTED,
                     event.error().message());
    } else if (type == RDMA_CM_EVENT_ESTABLISHED) {
      FUZZ_CHECK(*event == ConnEvent::established);
      if (held.empty()) held = delivered;
    } else if (type == RDMA_CM_EVENT_REJECTED) {
      FUZZ_CHECK(*event == ConnEvent::rejected);
      if (!delivered.empty()) held = delivered;
    }
    check_private(conn, held, in, "Conn::copy_private_data");
  }
}

void server(fake::FakeProvider& fake, const Peer& peer, fuzz::Reader& in) {
  auto ep = Endpoint::listen(peer, "169.254.77.1", "7471");
  FUZZ_CHECK_MSG(ep.has_value(), ep.error().message());
  fake::Request request;
  request.private_data = std::string(in.text());
  fake.inject_connect_request(*ep->fd(), request);
  auto req = ep->try_next_conn_req();
  FUZZ_CHECK_MSG(req.has_value(), req.error().message());
  const Bytes from_client = bytes_of(request.private_data, max_connect_private_data);
  check_private(*req, from_client, in, "ConnReq::copy_private_data");

  const int action = in.u8() % 3;
  const std::string_view reply = in.text();
  const auto reply_bytes = as_bytes(reply);
  if (action == 0) {
    auto conn = std::move(*req).connect(reply_bytes);
    if (reply.size() > max_accept_private_data) {
      FUZZ_CHECK(!conn);
      fuzz::check_inval(conn.error(), "ConnReq::connect");
      FUZZ_CHECK(static_cast<bool>(*req));  // refused before anything was sent
      FUZZ_CHECK(fake.accepts.empty());
      conn = std::move(*req).connect(reply_bytes.first(max_accept_private_data));
    }
    FUZZ_CHECK_MSG(conn.has_value(), conn.error().message());
    FUZZ_CHECK(fake.accepts.size() == 1);
    FUZZ_CHECK(same(fake.accepts[0].data, bytes_of(reply.substr(0, max_accept_private_data))));
    check_private(*conn, from_client, in, "Conn::copy_private_data");  // the request's
    events(fake, *conn, from_client, in);
  } else if (action == 1) {
    auto rejected = std::move(*req).reject(reply_bytes);
    if (reply.size() > max_reject_private_data) {
      FUZZ_CHECK(!rejected);
      fuzz::check_inval(rejected.error(), "ConnReq::reject");
      FUZZ_CHECK(static_cast<bool>(*req));
      FUZZ_CHECK(fake.rejects.empty());
      rejected = std::move(*req).reject(reply_bytes.first(max_reject_private_data));
    }
    FUZZ_CHECK_MSG(rejected.has_value(), rejected.error().message());
    FUZZ_CHECK(fake.rejects.size() == 1);
    FUZZ_CHECK(same(fake.rejects[0].data, bytes_of(reply.substr(0, max_reject_private_data))));
  }
  // action 2: dropped (rejected without data by the destructor)
}

void client(fake::FakeProvider& fake, const Peer& peer, fuzz::Reader& in) {
  auto req = ConnReq::to(peer, "169.254.77.9", "7471");
  FUZZ_CHECK_MSG(req.has_value(), req.error().message());
  check_private(*req, {}, in, "ConnReq::copy_private_data");
  const std::string_view sent = in.text();
  auto conn = std::move(*req).connect(as_bytes(sent));
  if (sent.size() > max_connect_private_data) {
    FUZZ_CHECK(!conn);
    fuzz::check_inval(conn.error(), "ConnReq::connect");
    FUZZ_CHECK(static_cast<bool>(*req));
    FUZZ_CHECK(fake.connects.empty());
    conn = std::move(*req).connect(as_bytes(sent.substr(0, max_connect_private_data)));
  }
  FUZZ_CHECK_MSG(conn.has_value(), conn.error().message());
  FUZZ_CHECK(fake.connects.size() == 1);
  FUZZ_CHECK(same(fake.connects[0].data, bytes_of(sent.substr(0, max_connect_private_data))));
  events(fake, *conn, {}, in);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  fuzz::Reader in(data, size);
  fake::FakeProvider fake;
  fake.watchdog = std::chrono::milliseconds(200);
  {
    Peer peer = fuzz::open_peer(fake);
    if (in.flag()) server(fake, peer, in);
    else client(fake, peer, in);
  }
  fuzz::check_clean(fake);
  return 0;
}
