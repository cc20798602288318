// An in-memory fake of rpmapp's provider seam (detail::Provider) for the unit tests.
//
// - Two fake devices, "fake0" owning 169.254.77.1 and "fake1" owning 169.254.78.1; an
//   address in 169.254.77.0/24 is reached through fake0, one in 169.254.78.0/24 through
//   fake1, anything else is unreachable (ADDR_ERROR, EHOSTUNREACH).
// - Event channels have fd numbers (1000, 1001, ...) that only the fake poll() and fcntl()
//   know: readable when the channel's queue is not empty. Like the kernel's, a channel
//   starts blocking; fcntl(F_SETFL, O_NONBLOCK) (or set_nonblocking) changes that.
// - Waits are real: poll() waits up to its timeout for an event queued by another thread,
//   and rdma_get_cm_event() on an empty blocking channel blocks until one is queued. A wait
//   that nothing can end (poll with -1, a blocking read) gives up after `watchdog`,
//   records the hang as a failure and returns -1 with ETIME, so a hang fails the test
//   instead of hanging it.
// - Every successful call sets errno to sentinel_errno, as a real call may leave anything
//   in errno on success: code reading errno one call late sees a value no call produces.
// - Every create/destroy pair is counted per kind; destroying something that is not alive,
//   destroying a cm_id with unacknowledged events or a live queue pair, destroying a
//   channel with cm_ids still on it, blocking forever on an empty channel... is recorded
//   as a failure. expect_clean() checks that nothing is alive and nothing failed.
// - fail(name, errno, nth) makes the nth next call of `name` fail the way the real call
//   does (-1 + errno, NULL + errno, or the errno as the return value for ibv_destroy_*,
//   ibv_dealloc_pd and ibv_req_notify_cq). An injected failure of a release call still
//   releases the resource, so that the accounting checks the library, not the provider.
// - calls() is the log of provider call names, in order.
// - Thread-safe: one mutex guards all the fake's state; every provider function and every
//   public method takes it, so a test can inject events from another thread while the
//   library waits. The public data members (accepts, rejects, ...) are written under that
//   mutex: read them only once no other thread uses the library.
// - The data path, as libibverbs and the kernel behave: ibv_query_device_ex reports each
//   device's DeviceCaps (settable); ibv_reg_mr checks the access flags as the kernel does
//   and logs every registration; a queue pair posts like rxe's (EINVAL to send before it
//   is connected, ENOMEM when more work requests are outstanding than its size) and logs
//   every work request it accepted (posted()); tests complete them (complete_sends,
//   deliver_recv) into the right CQ, whose completion channel gets an event when the CQ
//   is armed. ibv_get_cq_event blocks (watchdog) or gives EAGAIN like rdma_get_cm_event;
//   destroying a CQ with unacknowledged events, an MR that is not alive, or a pd that
//   still has MRs or shared receive queues is recorded as a failure.
// - epoll and eventfd, as fs/eventpoll.c and fs/eventfd.c behave. epoll_create1 and eventfd
//   give fake fds (EINVAL for unknown flags); close() releases them, and one never closed
//   is a leak ("epoll", "eventfd"). epoll_ctl checks in the kernel's order: EFAULT (no
//   event for ADD/MOD), EBADF (epfd, then fd, neither a live fake fd nor an open real
//   one), EPERM (a real file that cannot be polled, e.g. a regular file), EINVAL (epfd ==
//   fd, epfd not an epoll fd, an unknown op), then EEXIST (ADD twice) and ENOENT (MOD/DEL
//   of an fd not in the set). EPOLLERR | EPOLLHUP are always watched. Readiness is level-
//   triggered: an event channel is readable (EPOLLIN) while its queue is not empty, a
//   completion channel while it has events, an eventfd while its counter is not 0 (and
//   writable below its maximum); a real fd is asked with ::poll(..., 0) and one that
//   reports POLLNVAL (closed behind the fake's back) leaves the set. EPOLLONESHOT disables
//   an entry once reported until EPOLL_CTL_MOD; EPOLLET reports an entry after each wakeup
//   (an event queued, an eventfd read or written, ADD, MOD) only. Ready entries come out
//   least recently reported first, like the kernel's ready list (maxevents cannot starve
//   one). epoll_wait waits up to its timeout; -1 gives up after `watchdog` (a recorded
//   hang, -1 ETIME, as poll); while real fds are watched it looks again every millisecond.
//   An event queued or an eventfd written by another thread wakes it at once.
// - A fake channel destroyed, or an eventfd or real fd closed through close(), while in an
//   epoll set leaves the set, as the kernel drops a closed file; each such registration is
//   counted in closed_while_watched() (rpmapp must remove a channel before destroying it).
// - eventfd read: EINVAL for a buffer under 8 bytes, the counter (1 with EFD_SEMAPHORE)
//   and reset, EAGAIN at 0 when non-blocking, a watchdog-bounded wait when blocking. write:
//   EINVAL under 8 bytes or for 0xffffffffffffffff, adds, EAGAIN/waits when it would
//   overflow. read/write/close of a real fd go to the system (the fake's mutex released).
// - Not modelled, recorded as a failure when used: EPOLLEXCLUSIVE, EPOLLWAKEUP, EPOLLET on
//   a real fd (the fake sees no wakeups of real files), an epoll fd inside an epoll set,
//   read/write/close of a channel's fd (librdmacm's and libibverbs' to manage). A real fd
//   closed with ::close directly (not through the provider) is seen only if poll() says
//   POLLNVAL, i.e. not when its number was reused; dup'ed fds are not modelled.
#pragma once

#include <rpmapp/detail/provider.hpp>

#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <set>
#include <string>
#include <string_view>
#include <vector>

namespace fake {

inline constexpr int device_count = 2;

/// errno after every successful fake call: no real call produces it.
inline constexpr int sentinel_errno = 7777;

/// What a CONNECT_REQUEST injected into a listener carries.
struct Request {
  int device = 0;                 ///< index of the device it arrives on
  std::string private_data;       ///< sent by the "client" (padded to 56 bytes, not on iWARP)
  std::string peer = "169.254.77.2";
  std::uint16_t peer_port = 40000;
};

/// Private data the library sent with rdma_accept / rdma_reject / rdma_connect.
struct Sent {
  rdma_cm_id* id;
  std::vector<std::byte> data;
  std::string text() const;  ///< the bytes as a string
};

/// What ibv_query_device_ex reports for a device (settable per device, before Peer::open).
struct DeviceCaps {
  std::uint64_t odp_general_caps = 0;  ///< IBV_ODP_SUPPORT when on-demand paging works
  std::uint32_t rc_odp_caps = 0;       ///< IBV_ODP_SUPPORT_READ / _WRITE ...
  std::uint64_t device_cap_flags_ex = 0;  ///< bit 40: native atomic write; 38, 39: flushes
  /// The device's transport_type. IBV_TRANSPORT_IWARP: its queues post as siw's provider
  /// does (failures as negated errnos, no receive without a scatter/gather entry, no
  /// immediate data or atomics).
  ibv_transport_type transport = IBV_TRANSPORT_IB;
  /// ibv_device_attr::device_cap_flags; rxe's memory window bits by default (type 1 and 2B).
  unsigned device_cap_flags = IBV_DEVICE_MEM_WINDOW | IBV_DEVICE_MEM_WINDOW_TYPE_2B;
  /// ibv_device_attr's limits, rxe's by default (ibv_devinfo -v on kernel 6.1); the fake's
  /// ibv_create_cq / rdma_create_qp / ibv_create_srq refuse beyond them with EINVAL, as
  /// rxe and siw do.
  ibv_atomic_cap atomic_cap = IBV_ATOMIC_HCA;
  int max_qp_wr = 1 << 20;
  int max_sge = 32;
  int max_sge_rd = 32;
  int max_cqe = 32767;
  int max_srq_wr = 1 << 20;
  int max_qp_init_rd_atom = 128;
  /// Not in the device's attributes: the largest max_inline_data a queue pair may ask for
  /// (the fake's own 256; siw's SIW_MAX_INLINE, 80).
  std::uint32_t max_inline_data = 256;
  /// Whether the provider has create_qp_ex (rxe, mlx5): libibverbs' ibv_create_qp_ex
  /// takes a comp_mask beyond IBV_QP_INIT_ATTR_PD only then, else EOPNOTSUPP (siw, irdma
  /// and cxgb4 have none).
  bool extended_qps = true;
  /// A device without memory windows (siw; ibv_alloc_mw then gives EOPNOTSUPP).
  static DeviceCaps without_windows() {
    DeviceCaps c;
    c.device_cap_flags = 0;
    return c;
  }
  /// siw's: iWARP, no memory windows or atomics, its limits (ibv_devinfo -v on 6.1).
  static DeviceCaps siw() {
    DeviceCaps c = without_windows();
    c.transport = IBV_TRANSPORT_IWARP;
    c.atomic_cap = IBV_ATOMIC_NONE;
    c.max_qp_wr = 32768;
    c.max_sge = 6;
    c.max_sge_rd = 1;
    c.max_cqe = 3276800;
    c.max_srq_wr = 327680;
    c.max_inline_data = 80;
    c.extended_qps = false;
    return c;
  }
  /// ODP for RC reads and writes (what librpma requires).
  static DeviceCaps with_odp() {
    DeviceCaps c;
    c.odp_general_caps = IBV_ODP_SUPPORT;
    c.rc_odp_caps = IBV_ODP_SUPPORT_READ | IBV_ODP_SUPPORT_WRITE;
    return c;
  }
  static constexpr std::uint64_t atomic_write_flag = 1ull << 40;
  /// IB_UVERBS_DEVICE_FLUSH_GLOBAL | _PERSISTENT: rxe's from kernel 6.2
  static constexpr std::uint64_t flush_flags = (1ull << 38) | (1ull << 39);
};

/// One ibv_reg_mr call: its arguments and result (mr null and err set when it failed).
struct Registration {
  ibv_pd* pd = nullptr;
  void* addr = nullptr;
  std::size_t length = 0;
  int access = 0;
  ibv_mr* mr = nullptr;
  int err = 0;
};

/// A live memory window, as the kernel holds it (rxe's rxe_mw).
struct Window {
  ibv_mw* mw = nullptr;
  ibv_mw_type type = IBV_MW_TYPE_2;
  ibv_pd* pd = nullptr;
  std::uint32_t rkey = 0;  ///< the kernel's key (a bind replaces its low byte)
  bool bound = false;
  ibv_qp* qp = nullptr;    ///< type 2: the queue pair it is bound to
  ibv_mr* mr = nullptr;
  std::uint64_t addr = 0;
  std::uint64_t length = 0;
  unsigned access = 0;
};

/// One ibv_advise_mr call.
struct Advice {
  ibv_pd* pd = nullptr;
  ibv_advise_mr_advice advice{};
  std::uint32_t flags = 0;
  std::vector<ibv_sge> sge;
  int result = 0;
};

/// A work request the fake accepted (ibv_post_send, ibv_post_recv, ibv_post_srq_recv, the
/// native atomic write).
struct PostedWr {
  enum class Queue { send, recv, srq };
  Queue queue = Queue::send;
  std::uint32_t qp_num = 0;  ///< 0 for a shared receive queue's
  ibv_srq* srq = nullptr;
  std::uint64_t wr_id = 0;
  int opcode = -1;  ///< an ibv_wr_opcode; -1 for a receive
  unsigned send_flags = 0;
  std::vector<ibv_sge> sge;
  std::vector<std::byte> inline_data;  ///< copied at post time (IBV_SEND_INLINE, atomic write)
  std::uint64_t remote_addr = 0;
  std::uint32_t rkey = 0;
  std::uint32_t imm_data = 0;  ///< as posted (network order)
  bool native_atomic = false;
  /// A native flush (opcode IBV_WR_FLUSH, 14): its length, type and level as posted.
  bool native_flush = false;
  std::size_t flush_len = 0;
  std::uint8_t flush_type = 0;
  std::uint8_t flush_level = 0;
  /// A memory window bind (opcode IBV_WR_BIND_MW): the window, the new key (`rkey`), the
  /// region, range and access rights as posted.
  ibv_mw* mw = nullptr;
  ibv_mr* bind_mr = nullptr;
  std::uint64_t bind_addr = 0;
  std::uint64_t bind_length = 0;
  unsigned bind_access = 0;
  /// Every non-inline entry lies within a live MR of the queue's pd with that lkey (and
  /// has the MR's local-write right when the device writes into it). A request that is
  /// not completes with IBV_WC_LOC_PROT_ERR, as a real device would.
  bool local_ok = true;
};

class FakeProvider {
 public:
  FakeProvider();   // installs itself as the provider
  ~FakeProvider();  // restores the previous provider
  FakeProvider(const FakeProvider&) = delete;
  FakeProvider& operator=(const FakeProvider&) = delete;

  static FakeProvider& current();

  // ---- devices
  /// librdmacm's context of `device`: in rdma_get_devices()'s list, and the one its
  /// cm_ids carry (id->verbs).
  ibv_context* context(int device);
  /// Another context of the same device (same ibv_device), as ibv_open_device gives:
  /// verbs work on it, but rdma_create_qp refuses a protection domain on it.
  ibv_context* foreign_context(int device);
  /// Swaps which of the device's two contexts is librdmacm's, as when librdmacm has
  /// reopened a device: Peers opened before hold a context the cm_ids no longer carry.
  void swap_contexts(int device);
  static std::string address(int device);  ///< "169.254.77.1" / "169.254.78.1"
  /// The kernel removes `device` (`rdma link delete` of a device without disassociation,
  /// as rxe): every cm_id on it gets RDMA_CM_EVENT_DEVICE_REMOVAL, and neither
  /// ibv_get_device_list nor rdma_get_devices lists it any more. rdma_get_devices (librdmacm's
  /// sync) then closes librdmacm's context of it once no cm_id or earlier list holds it; a
  /// protection domain of it still alive then is a misuse (its Peer's calls would reach a
  /// closed context). Objects of the device keep working meanwhile (rxe's do).
  void remove_device(int device);
  /// Whether librdmacm closed its context of the removed `device` (the removal can finish).
  bool device_context_closed(int device) const;

  // ---- fault injection and the call log
  /// The `nth` next call named `call` (e.g. "rdma_listen") fails with `err`.
  void fail(std::string call, int err, int nth = 1);
  /// How many injected failures have not fired yet.
  std::size_t pending_faults() const;
  /// A copy of the log (another thread may be adding to it).
  std::vector<std::string> calls() const;
  std::size_t mark() const;
  std::vector<std::string> calls_since(std::size_t mark) const;
  void clear_calls();

  // ---- events
  /// Queues a CONNECT_REQUEST on the listening channel with fd `listener_fd`.
  void inject_connect_request(int listener_fd, const Request& request);
  /// Queues `type` for the (only) cm_id on the channel with fd `fd`. Private data is padded
  /// as rdma_cm does (196 bytes for ESTABLISHED, 148 for REJECTED; nothing on an iWARP
  /// device, as MPA) unless `pad` is false.
  void inject_event(int fd, rdma_cm_event_type type, std::string_view private_data = {},
                    int status = 0, bool pad = true);
  /// Queues `type` for the cm_id whose queue pair is `qp_num`, on whatever channel it is
  /// (a shared one holds many ids). Padded as inject_event.
  void inject_event_on_qp(std::uint32_t qp_num, rdma_cm_event_type type, std::string_view private_data = {},
                          int status = 0, bool pad = true);
  /// Events queued (not yet taken) on the channel with fd `fd`.
  std::size_t queued(int fd) const;
  /// Marks the channel with fd `fd` non-blocking (O_NONBLOCK on a real fd).
  void set_nonblocking(int fd, bool on = true);
  /// Whether the channel with fd `fd` is non-blocking.
  bool nonblocking(int fd) const;
  /// Models another thread reading the channel between a poll and the read: the next
  /// `times` polls that report `fd` readable then drop the first event queued on it.
  void take_after_poll(int fd, int times = 1);
  /// Models one event waking several threads: the next `pollers` polls that find `fd`
  /// readable each wait until all of them have, so that all see it before any reads it.
  void rendezvous_polls(int fd, int pollers);
  /// Events dropped so far by take_after_poll.
  std::size_t taken_after_poll() const;
  /// Queues an event that librdmacm consumes inside rdma_get_cm_event (e.g. an event for
  /// an id it no longer knows), which then reads again: that read blocks on a blocking
  /// channel and gives EAGAIN on a non-blocking one when nothing else is queued.
  void inject_internal_event(int fd);
  /// How long a wait that nothing can end may last before it counts as a hang.
  std::chrono::milliseconds watchdog{2000};

  /// When false, rdma_resolve_addr/rdma_resolve_route queue nothing until deliver_held().
  bool auto_resolve = true;
  void deliver_held();
  /// The event rdma_resolve_addr / rdma_resolve_route queue (ADDR_ERROR etc. to test errors).
  rdma_cm_event_type addr_event = RDMA_CM_EVENT_ADDR_RESOLVED;
  int addr_status = 0;
  rdma_cm_event_type route_event = RDMA_CM_EVENT_ROUTE_RESOLVED;
  int route_status = 0;


  // ---- the data path
  /// What ibv_query_device_ex reports for `device` (default: no ODP, no atomic write, IB).
  void set_caps(int device, const DeviceCaps& caps);
  /// Memory at `addr` refuses a registration without IBV_ACCESS_ON_DEMAND (EOPNOTSUPP),
  /// as FSDAX memory does.
  void needs_odp(const void* addr);
  /// Memory at `addr` is persistent (pmem): only it may be registered with
  /// IBV_ACCESS_FLUSH_PERSISTENT; elsewhere that is EINVAL, as rxe refuses pages that are
  /// not pmem.
  void persistent_memory(const void* addr);
  /// Every ibv_reg_mr call, in order.
  std::vector<Registration> registrations() const;
  std::vector<Advice> advices() const;
  /// Every work request accepted, in order.
  std::vector<PostedWr> posted() const;
  /// Completes the `n` oldest outstanding send work requests of `qp` with `status`: a
  /// signaled one, or any that failed, produces a completion on the send CQ; an unsignaled
  /// successful one completes silently. Returns how many were completed.
  std::size_t complete_sends(ibv_qp* qp, std::size_t n = std::numeric_limits<std::size_t>::max(),
                             ibv_wc_status status = IBV_WC_SUCCESS);
  /// A message arrives for `qp`: consumes its oldest receive (or its shared receive queue's),
  /// copies `payload` into the receive's memory and completes it on the QP's receive CQ
  /// (opcode RECV, or RECV_RDMA_WITH_IMM / with imm when `imm` is set; `imm` is given in
  /// host order and lands in network order). False when no receive was posted.
  bool deliver_recv(ibv_qp* qp, std::span<const std::byte> payload = {},
                    std::optional<std::uint32_t> imm = std::nullopt, bool rdma_with_imm = false,
                    ibv_wc_status status = IBV_WC_SUCCESS);
  /// Puts `wc` into `cq` (an event on its channel if armed).
  void add_completion(ibv_cq* cq, const ibv_wc& wc);
  /// The next ibv_poll_cq that finds `cq` empty then adds `wc`: a completion arriving
  /// right after the poll (before the caller waits).
  void complete_after_empty_poll(ibv_cq* cq, const ibv_wc& wc);
  /// The next ibv_poll_cq on `cq` returns `result` and writes nothing: a provider's
  /// negative value (-1, a negative errno...), or more completions than were asked for.
  void poll_cq_returns(ibv_cq* cq, int result);
  /// The queue pair number the next queue pair gets (then counting up from it): a device
  /// that reuses a destroyed queue pair's number at once, as mlx5 may (rxe counts on).
  void next_qp_number(std::uint32_t qp_num);
  /// The live memory windows, oldest first.
  std::vector<Window> windows() const;
  /// Whether an RDMA access of `access` (IBV_ACCESS_REMOTE_READ, _WRITE...) to [addr, +len)
  /// with `rkey`, arriving on the queue pair `qp_num`, passes the responder's checks as
  /// rxe's check_rkey makes them: a window's key reaches only through its own queue pair,
  /// while bound, for its rights; the range is checked against the *region's* bounds, for a
  /// window too (rxe's rule, kernels 6.1 to 6.12); a region's own key needs the right in
  /// the region and the queue pair's pd.
  bool remote_access(std::uint32_t qp_num, std::uint32_t rkey, std::uint64_t addr, std::size_t len,
                     int access) const;
  /// Bytes getrandom gives next (then the system's).
  void random_bytes(std::vector<std::uint8_t> bytes);
  std::size_t outstanding_sends(ibv_qp* qp) const;
  std::size_t outstanding_recvs(ibv_qp* qp) const;
  std::size_t outstanding_srq_recvs(ibv_srq* srq) const;
  /// Completions waiting in `cq`; whether it is armed; events queued on a channel.
  std::size_t cq_entries(ibv_cq* cq) const;
  bool armed(ibv_cq* cq) const;
  std::size_t cq_events_queued(const ibv_comp_channel* ch) const;
  /// Events acknowledged with ibv_ack_cq_events, in all.
  unsigned long acked_cq_events() const;
  /// Whether `qp` is connected (RTS): after rdma_accept, or the ESTABLISHED event of a
  /// connecting id. rdma_disconnect moves it to the error state (outstanding work requests
  /// are flushed with IBV_WC_WR_FLUSH_ERR).
  bool connected(ibv_qp* qp) const;
  /// The extended attributes of the last rdma_create_qp_ex.
  ibv_qp_init_attr_ex last_qp_attr_ex{};

  /// siw makes the TCP connection inside rdma_connect: while held, rdma_connect on an
  /// iWARP device waits there (the fake's mutex released) until release_connects().
  void hold_connects();
  void release_connects();
  /// Waits (up to the watchdog) until `n` rdma_connect calls are held; whether they are.
  bool connects_held(int n);

  // ---- what was sent
  std::vector<Sent> accepts, rejects, connects;
  std::vector<rdma_cm_id*> disconnects;
  std::vector<int> backlogs;  ///< rdma_listen's backlog argument, per call
  /// The protection domain each queue pair was created with, by qp_num.
  std::map<std::uint32_t, ibv_pd*> qp_pd;
  ibv_qp_init_attr last_qp_attr{};
  rdma_conn_param last_conn_param{};

  // ---- epoll and eventfd
  /// epoll registrations dropped because their file went away while watched (a fake
  /// channel destroyed, an fd closed through close()): legal for the kernel, but rpmapp
  /// must EPOLL_CTL_DEL a source before destroying it.
  std::size_t closed_while_watched() const;
  /// The fds in the set of the fake epoll fd `epfd`, each with the events it watches (as
  /// stored: EPOLLERR | EPOLLHUP added); empty when `epfd` is not a live epoll fd.
  std::map<int, std::uint32_t> watched(int epfd) const;
  /// The counter of the fake eventfd `fd` (REQUIREs that it is alive).
  std::uint64_t eventfd_value(int fd) const;

  // ---- accounting
  /// Live resources of `kind`: "event_channel", "cm_id", "qp", "cq", "comp_channel", "pd",
  /// "unacked_event", "device_list", "mr", "srq", "unacked_cq_event", "epoll",
  /// "eventfd", "mw".
  long alive(const std::string& kind) const;
  /// How many objects of `kind` a destroy call was refused for (EBUSY) because a queue pair
  /// that survived a failed ibv_destroy_qp holds them.
  long refused(const std::string& kind) const;
  /// What closing the device contexts does: queue pairs that survived a failed
  /// ibv_destroy_qp go, and with them what the library tried to release and was refused.
  /// Whatever it never tried to release stays (problems() reports it).
  void close_contexts();
  /// Everything still alive and every recorded misuse, one per line; "" when clean.
  std::string problems() const;
  std::vector<std::string> failures() const;
  /// CHECKs (Catch2) that problems() is empty.
  void expect_clean() const;
  /// Whether `id` is a live cm_id (and has not been destroyed).
  bool id_alive(const rdma_cm_id* id) const;

  // ---- the provider functions (public for the Provider table)
  struct Impl;

 private:
  struct Channel {
    std::deque<rdma_cm_event*> queue;
    bool nonblocking = false;
    int take_after_poll = 0;
    int rendezvous = 0;  // pollers expected (rendezvous_polls), and those arrived
    int arrived = 0;
  };
  struct IdInfo {
    bool bound = false;
    bool listening = false;
    std::uint16_t port = 0;
    int device = -1;
  };
  struct EventData {  // owns an event's private data and, for a request, its child cm_id
    std::vector<std::byte> data;
    rdma_cm_id* child = nullptr;
    bool internal = false;  // consumed by librdmacm itself, never returned
  };

  struct Outstanding {  // a work request not yet completed
    std::uint64_t wr_id = 0;
    int opcode = -1;
    bool signaled = true;
    bool local_ok = true;
    std::uint32_t byte_len = 0;
    std::vector<ibv_sge> sge;
    ibv_mw* mw = nullptr;  // a bind's window
  };
  enum class QpState { init, rts, error };
  struct QpInfo {
    QpState state = QpState::init;
    ibv_qp_cap cap{};
    bool atomic_write = false;  // created with IBV_QP_EX_WITH_ATOMIC_WRITE (by value: rdma-core 39 lacks it)
    bool flush = false;         // created with IBV_QP_EX_WITH_FLUSH
    std::deque<Outstanding> sends, recvs;
  };
  struct CqInfo {
    std::deque<ibv_wc> wcs;
    bool armed = false;
    unsigned unacked = 0;  // events delivered and not acknowledged
    std::optional<ibv_wc> after_empty_poll;
    std::optional<int> poll_result;  // poll_cq_returns
  };
  struct CompChannelInfo {
    std::deque<ibv_cq*> events;
    bool nonblocking = false;
  };
  struct SrqInfo {
    std::uint32_t max_wr = 0, max_sge = 0;
    std::deque<Outstanding> recvs;
  };

  using Lock = std::unique_lock<std::mutex>;
  Lock lock() const { return Lock(mutex_); }

  // The private helpers below expect mutex_ to be held.
  bool injected(const char* call, int& err);
  std::string problems_locked() const;
  ibv_context* foreign_context_locked(int device);
  void note(std::string what) { failures_.push_back(std::move(what)); }
  void created(const std::string& kind) { ++alive_[kind]; }
  void destroyed(const std::string& kind) { --alive_[kind]; }
  /// Whether `object` is held by a queue pair a failed ibv_destroy_qp left alive; if so, the
  /// refusal is the kernel's answer (EBUSY), not a misuse, and is remembered.
  bool refuse_for_survivor(const void* object, const char* kind);
  int device_of_context(const ibv_context* ctx) const;
  Channel* channel_by_fd(int fd, rdma_event_channel** out = nullptr);
  rdma_cm_event* make_event(rdma_cm_id* id, rdma_cm_event_type type, std::string_view data,
                            std::size_t pad_to, int status);
  void queue_event(rdma_event_channel* ch, rdma_cm_event* ev);
  void discard_event(rdma_cm_event* ev);
  /// Waits (releasing the mutex) until the channel has an event or is gone, at most
  /// `limit`; false when the limit passed.
  bool wait_for_event(Lock& held, rdma_event_channel* ch, std::chrono::milliseconds limit);
  int resolve_device(const sockaddr* dst) const;
  // The data path (mutex_ held).
  bool sge_ok(const ibv_pd* pd, const ibv_sge& sge, bool device_writes) const;
  Window* window_of(const ibv_mw* mw);
  /// Why rxe's bind (rxe_bind_mw, rxe_check_bind_mw) refuses `wr` on `qp`; empty when it
  /// binds.
  std::string bind_refusal(const ibv_qp* qp, const ibv_send_wr& wr);
  void push_wc(ibv_cq* cq, const ibv_wc& wc);
  void complete_one(ibv_qp* qp, Outstanding& wr, ibv_cq* cq, ibv_wc_status status, bool recv);
  void flush_qp(ibv_qp* qp);
  CompChannelInfo* comp_by_fd(int fd);
  // epoll and eventfd (mutex_ held).
  enum class FdKind { none, event_channel, comp_channel, epoll, eventfd };
  FdKind fake_kind(int fd);
  /// The events `fd` is ready for; nullopt when a real fd is no longer open.
  std::optional<std::uint32_t> readiness(int fd, bool real);
  /// A wakeup of `fd`'s wait queue: edge-triggered watches of it report again.
  void wakeup(int fd);
  /// `fd`'s file is gone: it leaves every epoll set (counted in closed_while_watched_).
  void drop_watches(int fd);
  /// Fills `out` with up to `max` ready entries of `epfd`'s set; -1 when it is not alive.
  int collect_ready(int epfd, epoll_event* out, int max);
  bool watches_real_fd(int epfd) const;

  struct Fault {
    std::string call;
    int err;
    int remaining;
  };
  mutable std::mutex mutex_;
  std::condition_variable changed_;  // notified whenever an event is queued
  bool connects_on_hold_ = false;   // hold_connects
  int connects_in_call_ = 0;        // rdma_connect calls held
  std::vector<Fault> faults_;
  std::vector<std::string> calls_;
  std::vector<std::string> failures_;
  std::map<std::string, long> alive_;

  ibv_device devices_[device_count]{};
  ibv_context contexts_[device_count]{};
  ibv_context foreign_[device_count]{};
  ibv_context* cm_contexts_[device_count]{};  // librdmacm's: &contexts_[d] or &foreign_[d]
  std::set<ibv_context**> device_lists_;      // rdma_get_devices arrays not yet freed
  std::set<ibv_device**> ibv_device_lists_;   // ibv_get_device_list arrays not yet freed
  bool removed_[device_count]{};              // remove_device
  bool context_closed_[device_count]{};       // librdmacm closed its context of a removed device
  /// librdmacm's sync for removed `device`: closes its context unless a cm_id or a list holds it.
  void librdmacm_closes(int device);

  std::map<rdma_event_channel*, Channel> channels_;
  std::map<rdma_cm_id*, IdInfo> ids_;
  std::map<rdma_cm_event*, EventData> events_;  // queued or delivered
  std::set<rdma_cm_event*> unacked_;
  std::map<ibv_qp*, QpInfo> qps_;
  std::set<ibv_qp*> survivors_;                 // failed ibv_destroy_qp: still alive
  std::map<const void*, std::string> refused_;  // refused because a survivor holds it
  std::map<ibv_cq*, CqInfo> cqs_;
  std::map<ibv_comp_channel*, CompChannelInfo> comp_channels_;
  std::map<ibv_mr*, int> mrs_;  // live registrations and their access flags
  std::map<ibv_srq*, SrqInfo> srqs_;
  std::vector<Window> windows_;  // live memory windows, oldest first
  std::uint32_t next_mw_index_ = 0x10000;  // rxe: window indices above the regions'
  std::deque<std::uint8_t> random_bytes_;
  DeviceCaps caps_[device_count]{};
  std::set<const void*> needs_odp_;
  std::set<const void*> persistent_;
  std::vector<Registration> registrations_;
  std::vector<Advice> advices_;
  std::vector<PostedWr> posted_;
  unsigned long acked_cq_events_ = 0;
  std::uint32_t next_key_ = 0x1000;
  std::set<ibv_pd*> pds_;
  std::vector<std::pair<rdma_event_channel*, rdma_cm_event*>> held_;
  std::size_t taken_after_poll_ = 0;
  struct Watch {  // an epoll registration
    std::uint32_t events = 0;  // as given, with EPOLLERR | EPOLLHUP
    epoll_data_t data{};
    bool real = false;          // a real fd, checked with ::poll
    bool armed = true;          // false once an EPOLLONESHOT entry was reported
    bool edge_pending = true;   // EPOLLET: woken since last reported
    std::uint64_t order = 0;    // place in the ready list: least recently reported first
  };
  struct EventFd {
    std::uint64_t count = 0;
    bool nonblocking = false;
    bool semaphore = false;
  };
  std::map<int, std::map<int, Watch>> epolls_;  // epoll fd -> its set, by watched fd
  std::map<int, EventFd> eventfds_;
  std::uint64_t next_order_ = 0;
  std::size_t closed_while_watched_ = 0;
  int probe_epoll_ = -1;  // a real epoll fd: asks the kernel whether a real fd can be watched
  int next_fd_ = 1000;
  std::uint16_t next_port_ = 50000;
  std::uint32_t next_qp_num_ = 100;

  std::unique_ptr<rpmapp::detail::ProviderOverride> override_;
};

/// The names of provider calls that return void: they cannot be made to fail.
bool cannot_fail(std::string_view call);

/// For a call log: each call with the number of its occurrence (1-based) among the calls
/// of the same name, skipping those that cannot fail.
std::vector<std::pair<std::string, int>> failable_calls(const std::vector<std::string>& log);

}  // namespace fake
