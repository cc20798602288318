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
  /// Transport retries before the QP reports an error, 0..7. The default is 6, not
  /// librpma's 7: on rxe (and per IBTA) 7 means "retry forever", so a vanished peer would
  /// never be detected; with 6 the sender sees a retry-exceeded error (about 15 s on rxe).
  std::uint8_t retry_count = 6;
  /// Receiver-not-ready retries, 0..7; 7 = retry forever (the usual choice, as librpma).
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
