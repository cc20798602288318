// CM event sequences replayed through the fake provider: the input is a script of
// operations on an Endpoint, incoming and outgoing requests (ConnReq, PendingConnReq),
// connections (Conn) and an EventLoop (serve, watch, resolve, run_once), interleaved with
// events the "network" delivers (any rdma_cm event type, status and private data, on any
// live channel), provider calls made to fail with an errno (the nth next call), and events
// taken by another thread between a poll and the read. No call waits: every read is a
// try_ form or run_once(0), so one input runs in well under a millisecond of fake time.
// Invariants: no crash, undefined behaviour or leak (ASan); every public call returns a
// value or an Error whose message names the call; once everything is destroyed, every
// cm_id, channel, fd, queue pair, CQ, epoll and eventfd the fake handed out is released,
// every event acknowledged, and the fake recorded no misuse (fuzz::check_clean).
// Input: a flags byte (bit 0: outgoing resolution held until op 12 delivers it; bit 1:
// destroy the loop before the objects), then operations of one opcode byte and their
// argument bytes (see run()).
#include "fuzz_fake.hpp"

#include <rpmapp/rpmapp.hpp>

#include <array>
#include <optional>
#include <vector>

using namespace rpmapp;

namespace {

constexpr std::size_t slots = 4;

constexpr const char* failable[] = {
    "rdma_create_event_channel", "fcntl", "rdma_create_id", "rdma_bind_addr",
    "rdma_listen", "rdma_get_cm_event", "rdma_ack_cm_event", "poll", "ibv_create_comp_channel",
    "ibv_create_cq", "ibv_req_notify_cq", "rdma_create_qp", "rdma_migrate_id", "rdma_accept",
    "rdma_reject", "rdma_connect", "rdma_disconnect", "rdma_destroy_id", "ibv_destroy_cq",
    "ibv_destroy_comp_channel", "rdma_resolve_addr", "rdma_resolve_route", "epoll_create1",
    "epoll_ctl", "epoll_wait", "eventfd", "read", "write", "close", "ibv_poll_cq"};
constexpr int errnos[] = {ENOMEM, EINVAL, ETIMEDOUT, EAGAIN, ENODEV, ECONNREFUSED, EINTR,
                          EBUSY, ENOTRECOVERABLE};
constexpr const char* addresses[] = {"169.254.77.9", "169.254.78.9", "10.0.0.1", "169.254.77.1"};

struct World {
  fake::FakeProvider& fake;
  Peer peer;
  std::optional<Endpoint> ep;
  std::array<std::optional<ConnReq>, slots> reqs;
  std::array<std::optional<PendingConnReq>, slots> pendings;
  std::array<std::optional<Conn>, slots> conns;
  std::optional<EventLoop> loop;
  std::vector<Registration> regs;

  template <class T> std::optional<T>* free_slot(std::array<std::optional<T>, slots>& a) {
    for (auto& s : a)
      if (!s) return &s;
    return nullptr;
  }
};

template <class T> void keep(std::optional<T>* slot, expected<T>&& result) {
  if (!result) return fuzz::check_error(result.error());
  FUZZ_CHECK(static_cast<bool>(*result));
  if (slot) slot->emplace(std::move(*result));
}

void check(const expected<void>& r) {
  if (!r) fuzz::check_error(r.error());
}

std::string payload(fuzz::Reader& in) {
  auto b = in.bytes(in.u8() % 64);
  return {reinterpret_cast<const char*>(b.data()), b.size()};
}

void inject(World& w, int fd, fuzz::Reader& in) {
  const auto type = static_cast<rdma_cm_event_type>(in.u8() % (RDMA_CM_EVENT_TIMEWAIT_EXIT + 1));
  const int status = static_cast<int>(static_cast<std::int8_t>(in.u8()));
  const bool pad = in.flag();
  w.fake.inject_event(fd, type, payload(in), status, pad);
}

/// The fd of a live event channel chosen by `pick`, or -1.
int some_fd(World& w, std::uint8_t pick) {
  std::vector<int> fds;
  if (w.ep) fds.push_back(*w.ep->fd());
  for (auto& c : w.conns)
    if (c) fds.push_back(*c->fd());
  for (auto& p : w.pendings)
    if (p) fds.push_back(*p->fd());
  return fds.empty() ? -1 : fds[pick % fds.size()];
}

void run(World& w, fuzz::Reader& in) {
  for (int step = 0; step < 64 && !in.empty(); ++step) {
    const std::uint8_t op = in.u8();
    const std::uint8_t arg = in.u8();
    const std::size_t i = arg % slots;
    switch (op % 20) {
      case 0:  // listen
        if (!w.ep) keep(&w.ep, Endpoint::listen(w.peer, (arg & 1) ? "" : "169.254.77.1", (arg & 2) ? "0" : "7471"));
        break;
      case 1:  // a connection request arrives (on either device)
        if (w.ep) {
          fake::Request r;
          r.device = (arg >> 2) & 1;
          r.private_data = payload(in);
          w.fake.inject_connect_request(*w.ep->fd(), r);
        }
        break;
      case 2:  // take a request
        if (w.ep) {
          ConnConfig cfg;
          cfg.reuse_event_channel = (arg & 128) != 0;  // a spare channel of the Peer's
          cfg.completion_channel = (arg & 64) == 0;     // CQs without one, only polled
          cfg.reuse_completion_queues = (arg & 72) == 72;  // and spare CQs of the Peer's
          auto r = w.ep->try_next_conn_req(cfg);
          if (!r) fuzz::check_error(r.error());
          else if (auto* s = w.free_slot(w.reqs)) s->emplace(std::move(*r));
        }
        break;
      case 3:  // the nth next call of something fails
        w.fake.fail(failable[in.u8() % std::size(failable)], errnos[arg % std::size(errnos)], 1 + (in.u8() % 3));
        break;
      case 4:  // start an outgoing request
        if (auto* s = w.free_slot(w.pendings)) {
          ConnConfig cfg;
          cfg.timeout = std::chrono::milliseconds(20);
          cfg.reuse_event_channel = (arg & 128) != 0;
          cfg.completion_channel = (arg & 64) == 0;
          cfg.reuse_completion_queues = (arg & 72) == 72;
          keep(s, ConnReq::start(w.peer, addresses[arg % std::size(addresses)], "7471", cfg));
        }
        break;
      case 5:  // advance a resolution
        if (w.pendings[i]) {
          auto r = std::move(*w.pendings[i]).try_wait();
          if (!r) {
            fuzz::check_error(r.error());
            if (r.error().code() != errc::no_event) FUZZ_CHECK(!*w.pendings[i]);  // consumed
          }
          if (!*w.pendings[i]) w.pendings[i].reset();
          if (r) {
            if (auto* s = w.free_slot(w.reqs)) s->emplace(std::move(*r));
          }
        }
        break;
      case 6:  // accept / connect
        if (w.reqs[i]) {
          const std::string data = payload(in);
          auto c = std::move(*w.reqs[i]).connect(as_bytes(data));
          if (!c && c.error().code() == errc::inval) FUZZ_CHECK(static_cast<bool>(*w.reqs[i]));
          else w.reqs[i].reset();
          keep(w.free_slot(w.conns), std::move(c));
        }
        break;
      case 7:  // reject, close or drop a request
        if (w.reqs[i]) {
          if (arg & 16) check(std::move(*w.reqs[i]).reject(as_bytes(payload(in))));
          else if (arg & 32) check(std::move(*w.reqs[i]).close());
          w.reqs[i].reset();
        }
        break;
      case 8: {  // an event arrives on some channel
        const int fd = some_fd(w, arg);
        if (fd >= 0 && (!w.ep || fd != *w.ep->fd())) inject(w, fd, in);
        break;
      }
      case 9:  // read a connection's event
        if (w.conns[i]) {
          auto e = w.conns[i]->try_next_event();
          if (!e) fuzz::check_error(e.error());
          auto data = w.conns[i]->private_data();
          FUZZ_CHECK(data.has_value());
        }
        break;
      case 10:
        if (w.conns[i]) check(w.conns[i]->disconnect());
        break;
      case 11:  // close or drop a connection
        if (w.conns[i]) {
          if (arg & 16) check(std::move(*w.conns[i]).close());
          w.conns[i].reset();
        }
        break;
      case 12:
        w.fake.deliver_held();
        break;
      case 13:  // resolution will end in an error event
        w.fake.addr_event = (arg & 16) ? RDMA_CM_EVENT_ADDR_ERROR : RDMA_CM_EVENT_ADDR_RESOLVED;
        w.fake.route_event = (arg & 32) ? RDMA_CM_EVENT_ROUTE_ERROR : RDMA_CM_EVENT_ROUTE_RESOLVED;
        w.fake.addr_status = (arg & 16) ? -EHOSTUNREACH : 0;
        w.fake.route_status = (arg & 32) ? -ETIMEDOUT : 0;
        break;
      case 14:  // the event loop
        if (!w.loop) keep(&w.loop, EventLoop::create());
        break;
      case 15:  // serve the endpoint: requests go to free request slots (or are dropped)
        if (w.loop && w.ep) {
          auto r = w.loop->serve(*w.ep, [&w](expected<ConnReq> req) {
            if (!req) return fuzz::check_error(req.error());
            if (auto* s = w.free_slot(w.reqs)) s->emplace(std::move(*req));
          });
          if (!r) fuzz::check_error(r.error());
          else w.regs.push_back(std::move(*r));
        }
        break;
      case 16:  // watch a connection
        if (w.loop && w.conns[i]) {
          auto r = w.loop->watch(*w.conns[i], [](expected<ConnEvent> e) {
            if (!e) fuzz::check_error(e.error());
          });
          if (!r) fuzz::check_error(r.error());
          else w.regs.push_back(std::move(*r));
        }
        break;
      case 17:  // the loop takes over a resolution
        if (w.loop && w.pendings[i]) {
          auto r = w.loop->resolve(std::move(*w.pendings[i]), [&w](expected<ConnReq> req) {
            if (!req) return fuzz::check_error(req.error());
            if (auto* s = w.free_slot(w.reqs)) s->emplace(std::move(*req));
          });
          if (!*w.pendings[i]) w.pendings[i].reset();
          if (!r) fuzz::check_error(r.error());
          else w.regs.push_back(std::move(*r));
        }
        break;
      case 18:  // one turn of the loop, or drop a registration
        if (w.loop && !(arg & 64)) {
          auto n = w.loop->run_once(std::chrono::milliseconds(0));
          if (!n) fuzz::check_error(n.error());
        } else if (!w.regs.empty()) {
          w.regs.erase(w.regs.begin() + static_cast<long>(arg % w.regs.size()));
        }
        break;
      case 19: {  // librdmacm's own events, another reader between poll and read, shutdown
        const int fd = some_fd(w, arg);
        if (fd < 0) break;
        if (arg & 16) w.fake.inject_internal_event(fd);
        else if (arg & 32) w.fake.take_after_poll(fd);
        else if (w.ep && (arg & 64)) {
          check(std::move(*w.ep).shutdown());
          w.ep.reset();
        }
        break;
      }
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  fuzz::Reader in(data, size);
  const std::uint8_t flags = in.u8();
  fake::FakeProvider fake;
  fake.watchdog = std::chrono::milliseconds(100);
  fake.auto_resolve = (flags & 1) == 0;
  {
    World w{fake, fuzz::open_peer(fake), {}, {}, {}, {}, {}, {}};
    run(w, in);
    if (flags & 2) w.loop.reset();  // the loop goes first: registrations must survive it
    // The rest goes in declaration order reversed (registrations, loop, conns, ...).
  }
  fuzz::check_clean(fake);
  return 0;
}
