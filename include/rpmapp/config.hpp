// Plain configuration values for endpoints and connections.
#pragma once

#include <rpmapp/version.hpp>

#include <chrono>
#include <cstdint>

RPMAPP_BEGIN_NAMESPACE

/// Queue pair, completion queue and connection parameters of one connection
/// (librpma's rpma_conn_cfg, plus the retry counts librpma hard-codes).
/// A value type; validated when used (ConnReq::to, Endpoint::next_conn_req).
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
};

/// Options of a listening endpoint.
struct ListenOptions {
  /// Passed to rdma_listen. 0 = the kernel's default, which is also the cap
  /// (/proc/sys/net/rdma_ucm/max_backlog, 1024 by default); connection requests beyond
  /// the backlog that the application has not fetched are dropped silently by the kernel.
  int backlog = 0;
};

RPMAPP_END_NAMESPACE
