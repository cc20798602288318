// rpmapp::EventLoop on a real RDMA stack (Soft-RoCE in tools/rpmapp-vm): a callback server
// with 32 clients (16 on iWARP; two loops on two threads), two handles of one listen_shared listener
// with the same handler served by two loops on two threads (each request handled exactly
// once), a different handler refused, a Conn destroyed by its own handler, and a
// completion handler delivering a real send and receive.
// Catch2 v2 assertions are not thread-safe and must not run inside handlers (a FAIL would
// throw through the loop): handlers record what went wrong, the main thread asserts.
// Needs $SOFTROCE_IP; fails, never skips, without it. Every run is bounded (run_for): a
// hang fails the test.
#include "support.hpp"

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace {

using namespace std::chrono_literals;
using namespace itest;
using rpmapp::Conn;
using rpmapp::ConnEvent;
using rpmapp::ConnReq;
using rpmapp::ConnReqHandler;
using rpmapp::Endpoint;
using rpmapp::errc;
using rpmapp::EventLoop;
using rpmapp::Peer;
using rpmapp::Registration;

// The bound of every run of a loop: generous (the VM may run under TCG), yet four of them
// stay within run-suite's 300 s per test executable; a hang fails the test.
constexpr std::chrono::milliseconds loop_bound = 60s;

// What the handlers saw that was wrong, one line each; the main thread asserts it is empty.
class Problems {
 public:
  void add(std::string what) {
    std::lock_guard lock(mutex_);
    lines_.push_back(std::move(what));
  }
  template <class T> bool failed(const rpmapp::expected<T>& r, const std::string& what) {
    if (r) return false;
    add(what + ": " + r.error().message());
    return true;
  }
  std::string text() {
    std::lock_guard lock(mutex_);
    std::string out;
    for (const auto& line : lines_) out += line + "\n";
    return out;
  }

 private:
  std::mutex mutex_;
  std::vector<std::string> lines_;
};

// The private data of a ConnReq or a Conn as text (thread-safe: no Catch2 macro).
template <class T> std::string text_of(const T& source) {
  auto data = source.private_data();
  return data ? std::string(rpmapp::as_text(*data)) : "(" + data.error().message() + ")";
}

// Outgoing connections driven by one loop: start() begins `count` requests at once
// (ConnReq::start, EventLoop::resolve); each connects with private_data(i) once resolved,
// and its events go to on_event(i, conn, event). close(i) destroys connection i (also
// from inside its own handler). Used on the loop's thread only.
class Clients {
 public:
  using EventHandler = std::function<void(int number, Conn& conn, ConnEvent event)>;
  Clients(EventLoop& loop, Problems& problems) : loop_(loop), problems_(problems) {}

  void start(const Peer& peer, const std::string& ip, const std::string& port, int count,
             std::function<std::string(int)> private_data, EventHandler on_event) {
    private_data_ = std::move(private_data);
    on_event_ = std::move(on_event);
    for (int number = 1; number <= count; ++number) {
      auto pending = ConnReq::start(peer, ip, port);
      if (problems_.failed(pending, "client: ConnReq::start")) return loop_.stop();
      auto reg = loop_.resolve(std::move(*pending), [this, number](rpmapp::expected<ConnReq> req) {
        resolved(number, std::move(req));
      });
      if (problems_.failed(reg, "client: EventLoop::resolve")) return loop_.stop();
      resolving_.push_back(std::move(*reg));
    }
  }
  void close(int number) { open_.erase(number); }
  std::size_t open() const { return open_.size(); }

 private:
  struct Client {
    explicit Client(Conn c) : conn(std::move(c)) {}
    Conn conn;
    Registration events;
  };

  void resolved(int number, rpmapp::expected<ConnReq> req) {
    const std::string who = "client " + std::to_string(number);
    if (problems_.failed(req, who + ": resolution")) return loop_.stop();
    auto conn = std::move(*req).connect(rpmapp::as_bytes(private_data_(number)));
    if (problems_.failed(conn, who + ": ConnReq::connect")) return loop_.stop();
    Client& c = open_.try_emplace(number, std::move(*conn)).first->second;
    auto events = loop_.watch(c.conn, [this, number, who](rpmapp::expected<ConnEvent> event) {
      if (problems_.failed(event, who + ": event")) return loop_.stop();
      on_event_(number, open_.at(number).conn, *event);
    });
    if (problems_.failed(events, who + ": EventLoop::watch")) return loop_.stop();
    c.events = std::move(*events);
  }

  EventLoop& loop_;
  Problems& problems_;
  std::function<std::string(int)> private_data_;
  EventHandler on_event_;
  std::map<int, Client> open_;
  std::vector<Registration> resolving_;
};

}  // namespace

// Issue 10's callback server: one loop serves 32 clients that another loop, on another
// thread, connects at once. Each request's private data is echoed in the accept; the
// client disconnects once established; the server's event handler destroys its connection
// on closed.
TEST_CASE("event loop: a callback server serves 32 clients (16 on iWARP) connecting at once",
          "[event_loop][callback]") {
  const std::string ip = ip1();
  Peer peer = local_peer(ip);
  const int clients = clients_on(ip, 32);
  Problems problems;
  EventLoop server_loop = MUST(EventLoop::create());
  EventLoop client_loop = MUST(EventLoop::create());
  Endpoint endpoint = MUST(Endpoint::listen(peer, ip, "0"));
  const std::string port = port_text(endpoint);

  // Server state: used on the server loop's thread only (read here after the join).
  struct Served {
    explicit Served(Conn c) : conn(std::move(c)) {}
    Conn conn;
    Registration events;
  };
  std::map<int, Served> serving;
  std::multiset<std::string> requests;  // private data of each request handled
  int accepted = 0, established = 0, closed = 0;
  auto on_request = [&](rpmapp::expected<ConnReq> req) {
    if (problems.failed(req, "server: request")) return server_loop.stop();
    const int number = ++accepted;
    const std::string hello = text_of(*req);
    requests.insert(hello);
    auto conn = std::move(*req).connect(rpmapp::as_bytes("echo: " + hello));
    if (problems.failed(conn, "server: ConnReq::connect")) return server_loop.stop();
    Served& s = serving.try_emplace(number, std::move(*conn)).first->second;
    auto events = server_loop.watch(s.conn, [&, number](rpmapp::expected<ConnEvent> event) {
      if (problems.failed(event, "server: event")) return server_loop.stop();
      if (*event == ConnEvent::established) return void(++established);
      if (*event != ConnEvent::closed) {
        problems.add("server: unexpected event " + std::string(rpmapp::to_string(*event)));
        return server_loop.stop();
      }
      serving.erase(number);  // the connection's own handler destroys it
      if (++closed == clients) server_loop.stop();
    });
    if (problems.failed(events, "server: EventLoop::watch")) return server_loop.stop();
    s.events = std::move(*events);
  };
  Registration served = MUST(server_loop.serve(endpoint, on_request));

  // Client state: used on the client loop's thread only.
  Clients fleet(client_loop, problems);
  int echoes = 0, done = 0;
  auto hello = [](int number) { return "client " + std::to_string(number); };
  auto on_client_event = [&](int number, Conn& conn, ConnEvent event) {
    const std::string who = hello(number);
    if (event == ConnEvent::established) {
      if (text_of(conn) == "echo: " + who) ++echoes;
      else problems.add(who + ": echo \"" + text_of(conn) + "\"");
      problems.failed(conn.disconnect(), who + ": disconnect");
      return;
    }
    if (event != ConnEvent::closed) {
      problems.add(who + ": unexpected event " + std::string(rpmapp::to_string(event)));
      return client_loop.stop();
    }
    fleet.close(number);
    if (++done == clients) client_loop.stop();
  };

  rpmapp::expected<void> server_ran, client_ran;
  std::thread server_thread([&] { server_ran = server_loop.run_for(loop_bound); });
  std::thread client_thread([&] {
    fleet.start(peer, ip, port, clients, hello, on_client_event);
    client_ran = client_loop.run_for(loop_bound);
  });
  client_thread.join();
  if (done < clients) server_loop.stop();  // the server would wait for the missing ones
  server_thread.join();

  INFO(problems.text());
  CHECK(problems.text().empty());
  if (!server_ran) FAIL_CHECK("server loop: " << server_ran.error().message());
  if (!client_ran) FAIL_CHECK("client loop: " << client_ran.error().message());
  CHECK(accepted == clients);
  CHECK(established == clients);
  CHECK(closed == clients);
  CHECK(serving.empty());
  CHECK(echoes == clients);
  CHECK(done == clients);
  CHECK(fleet.open() == 0);
  std::multiset<std::string> expected;
  for (int number = 1; number <= clients; ++number) expected.insert(hello(number));
  CHECK(requests == expected);  // each request reached the handler exactly once
}

// ib_cm_insert_listen: a listener shared by two handles with the same handler, each served
// by a loop on its own thread. 64 requests (16 on iWARP); the handler rejects each, naming it in the reject
// data. Each must reach the handler exactly once. To make sure both loops take some, the
// very first call waits (bounded) until the other loop has taken one: meanwhile only that
// loop can.
TEST_CASE("event loop: two handles of one shared listener in two loops on two threads handle each request once",
          "[event_loop][shared]") {
  const std::string ip = ip1();
  Peer peer = local_peer(ip);
  const int requests = clients_on(ip, 64);  // each an outgoing request with its queue pair
  Problems problems;

  std::mutex mutex;
  std::condition_variable taken;
  std::map<int, int> handled;           // request number -> times handled
  std::array<int, 2> by_loop{0, 0};     // requests each loop's thread handled
  bool first_call = true;
  static thread_local int loop_index = -1;
  auto handler = std::make_shared<ConnReqHandler>([&](rpmapp::expected<ConnReq> req) {
    if (problems.failed(req, "server: request")) return;
    const int me = loop_index;
    if (me < 0) return problems.add("server: handler called outside the serving threads");
    const std::string text = text_of(*req);
    const int number = text.starts_with("request ") ? std::atoi(text.c_str() + 8) : 0;
    {
      std::unique_lock lock(mutex);
      if (std::exchange(first_call, false))
        taken.wait_for(lock, 20s, [&] { return by_loop[1 - me] > 0; });
      ++handled[number];
      ++by_loop[me];
    }
    taken.notify_all();
    const std::string reason = "handled " + std::to_string(number);
    problems.failed(std::move(*req).reject(rpmapp::as_bytes(reason)), "server: ConnReq::reject");
  });

  Endpoint first = MUST(Endpoint::listen_shared(peer, ip, "0", handler));
  const std::string port = port_text(first);
  Endpoint second = MUST(Endpoint::listen_shared(peer, ip, port, handler));
  CHECK(MUST(second.share_count()) == 2);
  CHECK(MUST(first.fd()) == MUST(second.fd()));  // one listener
  std::array<EventLoop, 2> loops{MUST(EventLoop::create()), MUST(EventLoop::create())};
  Registration serve_first = MUST(loops[0].serve(first));  // the listener's own handler
  Registration serve_second = MUST(loops[1].serve(second));

  std::array<rpmapp::expected<void>, 2> ran;
  std::vector<std::thread> threads;
  for (int i = 0; i < 2; ++i)
    threads.emplace_back([&, i] {
      loop_index = i;
      ran[i] = loops[i].run_for(loop_bound);
    });

  // The clients: a third loop, on this thread; each request must come back rejected with
  // the reject data naming it.
  EventLoop client_loop = MUST(EventLoop::create());
  Clients fleet(client_loop, problems);
  int rejected = 0;
  fleet.start(peer, ip, port, requests, [](int number) { return "request " + std::to_string(number); },
              [&](int number, Conn& conn, ConnEvent event) {
                const std::string want = "handled " + std::to_string(number);
                if (event != ConnEvent::rejected)
                  problems.add("request " + std::to_string(number) + ": " + std::string(rpmapp::to_string(event)));
                else if (text_of(conn) != want)
                  problems.add("request " + std::to_string(number) + ": reject data \"" + text_of(conn) + "\"");
                fleet.close(number);
                if (++rejected == requests) client_loop.stop();
              });
  auto client_ran = client_loop.run_for(loop_bound);
  for (auto& loop : loops) loop.stop();
  for (auto& t : threads) t.join();

  INFO(problems.text());
  CHECK(problems.text().empty());
  if (!client_ran) FAIL_CHECK("client loop: " << client_ran.error().message());
  for (int i = 0; i < 2; ++i)
    if (!ran[i]) FAIL_CHECK("loop " << i << ": " << ran[i].error().message());
  CHECK(rejected == requests);
  CHECK(handled.size() == std::size_t(requests));
  for (int number = 1; number <= requests; ++number) {
    INFO("request " << number);
    CHECK(handled[number] == 1);
  }
  INFO("loop 0 took " << by_loop[0] << ", loop 1 took " << by_loop[1]);
  CHECK(by_loop[0] + by_loop[1] == requests);
  CHECK(by_loop[0] > 0);
  CHECK(by_loop[1] > 0);
}

// ib_cm_insert_listen: "Sharing an ib_cm_id with different handlers is not supported".
TEST_CASE("event loop: a shared listener refuses a different handler", "[event_loop][shared]") {
  const std::string ip = ip1();
  Peer peer = local_peer(ip);
  auto mine = std::make_shared<ConnReqHandler>([](rpmapp::expected<ConnReq>) {});
  auto other = std::make_shared<ConnReqHandler>([](rpmapp::expected<ConnReq>) {});

  Endpoint endpoint = MUST(Endpoint::listen_shared(peer, ip, "0", mine));
  const std::string port = port_text(endpoint);
  CHECK(MUST(endpoint.handler()) == mine);

  rpmapp::Error e = MUST_FAIL(Endpoint::listen_shared(peer, ip, port, other));
  CHECK(e.code() == errc::inval);
  CHECK(e.call() == "Endpoint::listen_shared");
  CHECK_THAT(std::string(e.reason()), Catch::Contains("different handlers is not supported"));
  // Without a handler is another handler too.
  e = MUST_FAIL(Endpoint::listen_shared(peer, ip, port));
  CHECK(e.code() == errc::inval);
  CHECK_THAT(std::string(e.reason()), Catch::Contains("different handlers is not supported"));
  // An empty handler is no handler at all.
  e = MUST_FAIL(Endpoint::listen_shared(peer, ip, port, std::make_shared<ConnReqHandler>()));
  CHECK(e.code() == errc::inval);
  CHECK_THAT(std::string(e.reason()), Catch::Contains("the handler is empty"));
  CHECK(MUST(endpoint.share_count()) == 1);  // none of them got a handle

  // The same handler shares; a loop may not replace the listener's handler.
  Endpoint again = MUST(Endpoint::listen_shared(peer, ip, port, mine));
  CHECK(MUST(again.share_count()) == 2);
  EventLoop loop = MUST(EventLoop::create());
  e = MUST_FAIL(loop.serve(again, *other));
  CHECK(e.code() == errc::inval);
  CHECK(e.call() == "EventLoop::serve");
  CHECK_THAT(std::string(e.reason()), Catch::Contains("has its own handler"));

  // A plain listener has no handler of its own: serve needs one.
  Endpoint plain = MUST(Endpoint::listen(peer, ip, "0"));
  CHECK(MUST(plain.handler()) == nullptr);
  e = MUST_FAIL(loop.serve(plain));
  CHECK(e.code() == errc::inval);
  CHECK_THAT(std::string(e.reason()), Catch::Contains("no handler"));
}

// Re-entrancy on the real stack: the server connection's event handler destroys that
// connection on established. The handler is not called again, its registration is
// inactive, the loop goes on, and the client sees the connection closed (destroying an
// established cm_id disconnects it).
TEST_CASE("event loop: a Conn destroyed by its own handler", "[event_loop][reentrancy]") {
  const std::string ip = ip1();
  Peer peer = local_peer(ip);
  Problems problems;
  EventLoop loop = MUST(EventLoop::create());
  Endpoint endpoint = MUST(Endpoint::listen(peer, ip, "0"));
  const std::string port = port_text(endpoint);

  std::optional<Conn> server;
  Registration server_events;
  int server_calls = 0;
  bool destroyed_in_handler = false;
  Registration serving = MUST(loop.serve(endpoint, [&](rpmapp::expected<ConnReq> req) {
    if (problems.failed(req, "server: request")) return loop.stop();
    auto conn = std::move(*req).connect();
    if (problems.failed(conn, "server: ConnReq::connect")) return loop.stop();
    server = std::move(*conn);
    auto events = loop.watch(*server, [&](rpmapp::expected<ConnEvent> event) {
      ++server_calls;
      if (problems.failed(event, "server: event")) return loop.stop();
      if (*event != ConnEvent::established) {
        problems.add("server: " + std::string(rpmapp::to_string(*event)));
        return loop.stop();
      }
      server.reset();  // the Conn this handler watches
      destroyed_in_handler = !server_events.active();
    });
    if (problems.failed(events, "server: EventLoop::watch")) return loop.stop();
    server_events = std::move(*events);
  }));

  Clients fleet(loop, problems);
  std::vector<ConnEvent> client_events;
  fleet.start(peer, ip, port, 1, [](int) { return std::string(); }, [&](int number, Conn&, ConnEvent event) {
    client_events.push_back(event);
    if (event == ConnEvent::closed) {
      fleet.close(number);
      loop.stop();
    }
  });
  auto ran = loop.run_for(loop_bound);

  INFO(problems.text());
  CHECK(problems.text().empty());
  if (!ran) FAIL_CHECK("loop: " << ran.error().message());
  CHECK(server_calls == 1);
  CHECK_FALSE(server.has_value());
  CHECK(destroyed_in_handler);
  CHECK_FALSE(server_events.active());
  CHECK(serving.active());  // the endpoint's registration is untouched
  CHECK(client_events == std::vector<ConnEvent>{ConnEvent::established, ConnEvent::closed});
  CHECK(fleet.open() == 0);
}

// A SharedCq watched by the loop on the real stack: eight connections' receives and sends
// complete into one queue, and each batch's tags name the connection each came through.
TEST_CASE("event loop: eight connections on one SharedCq, every completion tagged with its connection",
          "[event_loop][completions][shared-cq]") {
  const std::string ip = ip1();
  Peer server_peer = local_peer(ip);
  Peer client_peer = local_peer(ip);
  Endpoint endpoint = MUST(Endpoint::listen(server_peer, ip, "0"));
  EventLoop loop = MUST(EventLoop::create());
  rpmapp::SharedCq shared = MUST(rpmapp::SharedCq::create(server_peer, {.size = 64}));
  const rpmapp::ConnConfig server_cfg{.shared_cq = &shared};

  constexpr std::size_t n = 8;
  std::array<std::byte, n> inbox{}, client_bytes{};
  for (std::size_t i = 0; i < n; ++i) client_bytes[i] = static_cast<std::byte>(0x40 + i);
  auto inbox_mr = MUST(rpmapp::MrLocal::reg(server_peer, inbox.data(), n, rpmapp::MrUsage::recv | rpmapp::MrUsage::send));
  auto client_mr = MUST(rpmapp::MrLocal::reg(client_peer, client_bytes.data(), n, rpmapp::MrUsage::send | rpmapp::MrUsage::recv));
  // receives posted before accepting: tagged from the start
  AcceptedClients accepted = accept_clients(n, client_peer, ip, endpoint, server_cfg,
                                            [&](std::size_t i, ConnReq& req) { MUST(req.recv(inbox_mr, i, 1, i)); });
  std::vector<Conn>& clients = accepted.clients;
  std::vector<Conn>& servers = accepted.servers;
  const std::map<rpmapp::ConnId, std::size_t>& index_of = accepted.index_of;

  Problems problems;
  std::set<std::size_t> received, answered;
  Registration watching = MUST(loop.watch_completions(
      shared, [&](rpmapp::expected<std::span<const ibv_wc>> batch, std::span<const rpmapp::ConnId> conns) {
        if (problems.failed(batch, "shared CQ")) return loop.stop();
        for (std::size_t k = 0; k < batch->size(); ++k) {
          const ibv_wc& wc = (*batch)[k];
          if (problems.failed(rpmapp::check(wc), "a completion")) return loop.stop();
          const auto at = index_of.find(conns[k]);
          if (at == index_of.end()) {
            problems.add("a completion tagged with no connection of this server");
            return loop.stop();
          }
          const std::size_t i = at->second;
          if (wc.opcode == IBV_WC_RECV) {
            if (wc.wr_id != i || inbox[i] != client_bytes[i]) problems.add("a receive landed elsewhere");
            received.insert(i);
            problems.failed(servers[i].send(inbox_mr, i, 1, rpmapp::Completion::always, 0x100 + i), "Conn::send");
          } else if (wc.opcode == IBV_WC_SEND) {
            if (wc.wr_id != 0x100 + i) problems.add("a send completion tagged with another connection");
            answered.insert(i);
          }
        }
        if (answered.size() == n) loop.stop();
      }));
  MUST(std::move(shared).close());  // the registration holds the queue
  for (std::size_t i = 0; i < n; ++i) {
    MUST(clients[i].recv(client_mr, i, 1, 0x200 + i));
    MUST(clients[i].send(client_mr, i, 1, rpmapp::Completion::always, i));
  }
  auto ran = loop.run_for(loop_bound);
  INFO(problems.text());
  CHECK(problems.text().empty());
  if (!ran) FAIL_CHECK("loop: " << ran.error().message());
  CHECK(received.size() == n);
  CHECK(answered.size() == n);
  for (std::size_t i = 0; i < n; ++i) disconnect_both(clients[i], servers[i]);
}

// watch_completions on the real stack: the server's receive and the client's send arrive
// at their handlers as real completions, the received bytes checked by content.
TEST_CASE("event loop: completion handlers deliver a real send and receive", "[event_loop][completions]") {
  const std::string ip = ip1();
  Peer peer = local_peer(ip);
  Problems problems;
  EventLoop loop = MUST(EventLoop::create());
  Endpoint endpoint = MUST(Endpoint::listen(peer, ip, "0"));
  const std::string port = port_text(endpoint);

  constexpr std::uint64_t recv_context = 0x5e57, send_context = 0xc11e;
  const std::string message = "a message through the event loop";
  std::array<char, 64> inbox;
  inbox.fill('#');  // sentinel: only the message's bytes may change
  std::array<char, 64> outbox{};
  std::memcpy(outbox.data(), message.data(), message.size());
  auto inbox_mr = MUST(rpmapp::MrLocal::reg(peer, inbox.data(), inbox.size(), rpmapp::MrUsage::recv));
  auto outbox_mr = MUST(rpmapp::MrLocal::reg(peer, outbox.data(), outbox.size(), rpmapp::MrUsage::send));

  std::optional<Conn> server, client;
  Registration server_completions, client_events, client_completions;
  std::vector<ibv_wc> received, sent;
  int empty_batches = 0;
  auto done = [&] {
    if (!received.empty() && !sent.empty()) loop.stop();
  };
  auto record = [&](std::vector<ibv_wc>& into, const char* who) {
    return [&, who](rpmapp::expected<std::span<const ibv_wc>> batch) {
      if (problems.failed(batch, std::string(who) + ": completions")) return loop.stop();
      if (batch->empty()) ++empty_batches;
      into.insert(into.end(), batch->begin(), batch->end());
      done();
    };
  };

  Registration serving = MUST(loop.serve(endpoint, [&](rpmapp::expected<ConnReq> req) {
    if (problems.failed(req, "server: request")) return loop.stop();
    // Posted before accepting: the client sends as soon as it is established.
    if (problems.failed(req->recv(inbox_mr, 0, inbox.size(), recv_context), "server: ConnReq::recv")) return loop.stop();
    auto conn = std::move(*req).connect();
    if (problems.failed(conn, "server: ConnReq::connect")) return loop.stop();
    server = std::move(*conn);
    auto reg = loop.watch_completions(*server, record(received, "server"));
    if (problems.failed(reg, "server: EventLoop::watch_completions")) return loop.stop();
    server_completions = std::move(*reg);
  }));

  auto pending = MUST(ConnReq::start(peer, ip, port));
  Registration resolving = MUST(loop.resolve(std::move(pending), [&](rpmapp::expected<ConnReq> req) {
    if (problems.failed(req, "client: resolution")) return loop.stop();
    auto conn = std::move(*req).connect();
    if (problems.failed(conn, "client: ConnReq::connect")) return loop.stop();
    client = std::move(*conn);
    auto completions = loop.watch_completions(*client, record(sent, "client"));
    if (problems.failed(completions, "client: EventLoop::watch_completions")) return loop.stop();
    client_completions = std::move(*completions);
    auto events = loop.watch(*client, [&](rpmapp::expected<ConnEvent> event) {
      if (problems.failed(event, "client: event")) return loop.stop();
      if (*event != ConnEvent::established) {
        problems.add("client: " + std::string(rpmapp::to_string(*event)));
        return loop.stop();
      }
      problems.failed(client->send(outbox_mr, 0, message.size(), rpmapp::Completion::always, send_context),
                      "client: Conn::send");
    });
    if (problems.failed(events, "client: EventLoop::watch")) return loop.stop();
    client_events = std::move(*events);
  }));
  auto ran = loop.run_for(loop_bound);

  INFO(problems.text());
  CHECK(problems.text().empty());
  if (!ran) FAIL_CHECK("loop: " << ran.error().message());
  CHECK_FALSE(resolving.active());  // a resolve registration ends with its call
  CHECK(empty_batches == 0);
  REQUIRE(received.size() == 1);
  CHECK(received[0].status == IBV_WC_SUCCESS);
  CHECK(received[0].opcode == IBV_WC_RECV);
  CHECK(received[0].wr_id == recv_context);
  CHECK(received[0].byte_len == message.size());
  CHECK(std::string(inbox.data(), message.size()) == message);
  CHECK(std::all_of(inbox.begin() + message.size(), inbox.end(), [](char c) { return c == '#'; }));
  REQUIRE(sent.size() == 1);
  CHECK(sent[0].status == IBV_WC_SUCCESS);
  CHECK(sent[0].opcode == IBV_WC_SEND);
  CHECK(sent[0].wr_id == send_context);

  // Teardown with bounded waits of their own, off the loop.
  server_completions.reset();
  client_completions.reset();
  client_events.reset();
  REQUIRE(server.has_value());
  REQUIRE(client.has_value());
  CHECK(wait_event(*server, "server") == ConnEvent::established);
  disconnect_both(*client, *server);
}
