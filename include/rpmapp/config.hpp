// Plain configuration values for endpoints and connections.
#pragma once

#include <rpmapp/version.hpp>

#include <chrono>
#include <cstdint>

RPMAPP_BEGIN_NAMESPACE

class SharedCq;
class SharedEventChannel;
class Srq;

/// Queue pair, completion queue and connection parameters of one connection
/// (librpma's rpma_conn_cfg, plus the retry counts librpma hard-codes).
/// A value type; validated when used (ConnReq::to, Endpoint::next_conn_req), and its sizes
/// (sq_size, rq_size, max_sge, cq_size, rcq_size) against the device's limits
/// (Peer::capabilities) before the connection's queues are created: a size beyond them is
/// inval ("ConnConfig") naming the limit and the device, not the provider's bare EINVAL.
struct ConnConfig {
  /// Address and route resolution timeout of an outgoing request (each step).
  std::chrono::milliseconds timeout{1000};
  /// Completion queue size (send completions, and receive ones when rcq_size is 0). >= 1.
  std::uint32_t cq_size = 10;
  /// Separate receive completion queue size; 0 = receive completions go to the main CQ.
  std::uint32_t rcq_size = 0;
  /// Send queue size (max outstanding send work requests). >= 1.
  std::uint32_t sq_size = 10;
  /// Receive queue size (max outstanding receive work requests). >= 1.
  std::uint32_t rq_size = 10;
  /// Transport retries before a queue pair reports an error, 0..7. Only the CONNECTING
  /// side's value is used, and it sets BOTH queue pairs (it travels in the IB CM request;
  /// the accepting side's retry_count is ignored: measured on rxe with ibv_query_qp).
  /// The default is 6, not librpma's 7: rxe never counts down a count of 7 ("retry
  /// forever"), so a vanished peer would never be detected; with 6 a sender sees a
  /// retry-exceeded error (about 15 s on rxe). A server depends on its clients for this.
  std::uint8_t retry_count = 6;
  /// Receiver-not-ready retries, 0..7 (7 = retry forever). Each side's value sets the
  /// OTHER side's queue pair (the client's travels in the request, the server's in the
  /// reply): it is how long the peer keeps retrying while this side has no receive
  /// posted. Default 7, as librpma: a receiver that is alive is waited for.
  std::uint8_t rnr_retry_count = 7;
  /// Largest message sent inline (copied into the work request: no lkey needed, lower
  /// latency); the queue pair is created for it. librpma hard-codes 8 (its emulated
  /// atomic write is an 8-byte inline write: keep at least 8).
  std::uint32_t max_inline_data = 8;
  /// Scatter/gather entries per send and per receive work request (rpmapp's operations use
  /// one; more is for raw verbs on Conn::qp()). librpma hard-codes 1. >= 1.
  std::uint32_t max_sge = 1;
  /// The completion vector the CQs are created on (interrupt steering), below the device's
  /// num_comp_vectors. librpma uses 0.
  int completion_vector = 0;
  /// One completion channel for the CQ and the receive CQ (librpma's
  /// rpma_conn_cfg_set_compl_channel): wait on the connection (Conn::wait_completion,
  /// Conn::completion_fd); Cq::wait on either queue is then errc::shared_channel.
  bool shared_completion_channel = false;
  /// Whether the CQs get a completion channel at all. false: the CQ and the receive CQ are
  /// created without one and are never armed, which saves per side and connection an
  /// ibv_create_comp_channel (open + ioctl), an ibv_req_notify_cq per CQ, and a close at
  /// teardown; for a connection whose completions are only polled (Cq::get). What waits
  /// for a completion event is then inval: Cq::fd, wait, try_wait, wait_for, next, next_for
  /// and arm on the connection's queues, Conn::completion_fd and wait_completion (all
  /// forms), EventLoop::watch_completions and completions. Fixed at creation (a CQ's
  /// channel cannot be added later); false with shared_completion_channel is inval. A
  /// shared receive queue's own CQ keeps its own channel.
  bool completion_channel = true;
  /// A shared receive queue for the connection's receives (librpma's
  /// rpma_conn_cfg_set_srq); not owned: the connection keeps the queue alive itself, so the
  /// Srq may go before it (EventLoop::serve and co_await next_conn_req hold the queue for
  /// the requests they take later: the handle may go once the call returns). Receives are then posted with Srq::recv (Conn::recv is inval), and
  /// land in the Srq's receive CQ when it has one (else in this connection's).
  const Srq* srq = nullptr;
  /// A completion queue shared with other connections (SharedCq), instead of a CQ of the
  /// connection's own: its send completions, and its receive completions unless its
  /// shared receive queue has a CQ (srq), land there, tagged with Conn::id (Cq::get with
  /// `conns`). Not owned: the connection keeps the queue alive itself (as srq). The
  /// connection then has no CQ and no completion channel of its own: Conn::cq() is the
  /// shared queue, cq_size and completion_channel do not apply, and rcq_size > 0,
  /// shared_completion_channel and reuse_completion_queues are inval, as are
  /// Conn::completion_fd, Conn::wait_completion and EventLoop::watch_completions /
  /// completions on the connection (wait on the shared queue instead). The queue must be on
  /// the connection's device (inval otherwise).
  const SharedCq* shared_cq = nullptr;
  /// An rdma_cm event channel shared with other connections (SharedEventChannel), instead
  /// of one of the connection's own (an fd per connection): an outgoing request's id is
  /// created on it, an accepted request's is moved there from the listener's. Events are
  /// routed to their connection by id, so Conn::next_event, PendingConnReq::wait,
  /// EventLoop::watch and the coroutines work as on a channel of its own. Not owned: the
  /// connection keeps the channel alive itself. Conn::fd and PendingConnReq::fd are then
  /// inval (the channel's fd is SharedEventChannel::fd); reuse_event_channel is inval.
  const SharedEventChannel* shared_event_channel = nullptr;
  /// Take the connection's rdma_cm event channel from its Peer's spares, and give it back
  /// when the connection is released, instead of opening and closing one per connection
  /// (an open, a stat, an fcntl and a close of /dev/infiniband/rdma_cm, and the kernel's
  /// file: on Soft-RoCE the open costs about what rdma_bind_addr does). The spares
  /// are channels of released connections that set this too, at most
  /// Peer::max_spare_event_channels, closed with the Peer's last reference.
  /// The price: Conn::fd() (PendingConnReq::fd()) stays open after the connection is
  /// released and may become the fd of a later connection, so remove it from your epoll
  /// sets before releasing the connection (EventLoop does). A channel whose cm_id could
  /// not be destroyed is closed, never reused. The default, false, closes the fd with the
  /// connection.
  bool reuse_event_channel = false;
  /// Take the connection's CQ (and receive CQ) from its Peer's spares, and give them back
  /// when the connection is released, instead of creating and destroying them per
  /// connection (an ibv_create_cq and an ibv_destroy_cq each: on Soft-RoCE a CQ's creation
  /// and destruction cost about a thirtieth of a connection's setup). Needs CQs without a
  /// completion channel (completion_channel false; else inval). A spare is a CQ of the
  /// same size (and completion vector) from a released connection that set this too, its
  /// queue pair destroyed first and its completions polled away, so a connection never
  /// sees another's completions; at most Peer::max_spare_completion_queues, destroyed
  /// with the Peer's last reference. A CQ whose polling fails is destroyed, never reused.
  /// Cq views and raw ibv_cq pointers of a released connection must not be used (as
  /// always): the queue may be a later connection's.
  bool reuse_completion_queues = false;
  /// Give the connection a protection domain of its own, on the same device, instead of
  /// its Peer's (the Endpoint's, or ConnReq::to's): isolation by protection domain. Its
  /// queue pair is created there, so a key of memory registered on any other domain (the
  /// server's Peer, another connection's) reaches nothing through this connection, and
  /// this connection's memory nothing through another's: the device refuses the access
  /// (a remote access error at the peer). Register the connection's memory on Conn::peer()
  /// (ConnReq::peer() before accepting); a region of another Peer is inval in its calls.
  /// Costs an ibv_alloc_pd and one page's ibv_reg_mr (the emulated flush's) per connection,
  /// both released with the connection's last user. A shared receive queue (srq) is on one
  /// domain: both together are inval; the spare CQs and event channels (reuse_*) are the
  /// connection's own domain's, so they are not reused across connections.
  bool own_protection_domain = false;
};

/// Options of a listening endpoint.
struct ListenOptions {
  /// Passed to rdma_listen. 0 = the kernel's default, which is also the cap
  /// (/proc/sys/net/rdma_ucm/max_backlog, 1024 by default); connection requests beyond
  /// the backlog that the application has not fetched are dropped silently by the kernel.
  int backlog = 0;
};

RPMAPP_END_NAMESPACE
