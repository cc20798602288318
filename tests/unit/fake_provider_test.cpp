// The fake provider itself: accounting, fault injection and events behave as documented,
// so that the other tests can trust it.
#include "test_util.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <limits>
#include <map>
#include <set>
#include <thread>

namespace fake_provider_test {

using namespace test;
using rpmapp::detail::provider;

// An epoll_event's data.u64 by value: epoll_event is packed on x86_64, so a reference to
// the member (what Catch's CHECK binds) is misaligned (clang's UBSan reports it).
static std::uint64_t tag_of(const epoll_event& e) { return e.data.u64; }

TEST_CASE("fake: create/destroy pairs are counted and misuse is recorded", "[fake]") {
  fake::FakeProvider fake;
  auto* ch = provider().create_event_channel();
  REQUIRE(ch != nullptr);
  CHECK(fake.alive("event_channel") == 1);
  CHECK(fake.problems() == "event_channel: 1 alive\n");
  provider().destroy_event_channel(ch);
  CHECK(fake.problems() == "");
  auto* pd = provider().alloc_pd(fake.context(1));
  REQUIRE(pd != nullptr);
  CHECK(provider().dealloc_pd(pd) == 0);
  CHECK(provider().dealloc_pd(pd) == EINVAL);  // twice
  REQUIRE(fake.failures().size() == 1);
  CHECK(fake.failures()[0] == "ibv_dealloc_pd: pd not alive");
  CHECK(fake.calls() == std::vector<std::string>{"rdma_create_event_channel",
                                                 "rdma_destroy_event_channel", "ibv_alloc_pd",
                                                 "ibv_dealloc_pd", "ibv_dealloc_pd"});
}

TEST_CASE("fake: injected failures follow each call's convention", "[fake]") {
  fake::FakeProvider fake;
  fake.fail("rdma_create_event_channel", EMFILE);
  errno = 0;
  CHECK(provider().create_event_channel() == nullptr);
  CHECK(errno == EMFILE);

  fake.fail("rdma_create_id", EPERM, 2);  // the second call
  rdma_cm_id* a = nullptr;
  rdma_cm_id* b = nullptr;
  CHECK(provider().create_id(nullptr, &a, nullptr, RDMA_PS_TCP) == 0);
  errno = 0;
  CHECK(provider().create_id(nullptr, &b, nullptr, RDMA_PS_TCP) == -1);
  CHECK(errno == EPERM);
  CHECK(b == nullptr);

  auto* pd = provider().alloc_pd(fake.context(0));
  fake.fail("ibv_dealloc_pd", EBUSY);
  CHECK(provider().dealloc_pd(pd) == EBUSY);  // the errno as the return value
  CHECK(fake.alive("pd") == 0);               // released anyway (see fake_provider.hpp)
  CHECK(provider().destroy_id(a) == 0);
  CHECK(fake.pending_faults() == 0);
  fake.expect_clean();
}

TEST_CASE("fake: binding sets the device for a specific address, none for a wildcard",
          "[fake]") {
  fake::FakeProvider fake;
  rpmapp::detail::SocketAddress specific, wildcard;
  REQUIRE(rpmapp::detail::check_numeric_address("test", "169.254.78.1", &specific));
  REQUIRE(rpmapp::detail::check_numeric_address("test", "0.0.0.0", &wildcard));
  rdma_cm_id* one = nullptr;
  rdma_cm_id* all = nullptr;
  REQUIRE(provider().create_id(nullptr, &one, nullptr, RDMA_PS_TCP) == 0);
  REQUIRE(provider().create_id(nullptr, &all, nullptr, RDMA_PS_TCP) == 0);
  REQUIRE(provider().bind_addr(one, specific.get()) == 0);
  REQUIRE(provider().bind_addr(all, wildcard.get()) == 0);
  CHECK(one->verbs == fake.context(1));
  CHECK(std::string(one->verbs->device->name) == "fake1");
  CHECK(all->verbs == nullptr);
  CHECK(rpmapp::detail::port_of(rdma_get_local_addr(one)) != 0);  // port 0 assigned
  CHECK(rpmapp::detail::port_of(rdma_get_local_addr(one)) !=
        rpmapp::detail::port_of(rdma_get_local_addr(all)));
  CHECK(provider().destroy_id(one) == 0);
  CHECK(provider().destroy_id(all) == 0);
  fake.expect_clean();
}

TEST_CASE("fake: poll reports a channel readable when it has events", "[fake]") {
  fake::FakeProvider fake;
  Peer peer = open_peer(fake);
  Endpoint ep = listen_on(peer, "");
  pollfd pfd{*ep.fd(), POLLIN, 0};
  CHECK(provider().poll(&pfd, 1, 0) == 0);
  fake.inject_connect_request(*ep.fd(), {});
  CHECK(fake.alive("cm_id") == 1);  // the request's id exists once it is taken
  CHECK(provider().poll(&pfd, 1, 0) == 1);
  CHECK(pfd.revents == POLLIN);
}

TEST_CASE("fake: channels start blocking; fcntl sets O_NONBLOCK; a non-blocking empty read "
          "is EAGAIN",
          "[fake]") {
  fake::FakeProvider fake;
  auto* ch = provider().create_event_channel();
  REQUIRE(ch != nullptr);
  CHECK_FALSE(fake.nonblocking(ch->fd));
  const int flags = provider().fcntl(ch->fd, F_GETFL, 0);
  CHECK((flags & O_NONBLOCK) == 0);
  CHECK(provider().fcntl(ch->fd, F_SETFL, flags | O_NONBLOCK) == 0);
  CHECK(fake.nonblocking(ch->fd));
  CHECK((provider().fcntl(ch->fd, F_GETFL, 0) & O_NONBLOCK) != 0);
  rdma_cm_event* ev = nullptr;
  errno = 0;
  CHECK(provider().get_cm_event(ch, &ev) == -1);
  CHECK(errno == EAGAIN);
  fake.inject_internal_event(ch->fd);  // consumed inside the call, which reads again
  errno = 0;
  CHECK(provider().get_cm_event(ch, &ev) == -1);
  CHECK(errno == EAGAIN);
  CHECK(fake.queued(ch->fd) == 0);
  fake.fail("fcntl", EBADF);
  errno = 0;
  CHECK(provider().fcntl(ch->fd, F_GETFL, 0) == -1);
  CHECK(errno == EBADF);
  provider().destroy_event_channel(ch);
  fake.expect_clean();
}

TEST_CASE("fake: a successful call leaves the sentinel errno", "[fake]") {
  fake::FakeProvider fake;
  errno = 0;
  auto* ch = provider().create_event_channel();
  CHECK(errno == fake::sentinel_errno);
  errno = 0;
  pollfd pfd{ch->fd, POLLIN, 0};
  CHECK(provider().poll(&pfd, 1, 0) == 0);
  CHECK(errno == fake::sentinel_errno);
  errno = 0;
  provider().destroy_event_channel(ch);
  CHECK(errno == fake::sentinel_errno);
  fake.expect_clean();
}

TEST_CASE("fake: waits are real, and a wait nothing can end is a recorded hang", "[fake]") {
  using namespace std::chrono_literals;
  using clock = std::chrono::steady_clock;
  fake::FakeProvider fake;
  fake.watchdog = 100ms;
  auto* ch = provider().create_event_channel();
  rdma_cm_id* id = nullptr;
  REQUIRE(provider().create_id(ch, &id, nullptr, RDMA_PS_TCP) == 0);
  const int fd = ch->fd;
  pollfd pfd{fd, POLLIN, 0};
  auto start = clock::now();
  CHECK(provider().poll(&pfd, 1, 50) == 0);  // honours its timeout
  CHECK(clock::now() - start >= 50ms);

  // An event queued by another thread ends a poll and a blocking read.
  for (bool read : {false, true}) {
    std::thread injector([&] {
      std::this_thread::sleep_for(20ms);
      fake.inject_event(fd, RDMA_CM_EVENT_ESTABLISHED);
    });
    start = clock::now();
    rdma_cm_event* ev = nullptr;
    if (read) {
      fake.inject_internal_event(fd);  // consumed, then the read blocks until the event
      CHECK(provider().get_cm_event(ch, &ev) == 0);
      CHECK(provider().ack_cm_event(ev) == 0);
    } else {
      CHECK(provider().poll(&pfd, 1, 5000) == 1);
    }
    CHECK(clock::now() - start < 2s);
    injector.join();
    if (!read) {
      REQUIRE(provider().get_cm_event(ch, &ev) == 0);
      CHECK(provider().ack_cm_event(ev) == 0);
    }
  }
  CHECK(fake.failures().empty());

  // take_after_poll: readable, then the event is gone.
  fake.inject_event(fd, RDMA_CM_EVENT_ESTABLISHED);
  fake.take_after_poll(fd);
  CHECK(provider().poll(&pfd, 1, 0) == 1);
  CHECK(fake.queued(fd) == 0);
  CHECK(fake.taken_after_poll() == 1);

  // poll forever on an empty channel, and a blocking read of it: recorded hangs.
  errno = 0;
  CHECK(provider().poll(&pfd, 1, -1) == -1);
  CHECK(errno == ETIME);
  rdma_cm_event* ev = nullptr;
  errno = 0;
  CHECK(provider().get_cm_event(ch, &ev) == -1);
  CHECK(errno == ETIME);
  auto failures = fake.failures();
  REQUIRE(failures.size() == 2);
  CHECK_THAT(failures[0], Catch::Contains("poll waited forever"));
  CHECK_THAT(failures[1], Catch::Contains("rdma_get_cm_event blocked on an empty blocking channel"));
  CHECK(provider().destroy_id(id) == 0);
  provider().destroy_event_channel(ch);
}

TEST_CASE("fake: the data path's misuse is recorded as the kernel would refuse it", "[fake][data]") {
  fake::FakeProvider fake;
  fake.watchdog = std::chrono::milliseconds(50);
  auto* pd = provider().alloc_pd(fake.context(0));
  REQUIRE(pd != nullptr);
  std::byte buf[64];
  // remote write without local write: EINVAL, as ib_check_mr_access
  errno = 0;
  CHECK(provider().reg_mr(pd, buf, sizeof buf, IBV_ACCESS_REMOTE_WRITE) == nullptr);
  CHECK(errno == EINVAL);
  // ODP on a device without it: EOPNOTSUPP
  CHECK(provider().reg_mr(pd, buf, sizeof buf, IBV_ACCESS_ON_DEMAND) == nullptr);
  CHECK(errno == EOPNOTSUPP);
  ibv_mr* mr = provider().reg_mr(pd, buf, sizeof buf, IBV_ACCESS_LOCAL_WRITE);
  REQUIRE(mr != nullptr);
  CHECK(fake.alive("mr") == 1);
  CHECK(provider().dealloc_pd(pd) == EBUSY);  // a region is still registered
  CHECK(provider().dereg_mr(mr) == 0);
  CHECK(provider().dereg_mr(mr) == EINVAL);  // twice
  auto* ch = provider().create_comp_channel(fake.context(0));
  auto* cq = provider().create_cq(fake.context(0), 2, nullptr, ch, 0);
  REQUIRE(cq != nullptr);
  ibv_cq* got = nullptr;
  void* ctx = nullptr;
  // blocking and empty: the watchdog ends it and records the hang
  CHECK(provider().get_cq_event(ch, &got, &ctx) == -1);
  CHECK(errno == ETIME);
  CHECK(provider().fcntl(ch->fd, F_SETFL, O_NONBLOCK) == 0);
  CHECK(provider().get_cq_event(ch, &got, &ctx) == -1);
  CHECK(errno == EAGAIN);
  // an armed CQ gets one event for its next completion
  CHECK(provider().req_notify_cq(cq, 0) == 0);
  ibv_wc wc{};
  fake.add_completion(cq, wc);
  fake.add_completion(cq, wc);
  CHECK(fake.cq_events_queued(ch) == 1);
  pollfd pfd{ch->fd, POLLIN, 0};
  CHECK(provider().poll(&pfd, 1, 0) == 1);
  REQUIRE(provider().get_cq_event(ch, &got, &ctx) == 0);
  CHECK(got == cq);
  ibv_wc out[4];
  CHECK(provider().poll_cq(cq, 4, out) == 2);
  CHECK(provider().destroy_cq(cq) == 0);  // with an event not acknowledged: recorded
  CHECK(provider().destroy_comp_channel(ch) == 0);
  CHECK(provider().dealloc_pd(pd) == 0);
  const auto failures = fake.failures();
  REQUIRE(failures.size() == 4);
  CHECK(failures[0] == "ibv_dealloc_pd: a memory region is still registered on the pd");
  CHECK(failures[1] == "ibv_dereg_mr: mr not alive");
  CHECK_THAT(failures[2], Catch::Contains("ibv_get_cq_event blocked"));
  CHECK_THAT(failures[3], Catch::Contains("not acknowledged"));
  CHECK(fake.alive("unacked_cq_event") == 0);
}

// ---- epoll and eventfd

namespace {

using namespace std::chrono_literals;
using steady = std::chrono::steady_clock;

// The fake's watchdog in these tests: long enough that a loaded machine does not reach it
// before another thread's 20-30 ms write; bounds below are half of it.
constexpr auto epoll_watchdog = 1000ms;

epoll_event watch_for(std::uint32_t events, std::uint64_t tag) {
  epoll_event ev{};
  ev.events = events;
  ev.data.u64 = tag;
  return ev;
}

int ctl(int epfd, int op, int fd, std::uint32_t events = EPOLLIN, std::uint64_t tag = 0) {
  epoll_event ev = watch_for(events, tag);
  return provider().epoll_ctl(epfd, op, fd, &ev);
}

// -1 with errno `err`, and the errno sentinel not left behind.
template <class F>
void check_fails_with(int err, F&& call) {
  errno = 0;
  CHECK(call() == -1);
  CHECK(errno == err);
}

// For other threads, which must not use Catch's assertions: whether the write went through.
bool post_to_counter(int fd, std::uint64_t v) {
  return provider().write(fd, &v, sizeof v) == sizeof v;
}

std::uint64_t read_counter(int fd) {
  std::uint64_t v = 0;
  REQUIRE(provider().read(fd, &v, sizeof v) == sizeof v);
  return v;
}

void add_to_counter(int fd, std::uint64_t v) {
  REQUIRE(provider().write(fd, &v, sizeof v) == sizeof v);
}

// A real pipe, closed by the system (not through the provider) at the end.
struct Pipe {
  int fds[2] = {-1, -1};
  Pipe() { REQUIRE(::pipe2(fds, O_CLOEXEC | O_NONBLOCK) == 0); }
  ~Pipe() {
    for (int fd : fds)
      if (fd >= 0) ::close(fd);
  }
  int in() const { return fds[0]; }
  int out() const { return fds[1]; }
};

}  // namespace

TEST_CASE("fake epoll: epoll_create1 and eventfd give fake fds; close releases them; a leak "
          "is reported",
          "[fake][epoll]") {
  fake::FakeProvider fake;
  check_fails_with(EINVAL, [] { return provider().epoll_create1(EPOLL_CLOEXEC | 1); });
  check_fails_with(EINVAL, [] { return provider().eventfd(0, EFD_CLOEXEC | 0x10); });
  errno = 0;
  const int ep = provider().epoll_create1(EPOLL_CLOEXEC);
  CHECK(ep >= 1000);
  CHECK(errno == fake::sentinel_errno);
  const int efd = provider().eventfd(3, EFD_CLOEXEC | EFD_NONBLOCK);
  CHECK(efd >= 1000);
  CHECK(efd != ep);
  CHECK(fake.eventfd_value(efd) == 3);
  CHECK(fake.alive("epoll") == 1);
  CHECK(fake.alive("eventfd") == 1);
  CHECK(fake.problems() == "epoll: 1 alive\neventfd: 1 alive\n");
  errno = 0;
  CHECK(provider().close(ep) == 0);
  CHECK(errno == fake::sentinel_errno);
  CHECK(fake.problems() == "eventfd: 1 alive\n");
  // An injected failure of close still releases the fd, as Linux does.
  fake.fail("close", kErr);
  check_fails_with(kErr, [&] { return provider().close(efd); });
  CHECK(fake.alive("eventfd") == 0);
  CHECK(fake.calls() == std::vector<std::string>{"epoll_create1", "eventfd", "epoll_create1",
                                                 "eventfd", "close", "close"});
  fake.expect_clean();
}

TEST_CASE("fake epoll: epoll_ctl's errors, in the kernel's order", "[fake][epoll]") {
  fake::FakeProvider fake;
  const int ep = provider().epoll_create1(0);
  const int efd = provider().eventfd(0, EFD_NONBLOCK);
  auto* ch = provider().create_event_channel();
  REQUIRE(ch != nullptr);
  Pipe pipe;
  const int closed_fd = [] {
    Pipe gone;
    return gone.in();  // closed at once (nothing else opens fds in this test)
  }();

  SECTION("ADD twice is EEXIST; MOD and DEL of an fd not added are ENOENT") {
    check_fails_with(ENOENT, [&] { return ctl(ep, EPOLL_CTL_MOD, efd); });
    check_fails_with(ENOENT, [&] { return ctl(ep, EPOLL_CTL_DEL, efd); });
    CHECK(ctl(ep, EPOLL_CTL_ADD, efd) == 0);
    check_fails_with(EEXIST, [&] { return ctl(ep, EPOLL_CTL_ADD, efd); });
    CHECK(ctl(ep, EPOLL_CTL_MOD, efd, EPOLLIN | EPOLLOUT) == 0);
    CHECK(fake.watched(ep) == std::map<int, std::uint32_t>{
                                  {efd, EPOLLIN | EPOLLOUT | EPOLLERR | EPOLLHUP}});
    // DEL ignores the event (it may be null).
    CHECK(provider().epoll_ctl(ep, EPOLL_CTL_DEL, efd, nullptr) == 0);
    check_fails_with(ENOENT, [&] { return ctl(ep, EPOLL_CTL_DEL, efd); });
    CHECK(fake.watched(ep).empty());
    CHECK(fake.failures().empty());
  }
  SECTION("an fd neither alive in the fake nor open is EBADF") {
    check_fails_with(EBADF, [&] { return ctl(ep, EPOLL_CTL_ADD, closed_fd); });
    check_fails_with(EBADF, [&] { return ctl(ep, EPOLL_CTL_ADD, 1000 + 500); });
    CHECK(fake.failures().empty());  // the caller's fd: an error to report, not misuse
    check_fails_with(EBADF, [&] { return ctl(closed_fd, EPOLL_CTL_ADD, efd); });
    REQUIRE(fake.failures().size() == 1);
    CHECK(fake.failures()[0] == "epoll_ctl: epfd is not an open fd");
  }
  SECTION("a real file that cannot be polled is EPERM") {
    char path[] = "/tmp/rpmapp-fake-epoll-XXXXXX";
    const int file = ::mkstemp(path);
    REQUIRE(file >= 0);
    ::unlink(path);
    check_fails_with(EPERM, [&] { return ctl(ep, EPOLL_CTL_ADD, file); });
    ::close(file);
  }
  SECTION("epfd == fd, an epfd that is not an epoll fd, an unknown op are EINVAL") {
    check_fails_with(EINVAL, [&] { return ctl(ep, EPOLL_CTL_ADD, ep); });
    check_fails_with(EINVAL, [&] { return ctl(ep, 99, efd); });
    CHECK(fake.failures().empty());
    check_fails_with(EINVAL, [&] { return ctl(efd, EPOLL_CTL_ADD, ch->fd); });
    check_fails_with(EINVAL, [&] { return ctl(pipe.in(), EPOLL_CTL_ADD, efd); });
    const auto failures = fake.failures();
    REQUIRE(failures.size() == 2);
    CHECK(failures[0] == "epoll_ctl: epfd is not an epoll fd of the fake");
    CHECK(failures[1] == failures[0]);
  }
  SECTION("no event for ADD or MOD is EFAULT, before anything else") {
    check_fails_with(EFAULT, [&] { return provider().epoll_ctl(ep, EPOLL_CTL_ADD, efd, nullptr); });
    check_fails_with(EFAULT, [&] { return provider().epoll_ctl(-1, EPOLL_CTL_MOD, -1, nullptr); });
    CHECK(fake.failures().empty());
  }
  SECTION("flags the fake does not model are recorded") {
    check_fails_with(EINVAL, [&] { return ctl(ep, EPOLL_CTL_ADD, efd, EPOLLIN | EPOLLEXCLUSIVE); });
    check_fails_with(EINVAL, [&] { return ctl(ep, EPOLL_CTL_ADD, efd, EPOLLIN | EPOLLWAKEUP); });
    CHECK(ctl(ep, EPOLL_CTL_ADD, pipe.in(), EPOLLIN | EPOLLET) == 0);
    CHECK(ctl(ep, EPOLL_CTL_DEL, pipe.in()) == 0);
    const int inner = provider().epoll_create1(0);
    check_fails_with(EINVAL, [&] { return ctl(ep, EPOLL_CTL_ADD, inner); });
    CHECK(provider().close(inner) == 0);
    const auto failures = fake.failures();
    REQUIRE(failures.size() == 4);
    CHECK_THAT(failures[0], Catch::Contains("EPOLLEXCLUSIVE / EPOLLWAKEUP are not modelled"));
    CHECK_THAT(failures[1], Catch::Contains("EPOLLEXCLUSIVE / EPOLLWAKEUP are not modelled"));
    CHECK_THAT(failures[2], Catch::Contains("EPOLLET on a real fd is not modelled"));
    CHECK_THAT(failures[3], Catch::Contains("an epoll fd inside an epoll set is not modelled"));
  }
  SECTION("every new call can be made to fail with any errno") {
    for (const char* call : {"epoll_create1", "epoll_ctl", "epoll_wait", "eventfd", "read",
                             "write", "close"})
      fake.fail(call, kErr);
    epoll_event out[1];
    std::uint64_t v = 1;
    check_fails_with(kErr, [] { return provider().epoll_create1(0); });
    check_fails_with(kErr, [&] { return ctl(ep, EPOLL_CTL_ADD, efd); });
    check_fails_with(kErr, [&] { return provider().epoll_wait(ep, out, 1, 0); });
    check_fails_with(kErr, [] { return provider().eventfd(0, 0); });
    check_fails_with(kErr, [&] { return static_cast<int>(provider().read(efd, &v, 8)); });
    check_fails_with(kErr, [&] { return static_cast<int>(provider().write(efd, &v, 8)); });
    const int doomed = provider().eventfd(0, 0);
    check_fails_with(kErr, [&] { return provider().close(doomed); });
    CHECK(fake.pending_faults() == 0);
    CHECK(fake.eventfd_value(efd) == 0);  // the failed write added nothing
    CHECK(fake.watched(ep).empty());      // the failed ADD added nothing
    fake.fail("epoll_wait", EINTR);       // a signal
    check_fails_with(EINTR, [&] { return provider().epoll_wait(ep, out, 1, -1); });
    CHECK(fake.failures().empty());
  }
  provider().destroy_event_channel(ch);
  CHECK(provider().close(efd) == 0);
  CHECK(provider().close(ep) == 0);
  CHECK(fake.problems().find("alive") == std::string::npos);
}

TEST_CASE("fake epoll: epoll_wait's own errors", "[fake][epoll]") {
  fake::FakeProvider fake;
  const int ep = provider().epoll_create1(0);
  const int efd = provider().eventfd(1, 0);
  epoll_event out[2];
  check_fails_with(EINVAL, [&] { return provider().epoll_wait(ep, out, 0, 0); });
  check_fails_with(EINVAL, [&] { return provider().epoll_wait(ep, out, -1, 0); });
  check_fails_with(EFAULT, [&] { return provider().epoll_wait(ep, nullptr, 2, 0); });
  CHECK(fake.failures().empty());
  check_fails_with(EINVAL, [&] { return provider().epoll_wait(efd, out, 2, 0); });
  check_fails_with(EBADF, [&] { return provider().epoll_wait(1000 + 500, out, 2, 0); });
  const auto failures = fake.failures();
  REQUIRE(failures.size() == 2);
  CHECK(failures[0] == "epoll_wait: epfd is not an epoll fd of the fake");
  CHECK(failures[1] == "epoll_wait: epfd is not an open fd");
  CHECK(provider().close(efd) == 0);
  CHECK(provider().close(ep) == 0);
  CHECK(fake.alive("epoll") == 0);
  CHECK(fake.alive("eventfd") == 0);
}

TEST_CASE("fake epoll: level-triggered readiness of event channels, completion channels and "
          "eventfds, with their epoll_data",
          "[fake][epoll]") {
  fake::FakeProvider fake;
  const int ep = provider().epoll_create1(EPOLL_CLOEXEC);
  const int efd = provider().eventfd(0, EFD_NONBLOCK);
  auto* ch = provider().create_event_channel();
  rdma_cm_id* id = nullptr;
  REQUIRE(provider().create_id(ch, &id, nullptr, RDMA_PS_TCP) == 0);
  auto* comp = provider().create_comp_channel(fake.context(0));
  auto* cq = provider().create_cq(fake.context(0), 4, nullptr, comp, 0);
  REQUIRE(cq != nullptr);
  REQUIRE(ctl(ep, EPOLL_CTL_ADD, ch->fd, EPOLLIN, 1) == 0);
  REQUIRE(ctl(ep, EPOLL_CTL_ADD, comp->fd, EPOLLIN, 2) == 0);
  REQUIRE(ctl(ep, EPOLL_CTL_ADD, efd, EPOLLIN, 3) == 0);
  epoll_event out[4];
  errno = 0;
  CHECK(provider().epoll_wait(ep, out, 4, 0) == 0);  // nothing ready
  CHECK(errno == fake::sentinel_errno);

  // An event channel: readable while its queue is not empty, every time (level).
  fake.inject_event(ch->fd, RDMA_CM_EVENT_ESTABLISHED);
  for (int again = 0; again < 2; ++again) {
    REQUIRE(provider().epoll_wait(ep, out, 4, 0) == 1);
    CHECK(out[0].events == EPOLLIN);
    CHECK(tag_of(out[0]) == 1);
  }
  rdma_cm_event* ev = nullptr;
  REQUIRE(provider().get_cm_event(ch, &ev) == 0);
  CHECK(provider().ack_cm_event(ev) == 0);
  CHECK(provider().epoll_wait(ep, out, 4, 0) == 0);

  // A completion channel: readable while it has events.
  REQUIRE(provider().req_notify_cq(cq, 0) == 0);
  fake.add_completion(cq, ibv_wc{});
  REQUIRE(provider().epoll_wait(ep, out, 4, 0) == 1);
  CHECK(tag_of(out[0]) == 2);
  ibv_cq* got = nullptr;
  void* ctx = nullptr;
  REQUIRE(provider().get_cq_event(comp, &got, &ctx) == 0);
  provider().ack_cq_events(got, 1);
  CHECK(provider().epoll_wait(ep, out, 4, 0) == 0);

  // An eventfd: readable while its counter is not 0; writable below its maximum.
  add_to_counter(efd, 2);
  add_to_counter(efd, 5);
  REQUIRE(provider().epoll_wait(ep, out, 4, 0) == 1);
  CHECK(out[0].events == EPOLLIN);
  CHECK(tag_of(out[0]) == 3);
  CHECK(ctl(ep, EPOLL_CTL_MOD, efd, EPOLLIN | EPOLLOUT, 4) == 0);
  REQUIRE(provider().epoll_wait(ep, out, 4, 0) == 1);
  CHECK(out[0].events == (EPOLLIN | EPOLLOUT));
  CHECK(tag_of(out[0]) == 4);  // MOD replaces the data
  CHECK(read_counter(efd) == 7);
  REQUIRE(provider().epoll_wait(ep, out, 4, 0) == 1);
  CHECK(out[0].events == EPOLLOUT);

  // Everything ready at once: all reported.
  CHECK(ctl(ep, EPOLL_CTL_MOD, efd, EPOLLIN, 3) == 0);
  add_to_counter(efd, 1);
  fake.inject_event(ch->fd, RDMA_CM_EVENT_DISCONNECTED);
  REQUIRE(provider().req_notify_cq(cq, 0) == 0);
  fake.add_completion(cq, ibv_wc{});
  REQUIRE(provider().epoll_wait(ep, out, 4, 0) == 3);
  std::set<std::uint64_t> tags;
  for (int i = 0; i < 3; ++i) tags.insert(tag_of(out[i]));
  CHECK(tags == std::set<std::uint64_t>{1, 2, 3});

  REQUIRE(provider().get_cm_event(ch, &ev) == 0);
  CHECK(provider().ack_cm_event(ev) == 0);
  REQUIRE(provider().get_cq_event(comp, &got, &ctx) == 0);
  provider().ack_cq_events(got, 1);
  ibv_wc wcs[4];
  CHECK(provider().poll_cq(cq, 4, wcs) == 2);
  for (int fd : {ch->fd, comp->fd, efd}) CHECK(ctl(ep, EPOLL_CTL_DEL, fd) == 0);
  CHECK(provider().destroy_cq(cq) == 0);
  CHECK(provider().destroy_comp_channel(comp) == 0);
  CHECK(provider().destroy_id(id) == 0);
  provider().destroy_event_channel(ch);
  CHECK(provider().close(efd) == 0);
  CHECK(provider().close(ep) == 0);
  CHECK(fake.closed_while_watched() == 0);
  fake.expect_clean();
}

TEST_CASE("fake epoll: maxevents bounds the result and ready entries take turns",
          "[fake][epoll]") {
  fake::FakeProvider fake;
  const int ep = provider().epoll_create1(0);
  int efds[3];
  for (int i = 0; i < 3; ++i) {
    efds[i] = provider().eventfd(1, 0);  // all ready from the start
    REQUIRE(ctl(ep, EPOLL_CTL_ADD, efds[i], EPOLLIN, static_cast<std::uint64_t>(i)) == 0);
  }
  epoll_event out[3];
  REQUIRE(provider().epoll_wait(ep, out, 2, 0) == 2);
  CHECK(tag_of(out[0]) == 0);
  CHECK(tag_of(out[1]) == 1);
  // The one left out comes first next time, then the least recently reported.
  REQUIRE(provider().epoll_wait(ep, out, 2, 0) == 2);
  CHECK(tag_of(out[0]) == 2);
  CHECK(tag_of(out[1]) == 0);
  REQUIRE(provider().epoll_wait(ep, out, 1, 0) == 1);
  CHECK(tag_of(out[0]) == 1);
  for (int fd : efds) CHECK(provider().close(fd) == 0);
  CHECK(fake.closed_while_watched() == 3);  // closed while in the set
  CHECK(fake.watched(ep).empty());
  CHECK(provider().close(ep) == 0);
  fake.expect_clean();
}

TEST_CASE("fake epoll: EPOLLONESHOT reports once until MOD; EPOLLET once per wakeup",
          "[fake][epoll]") {
  fake::FakeProvider fake;
  const int ep = provider().epoll_create1(0);
  const int efd = provider().eventfd(0, EFD_NONBLOCK);
  epoll_event out[2];

  SECTION("EPOLLONESHOT") {
    REQUIRE(ctl(ep, EPOLL_CTL_ADD, efd, EPOLLIN | EPOLLONESHOT, 9) == 0);
    add_to_counter(efd, 1);
    CHECK(provider().epoll_wait(ep, out, 2, 0) == 1);
    CHECK(provider().epoll_wait(ep, out, 2, 0) == 0);  // still readable, but disabled
    add_to_counter(efd, 1);
    CHECK(provider().epoll_wait(ep, out, 2, 0) == 0);
    check_fails_with(EEXIST, [&] { return ctl(ep, EPOLL_CTL_ADD, efd); });  // still in the set
    CHECK(ctl(ep, EPOLL_CTL_MOD, efd, EPOLLIN | EPOLLONESHOT, 10) == 0);   // re-armed
    REQUIRE(provider().epoll_wait(ep, out, 2, 0) == 1);
    CHECK(tag_of(out[0]) == 10);
    CHECK(provider().epoll_wait(ep, out, 2, 0) == 0);
  }
  SECTION("EPOLLET") {
    add_to_counter(efd, 1);  // ready before ADD: ADD queues it
    REQUIRE(ctl(ep, EPOLL_CTL_ADD, efd, EPOLLIN | EPOLLET, 9) == 0);
    CHECK(provider().epoll_wait(ep, out, 2, 0) == 1);
    CHECK(provider().epoll_wait(ep, out, 2, 0) == 0);  // still readable: no new edge
    add_to_counter(efd, 1);                             // a wakeup
    CHECK(provider().epoll_wait(ep, out, 2, 0) == 1);
    CHECK(provider().epoll_wait(ep, out, 2, 0) == 0);
    CHECK(read_counter(efd) == 2);  // a wakeup, but nothing is readable any more
    CHECK(provider().epoll_wait(ep, out, 2, 0) == 0);
    // An event channel's edge: each queued event.
    auto* ch = provider().create_event_channel();
    rdma_cm_id* id = nullptr;
    REQUIRE(provider().create_id(ch, &id, nullptr, RDMA_PS_TCP) == 0);
    REQUIRE(ctl(ep, EPOLL_CTL_ADD, ch->fd, EPOLLIN | EPOLLET, 1) == 0);
    CHECK(provider().epoll_wait(ep, out, 2, 0) == 0);
    fake.inject_event(ch->fd, RDMA_CM_EVENT_ESTABLISHED);
    CHECK(provider().epoll_wait(ep, out, 2, 0) == 1);
    CHECK(provider().epoll_wait(ep, out, 2, 0) == 0);
    fake.inject_event(ch->fd, RDMA_CM_EVENT_DISCONNECTED);
    CHECK(provider().epoll_wait(ep, out, 2, 0) == 1);
    for (int i = 0; i < 2; ++i) {
      rdma_cm_event* ev = nullptr;
      REQUIRE(provider().get_cm_event(ch, &ev) == 0);
      CHECK(provider().ack_cm_event(ev) == 0);
    }
    CHECK(ctl(ep, EPOLL_CTL_DEL, ch->fd) == 0);
    CHECK(provider().destroy_id(id) == 0);
    provider().destroy_event_channel(ch);
  }
  CHECK(ctl(ep, EPOLL_CTL_DEL, efd) == 0);
  CHECK(provider().close(efd) == 0);
  CHECK(provider().close(ep) == 0);
  fake.expect_clean();
}

TEST_CASE("fake epoll: the eventfd's read and write, as fs/eventfd.c", "[fake][epoll]") {
  fake::FakeProvider fake;
  fake.watchdog = epoll_watchdog;
  const int efd = provider().eventfd(0, EFD_NONBLOCK);
  std::uint64_t v = 0;
  std::uint32_t small = 1;
  check_fails_with(EAGAIN, [&] { return static_cast<int>(provider().read(efd, &v, 8)); });
  check_fails_with(EINVAL, [&] { return static_cast<int>(provider().read(efd, &small, 4)); });
  check_fails_with(EINVAL, [&] { return static_cast<int>(provider().write(efd, &small, 4)); });
  v = std::numeric_limits<std::uint64_t>::max();
  check_fails_with(EINVAL, [&] { return static_cast<int>(provider().write(efd, &v, 8)); });
  CHECK(fake.eventfd_value(efd) == 0);
  add_to_counter(efd, 0);  // allowed; changes nothing
  add_to_counter(efd, 40);
  add_to_counter(efd, 2);
  errno = 0;
  CHECK(read_counter(efd) == 42);  // the whole counter, reset
  CHECK(errno == fake::sentinel_errno);
  CHECK(fake.eventfd_value(efd) == 0);
  // Full: a write that would reach the maximum is EAGAIN (non-blocking).
  add_to_counter(efd, std::numeric_limits<std::uint64_t>::max() - 1);
  v = 1;
  check_fails_with(EAGAIN, [&] { return static_cast<int>(provider().write(efd, &v, 8)); });
  CHECK(read_counter(efd) == std::numeric_limits<std::uint64_t>::max() - 1);

  // EFD_SEMAPHORE: 1 per read.
  const int sem = provider().eventfd(2, EFD_SEMAPHORE | EFD_NONBLOCK);
  CHECK(read_counter(sem) == 1);
  CHECK(read_counter(sem) == 1);
  check_fails_with(EAGAIN, [&] { return static_cast<int>(provider().read(sem, &v, 8)); });

  // Blocking: a read waits for a write from another thread; one nothing ends is a hang.
  const int blocking = provider().eventfd(0, 0);
  std::atomic<bool> wrote{false};
  std::thread writer([&] {
    std::this_thread::sleep_for(20ms);
    wrote = post_to_counter(blocking, 5);
  });
  const auto start = steady::now();
  CHECK(read_counter(blocking) == 5);
  CHECK(steady::now() - start < epoll_watchdog / 2);
  writer.join();
  CHECK(wrote);
  CHECK(fake.failures().empty());
  check_fails_with(ETIME, [&] { return static_cast<int>(provider().read(blocking, &v, 8)); });
  REQUIRE(fake.failures().size() == 1);
  CHECK(fake.failures()[0] == "read blocked on an eventfd: a hang in production");
  for (int fd : {efd, sem, blocking}) CHECK(provider().close(fd) == 0);
  CHECK(fake.alive("eventfd") == 0);
}

TEST_CASE("fake epoll: read, write and close of a real fd go to the system; a channel's fd is "
          "not the caller's",
          "[fake][epoll]") {
  fake::FakeProvider fake;
  int fds[2];
  REQUIRE(::pipe(fds) == 0);
  errno = 0;
  CHECK(provider().write(fds[1], "abc", 3) == 3);
  CHECK(errno == fake::sentinel_errno);
  char buf[8] = {};
  CHECK(provider().read(fds[0], buf, sizeof buf) == 3);
  CHECK(std::string(buf) == "abc");
  CHECK(provider().close(fds[1]) == 0);
  CHECK(provider().read(fds[0], buf, sizeof buf) == 0);  // end of file: really closed
  fake.fail("close", kErr);  // an injected failure: the fd is closed all the same
  check_fails_with(kErr, [&] { return provider().close(fds[0]); });
  check_fails_with(EBADF, [&] { return provider().close(fds[0]); });
  check_fails_with(EBADF, [&] { return static_cast<int>(provider().read(fds[0], buf, 1)); });
  CHECK(fake.failures().empty());

  auto* ch = provider().create_event_channel();
  std::uint64_t v = 1;
  check_fails_with(EINVAL, [&] { return static_cast<int>(provider().read(ch->fd, &v, 8)); });
  check_fails_with(EINVAL, [&] { return static_cast<int>(provider().write(ch->fd, &v, 8)); });
  CHECK(provider().close(ch->fd) == 0);
  const auto failures = fake.failures();
  REQUIRE(failures.size() == 3);
  CHECK(failures[0] == "read: the fd of a channel belongs to librdmacm / libibverbs");
  CHECK(failures[2] == "close: the fd of a channel belongs to librdmacm / libibverbs");
  CHECK(fake.alive("event_channel") == 1);  // still librdmacm's
  provider().destroy_event_channel(ch);
}

TEST_CASE("fake epoll: epoll_wait honours its timeout, wakes at once for another thread, and "
          "a wait forever is a recorded hang",
          "[fake][epoll]") {
  fake::FakeProvider fake;
  fake.watchdog = epoll_watchdog;
  const int ep = provider().epoll_create1(0);
  const int efd = provider().eventfd(0, EFD_NONBLOCK);
  REQUIRE(ctl(ep, EPOLL_CTL_ADD, efd, EPOLLIN, 7) == 0);
  epoll_event out[1];

  auto start = steady::now();
  CHECK(provider().epoll_wait(ep, out, 1, 0) == 0);
  CHECK(steady::now() - start < epoll_watchdog / 2);  // no wait (a loaded machine is slow)
  start = steady::now();
  CHECK(provider().epoll_wait(ep, out, 1, 60) == 0);
  const auto took = steady::now() - start;
  CHECK(took >= 60ms);
  CHECK(took < 60ms + epoll_watchdog / 2);

  // wake()/stop() from another thread: a write to the eventfd ends a wait forever at once.
  for (int wait_ms : {-1, 5000}) {
    std::atomic<bool> woken{false};
    std::thread waker([&] {
      std::this_thread::sleep_for(30ms);
      woken = post_to_counter(efd, 1);
    });
    start = steady::now();
    const int n = provider().epoll_wait(ep, out, 1, wait_ms);
    const auto woke = steady::now() - start;
    waker.join();
    CHECK(woken);
    REQUIRE(n == 1);
    CHECK(woke >= 20ms);
    CHECK(woke < epoll_watchdog / 2);  // well before the watchdog
    CHECK(tag_of(out[0]) == 7);
    CHECK(read_counter(efd) == 1);
  }
  // An event queued by another thread on a watched channel also ends it.
  auto* ch = provider().create_event_channel();
  rdma_cm_id* id = nullptr;
  REQUIRE(provider().create_id(ch, &id, nullptr, RDMA_PS_TCP) == 0);
  REQUIRE(ctl(ep, EPOLL_CTL_ADD, ch->fd, EPOLLIN, 8) == 0);
  std::thread injector([&] {
    std::this_thread::sleep_for(30ms);
    fake.inject_event(ch->fd, RDMA_CM_EVENT_ESTABLISHED);
  });
  start = steady::now();
  const int n = provider().epoll_wait(ep, out, 1, -1);
  CHECK(steady::now() - start < epoll_watchdog / 2);
  injector.join();
  REQUIRE(n == 1);
  CHECK(tag_of(out[0]) == 8);
  rdma_cm_event* ev = nullptr;
  REQUIRE(provider().get_cm_event(ch, &ev) == 0);
  CHECK(provider().ack_cm_event(ev) == 0);
  CHECK(fake.failures().empty());

  // Nothing can end it: the watchdog gives up and records the hang.
  start = steady::now();
  check_fails_with(ETIME, [&] { return provider().epoll_wait(ep, out, 1, -1); });
  CHECK(steady::now() - start >= epoll_watchdog);
  REQUIRE(fake.failures().size() == 1);
  CHECK(fake.failures()[0] == "epoll_wait waited forever with nothing ready: a hang in production");

  CHECK(ctl(ep, EPOLL_CTL_DEL, ch->fd) == 0);
  CHECK(provider().destroy_id(id) == 0);
  provider().destroy_event_channel(ch);
  CHECK(provider().close(efd) == 0);
  CHECK(provider().close(ep) == 0);
  CHECK(fake.closed_while_watched() == 1);  // the eventfd, closed while in the set
}

TEST_CASE("fake epoll: a real fd is polled, and seen when it becomes readable during a wait",
          "[fake][epoll]") {
  fake::FakeProvider fake;
  const int ep = provider().epoll_create1(0);
  Pipe pipe;
  REQUIRE(ctl(ep, EPOLL_CTL_ADD, pipe.in(), EPOLLIN, 5) == 0);
  REQUIRE(ctl(ep, EPOLL_CTL_ADD, pipe.out(), EPOLLOUT, 6) == 0);
  epoll_event out[2];
  REQUIRE(provider().epoll_wait(ep, out, 2, 0) == 1);  // an empty pipe is writable
  CHECK(out[0].events == EPOLLOUT);
  CHECK(tag_of(out[0]) == 6);
  REQUIRE(ctl(ep, EPOLL_CTL_DEL, pipe.out()) == 0);

  std::atomic<long> wrote{0};
  std::thread writer([&] {
    std::this_thread::sleep_for(30ms);
    wrote = ::write(pipe.out(), "x", 1);  // the system's: nothing tells the fake
  });
  auto start = steady::now();
  const int n = provider().epoll_wait(ep, out, 2, 5000);
  CHECK(steady::now() - start < 1s);
  writer.join();
  CHECK(wrote == 1);
  REQUIRE(n == 1);
  CHECK(out[0].events == EPOLLIN);
  CHECK(tag_of(out[0]) == 5);
  // Level-triggered: still readable until read.
  CHECK(provider().epoll_wait(ep, out, 2, 0) == 1);
  char c = 0;
  CHECK(::read(pipe.in(), &c, 1) == 1);
  CHECK(provider().epoll_wait(ep, out, 2, 0) == 0);
  // The other end closed: EPOLLHUP, watched without asking.
  ::close(pipe.fds[1]);
  pipe.fds[1] = -1;
  REQUIRE(provider().epoll_wait(ep, out, 2, 0) == 1);
  CHECK(out[0].events == EPOLLHUP);
  // Closed through the provider while watched: it leaves the set.
  CHECK(provider().close(pipe.fds[0]) == 0);
  pipe.fds[0] = -1;
  CHECK(fake.watched(ep).empty());
  CHECK(fake.closed_while_watched() == 1);
  CHECK(provider().close(ep) == 0);
  fake.expect_clean();
}

TEST_CASE("fake epoll: a channel destroyed while watched leaves the set and is counted",
          "[fake][epoll]") {
  fake::FakeProvider fake;
  const int ep = provider().epoll_create1(0);
  auto* ch = provider().create_event_channel();
  auto* comp = provider().create_comp_channel(fake.context(1));
  REQUIRE(ctl(ep, EPOLL_CTL_ADD, ch->fd) == 0);
  REQUIRE(ctl(ep, EPOLL_CTL_ADD, comp->fd) == 0);
  const int ch_fd = ch->fd;

  SECTION("removed first: nothing counted") {
    CHECK(ctl(ep, EPOLL_CTL_DEL, ch->fd) == 0);
    CHECK(ctl(ep, EPOLL_CTL_DEL, comp->fd) == 0);
    provider().destroy_event_channel(ch);
    CHECK(provider().destroy_comp_channel(comp) == 0);
    CHECK(fake.closed_while_watched() == 0);
  }
  SECTION("destroyed while watched: dropped and counted") {
    provider().destroy_event_channel(ch);
    CHECK(fake.watched(ep).size() == 1);
    CHECK(provider().destroy_comp_channel(comp) == 0);
    CHECK(fake.watched(ep).empty());
    CHECK(fake.closed_while_watched() == 2);
    // Its fd is gone: DEL is EBADF, as for any closed fd.
    check_fails_with(EBADF, [&] { return ctl(ep, EPOLL_CTL_DEL, ch_fd); });
    epoll_event out[1];
    CHECK(provider().epoll_wait(ep, out, 1, 0) == 0);
  }
  CHECK(provider().close(ep) == 0);
  fake.expect_clean();
}

TEST_CASE("fake epoll: the flags each file reports (ucma_poll, ib_uverbs_event_poll, "
          "eventfd_poll)",
          "[fake][epoll]") {
  fake::FakeProvider fake;
  const int ep = provider().epoll_create1(0);
  const int efd = provider().eventfd(1, 0);
  auto* ch = provider().create_event_channel();
  rdma_cm_id* id = nullptr;
  REQUIRE(provider().create_id(ch, &id, nullptr, RDMA_PS_TCP) == 0);
  constexpr std::uint32_t everything = EPOLLIN | EPOLLRDNORM | EPOLLOUT | EPOLLWRNORM | EPOLLPRI;
  REQUIRE(ctl(ep, EPOLL_CTL_ADD, efd, everything, 1) == 0);
  REQUIRE(ctl(ep, EPOLL_CTL_ADD, ch->fd, everything, 2) == 0);
  fake.inject_event(ch->fd, RDMA_CM_EVENT_ESTABLISHED);
  epoll_event out[2];
  REQUIRE(provider().epoll_wait(ep, out, 2, 0) == 2);
  for (const auto& e : out) {
    INFO("tag " << tag_of(e));
    CHECK(e.events == (tag_of(e) == 1 ? (EPOLLIN | EPOLLOUT) : (EPOLLIN | EPOLLRDNORM)));
  }
  rdma_cm_event* ev = nullptr;
  REQUIRE(provider().get_cm_event(ch, &ev) == 0);
  CHECK(provider().ack_cm_event(ev) == 0);
  CHECK(ctl(ep, EPOLL_CTL_DEL, ch->fd) == 0);
  CHECK(ctl(ep, EPOLL_CTL_DEL, efd) == 0);
  CHECK(provider().destroy_id(id) == 0);
  provider().destroy_event_channel(ch);
  CHECK(provider().close(efd) == 0);
  CHECK(provider().close(ep) == 0);
  fake.expect_clean();
}

}  // namespace fake_provider_test
