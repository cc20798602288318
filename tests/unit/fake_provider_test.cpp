// The fake provider itself: accounting, fault injection and events behave as documented,
// so that the other tests can trust it.
#include "test_util.hpp"

#include <fcntl.h>

#include <chrono>
#include <thread>

using namespace test;
using rpmapp::detail::provider;

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
  rdma_addrinfo hints{};
  hints.ai_flags = RAI_PASSIVE;
  rdma_addrinfo* specific = nullptr;
  rdma_addrinfo* wildcard = nullptr;
  REQUIRE(provider().getaddrinfo("169.254.78.1", "0", &hints, &specific) == 0);
  REQUIRE(provider().getaddrinfo("0.0.0.0", "0", &hints, &wildcard) == 0);
  rdma_cm_id* one = nullptr;
  rdma_cm_id* all = nullptr;
  REQUIRE(provider().create_id(nullptr, &one, nullptr, RDMA_PS_TCP) == 0);
  REQUIRE(provider().create_id(nullptr, &all, nullptr, RDMA_PS_TCP) == 0);
  REQUIRE(provider().bind_addr(one, specific->ai_src_addr) == 0);
  REQUIRE(provider().bind_addr(all, wildcard->ai_src_addr) == 0);
  CHECK(one->verbs == fake.context(1));
  CHECK(std::string(one->verbs->device->name) == "fake1");
  CHECK(all->verbs == nullptr);
  CHECK(rpmapp::detail::port_of(rdma_get_local_addr(one)) != 0);  // port 0 assigned
  CHECK(rpmapp::detail::port_of(rdma_get_local_addr(one)) !=
        rpmapp::detail::port_of(rdma_get_local_addr(all)));
  provider().freeaddrinfo(specific);
  provider().freeaddrinfo(wildcard);
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
