// What the librpma programs of the interop tests share: the private data of librpma's
// examples, bounded waits (librpma's calls block: every one here is preceded by a poll of
// its fd), a server's and a client's objects with their setup and teardown, and the
// connection steps. Written against librpma 1.2's public API only.
#pragma once

#include <librpma.h>

#include <poll.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>

namespace interop {

/// Bound of every wait, as in the examples (software RDMA on a loaded machine is slow).
inline constexpr int wait_ms = 30000;
/// How often a client tries to connect before giving up.
inline constexpr int connect_attempts = 5;

/// librpma's examples' private data (common-conn.h), declared as they declare it.
struct common_data {
  std::uint16_t data_offset;
  std::uint8_t mr_desc_size;
  std::uint8_t pcfg_desc_size;
  char descriptors[24];
};
static_assert(sizeof(common_data) == 28);

/// Runs `f` at the end of the scope (the cleanup of a librpma object).
template <class F>
struct Defer {
  F f;
  ~Defer() { f(); }
};
template <class F>
Defer(F) -> Defer<F>;

/// Prints "error: WHAT: librpma's text" and returns main's exit status.
inline int fail(const char* what, int ret) {
  std::fprintf(stderr, "error: %s: %s (%d)\n", what, rpma_err_2str(ret), ret);
  return 1;
}
inline int fail(const char* what) {
  std::fprintf(stderr, "error: %s\n", what);
  return 1;
}

/// A server's librpma objects. Each is deleted, errors ignored, at the end of the scope
/// when still there (an error path); close() is the checked way out.
struct Server {
  rpma_peer* peer = nullptr;
  rpma_mr_local* mr = nullptr;  ///< the region the client reads or writes
  rpma_ep* ep = nullptr;
  rpma_conn* conn = nullptr;

  Server() = default;
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;
  ~Server() {
    if (conn) (void)rpma_conn_delete(&conn);
    if (ep) (void)rpma_ep_shutdown(&ep);
    if (mr) (void)rpma_mr_dereg(&mr);
    if (peer) (void)rpma_peer_delete(&peer);
  }
  /// Once the connection is gone: deregisters the region, shuts the endpoint down and
  /// deletes the peer. Returns main's exit status.
  int close() {
    if (int ret = rpma_mr_dereg(&mr); ret != 0) return fail("rpma_mr_dereg", ret);
    if (int ret = rpma_ep_shutdown(&ep); ret != 0) return fail("rpma_ep_shutdown", ret);
    if (int ret = rpma_peer_delete(&peer); ret != 0) return fail("rpma_peer_delete", ret);
    return 0;
  }
};

/// A client's librpma objects, as Server's.
struct Client {
  rpma_peer* peer = nullptr;
  rpma_mr_local* mr = nullptr;        ///< its own region
  rpma_conn* conn = nullptr;
  rpma_mr_remote* remote = nullptr;  ///< the server's region

  Client() = default;
  Client(const Client&) = delete;
  Client& operator=(const Client&) = delete;
  ~Client() {
    if (remote) (void)rpma_mr_remote_delete(&remote);
    if (conn) (void)rpma_conn_delete(&conn);
    if (mr) (void)rpma_mr_dereg(&mr);
    if (peer) (void)rpma_peer_delete(&peer);
  }
  /// Deletes the server's region, disconnects (disconnect(): prints "disconnected"),
  /// deregisters its region and deletes the peer. Returns main's exit status.
  int close();
};

/// Checks `prog ADDR PORT` and sends librpma's own error messages to stderr as well (by
/// default they go to syslog only): a failed run's log then names the call inside librpma
/// that failed and its errno, not only the RPMA_E_* code.
inline bool start(int argc, char** argv) {
  (void)rpma_log_set_threshold(RPMA_LOG_THRESHOLD_AUX, RPMA_LOG_LEVEL_ERROR);
  if (argc == 3) return true;
  std::fprintf(stderr, "usage: %s ADDR PORT\n", argc > 0 ? argv[0] : "librpma");
  return false;
}

/// Waits up to wait_ms for `fd` to be readable. Returns 0, or prints why not and returns 1.
inline int wait_readable(int fd, const char* what) {
  pollfd pfd{fd, POLLIN, 0};
  for (;;) {
    const int n = poll(&pfd, 1, wait_ms);
    if (n > 0) return 0;
    if (n == 0) {
      std::fprintf(stderr, "error: no %s within %d ms\n", what, wait_ms);
      return 1;
    }
    if (errno != EINTR) {
      std::fprintf(stderr, "error: poll for %s: %s\n", what, std::strerror(errno));
      return 1;
    }
  }
}

/// A peer (protection domain) on the device of `addr`.
inline int new_peer(const char* addr, rpma_util_ibv_context_type type, rpma_peer** peer) {
  ibv_context* device = nullptr;
  if (int ret = rpma_utils_get_ibv_context(addr, type, &device); ret != 0)
    return fail("rpma_utils_get_ibv_context", ret);
  if (int ret = rpma_peer_new(device, peer); ret != 0) return fail("rpma_peer_new", ret);
  return 0;
}

/// What librpma's rpma_flush completes with on the device at `addr`: IBV_WC_FLUSH (8) where
/// librpma flushes natively (RPMA_INTEROP_NATIVE_FLUSH: 1.3 on an rdma-core with
/// ibv_wr_flush) and the device reports both flush types, as librpma 1.3's probe asks;
/// otherwise IBV_WC_RDMA_READ (its emulation).
inline int flush_completion(const char* addr, rpma_util_ibv_context_type type, ibv_wc_opcode* out) {
  *out = IBV_WC_RDMA_READ;
  if (!RPMA_INTEROP_NATIVE_FLUSH) return 0;
  ibv_context* device = nullptr;
  if (int ret = rpma_utils_get_ibv_context(addr, type, &device); ret != 0)
    return fail("rpma_utils_get_ibv_context", ret);
  ibv_device_attr_ex attr{};
  if (int err = ibv_query_device_ex(device, nullptr, &attr); err != 0) {
    std::fprintf(stderr, "error: ibv_query_device_ex: errno %d\n", err);
    return 1;
  }
  constexpr std::uint64_t both = (1ull << 38) | (1ull << 39);  // IB_UVERBS_DEVICE_FLUSH_GLOBAL, _PERSISTENT
  if ((attr.device_cap_flags_ex & both) == both) *out = static_cast<ibv_wc_opcode>(8);
  return 0;
}

/// The connection's next event, waiting at most wait_ms.
inline int next_event(rpma_conn* conn, rpma_conn_event* event) {
  int fd = -1;
  if (int ret = rpma_conn_get_event_fd(conn, &fd); ret != 0) return fail("rpma_conn_get_event_fd", ret);
  if (wait_readable(fd, "connection event") != 0) return 1;
  if (int ret = rpma_conn_next_event(conn, event); ret != 0) return fail("rpma_conn_next_event", ret);
  return 0;
}

/// Takes the next event and checks that it is `want`.
inline int expect_event(rpma_conn* conn, rpma_conn_event want) {
  rpma_conn_event event = RPMA_CONN_UNDEFINED;
  if (next_event(conn, &event) != 0) return 1;
  if (event == want) return 0;
  std::fprintf(stderr, "error: expected %s, got %s\n", rpma_utils_conn_event_2str(want),
               rpma_utils_conn_event_2str(event));
  return 1;
}

/// Opens a peer on the device of `addr` and registers `size` bytes at `ptr` there with
/// `usage` (RPMA_MR_USAGE_* bits).
inline int open_region(const char* addr, rpma_util_ibv_context_type type, void* ptr, size_t size,
                       int usage, rpma_peer** peer, rpma_mr_local** mr) {
  if (new_peer(addr, type, peer) != 0) return 1;
  if (int ret = rpma_mr_reg(*peer, ptr, size, usage, mr); ret != 0) return fail("rpma_mr_reg", ret);
  return 0;
}

/// The common_data describing `mr` (its descriptor, data at offset 0, no peer configuration).
inline int describe_region(rpma_mr_local* mr, common_data* data) {
  *data = common_data{};
  size_t desc_size = 0;
  if (int ret = rpma_mr_get_descriptor_size(mr, &desc_size); ret != 0)
    return fail("rpma_mr_get_descriptor_size", ret);
  if (desc_size > sizeof data->descriptors) return fail("the descriptor does not fit in common_data");
  data->mr_desc_size = static_cast<std::uint8_t>(desc_size);
  if (int ret = rpma_mr_get_descriptor(mr, data->descriptors); ret != 0)
    return fail("rpma_mr_get_descriptor", ret);
  return 0;
}

/// Listens on ADDR:PORT and prints "listening on ADDR port PORT" (the test runner starts
/// the client when it sees it). librpma 1.2 cannot report a port the CM chose: PORT must
/// not be 0.
inline int listen_and_print(rpma_peer* peer, const char* addr, const char* port, rpma_ep** ep) {
  if (std::strcmp(port, "0") == 0) return fail("listen: port 0 is not supported here");
  if (int ret = rpma_ep_listen(peer, addr, port, ep); ret != 0) return fail("rpma_ep_listen", ret);
  std::printf("listening on %s port %s\n", addr, port);
  std::fflush(stdout);
  return 0;
}

/// Accepts the next request on `ep` with `data` as private data and waits until the
/// connection is established.
inline int accept_with(rpma_ep* ep, const common_data& data, rpma_conn** conn) {
  int fd = -1;
  if (int ret = rpma_ep_get_fd(ep, &fd); ret != 0) return fail("rpma_ep_get_fd", ret);
  if (wait_readable(fd, "connection request") != 0) return 1;
  rpma_conn_req* req = nullptr;
  if (int ret = rpma_ep_next_conn_req(ep, nullptr, &req); ret != 0)
    return fail("rpma_ep_next_conn_req", ret);
  rpma_conn_private_data pdata{const_cast<common_data*>(&data), sizeof data};
  if (int ret = rpma_conn_req_connect(&req, &pdata, conn); ret != 0)
    return fail("rpma_conn_req_connect", ret);
  return expect_event(*conn, RPMA_CONN_ESTABLISHED);
}

/// Connects to ADDR:PORT without private data and waits until established; a request
/// that is rejected or unreachable (the server may not be ready) is retried a few times.
/// With `recv_mr`, a receive of `recv_len` bytes at `recv_offset` is posted on each request
/// before it connects (rpma_conn_req_recv), for the server's first message.
inline int connect_with_retry(rpma_peer* peer, const char* addr, const char* port, rpma_conn** conn,
                              rpma_mr_local* recv_mr = nullptr, size_t recv_offset = 0,
                              size_t recv_len = 0) {
  for (int attempt = 1;; ++attempt) {
    rpma_conn_req* req = nullptr;
    if (int ret = rpma_conn_req_new(peer, addr, port, nullptr, &req); ret != 0)
      return fail("rpma_conn_req_new", ret);
    if (recv_mr != nullptr)
      if (int ret = rpma_conn_req_recv(req, recv_mr, recv_offset, recv_len, nullptr); ret != 0) {
        (void)rpma_conn_req_delete(&req);
        return fail("rpma_conn_req_recv", ret);
      }
    if (int ret = rpma_conn_req_connect(&req, nullptr, conn); ret != 0)
      return fail("rpma_conn_req_connect", ret);
    rpma_conn_event event = RPMA_CONN_UNDEFINED;
    if (next_event(*conn, &event) != 0) return 1;
    if (event == RPMA_CONN_ESTABLISHED) return 0;
    (void)rpma_conn_delete(conn);
    const bool retry = event == RPMA_CONN_REJECTED || event == RPMA_CONN_UNREACHABLE;
    if (!retry || attempt == connect_attempts) {
      std::fprintf(stderr, "error: connection %s after %d attempt(s)\n",
                   rpma_utils_conn_event_2str(event), attempt);
      return 1;
    }
    std::printf("attempt %d: connection %s, retrying\n", attempt, rpma_utils_conn_event_2str(event));
    usleep(500 * 1000);
  }
}

/// The server's region from the connection's private data (librpma's common_data).
inline int remote_region(rpma_conn* conn, rpma_mr_remote** mr) {
  rpma_conn_private_data pdata{};
  if (int ret = rpma_conn_get_private_data(conn, &pdata); ret != 0)
    return fail("rpma_conn_get_private_data", ret);
  if (pdata.ptr == nullptr || pdata.len < sizeof(common_data))
    return fail("the server sent no common_data in its private data");
  common_data data;
  std::memcpy(&data, pdata.ptr, sizeof data);
  if (data.mr_desc_size > sizeof data.descriptors)
    return fail("the server's descriptor size exceeds common_data's descriptors");
  if (int ret = rpma_mr_remote_from_descriptor(data.descriptors, data.mr_desc_size, mr); ret != 0)
    return fail("rpma_mr_remote_from_descriptor", ret);
  return 0;
}

/// How a server takes its one client: describes its region in common_data, listens on
/// ADDR:PORT (printing the "listening on" line), accepts the first request with that
/// common_data and waits until the connection is established.
inline int listen_and_accept(Server& server, const char* addr, const char* port) {
  common_data data{};
  if (describe_region(server.mr, &data) != 0) return 1;
  if (listen_and_print(server.peer, addr, port, &server.ep) != 0) return 1;
  return accept_with(server.ep, data, &server.conn);
}

/// How a client reaches the server's region: connects (connect_with_retry), takes the
/// region from the private data and returns its size in `size`.
inline int connect_to_region(Client& client, const char* addr, const char* port, size_t* size) {
  if (connect_with_retry(client.peer, addr, port, &client.conn) != 0) return 1;
  if (remote_region(client.conn, &client.remote) != 0) return 1;
  if (int ret = rpma_mr_remote_get_size(client.remote, size); ret != 0)
    return fail("rpma_mr_remote_get_size", ret);
  return 0;
}

/// Takes the next completion of the connection's CQ, into `wc`, whatever its status: one
/// already there, else waits (at most wait_ms for each event). The queue is polled before
/// each wait: one event may stand for several completions (a send's and a receive's that
/// came together), and waiting for another before taking the second would never end.
inline int next_completion(rpma_conn* conn, ibv_wc* wc) {
  rpma_cq* cq = nullptr;
  if (int ret = rpma_conn_get_cq(conn, &cq); ret != 0) return fail("rpma_conn_get_cq", ret);
  int fd = -1;
  if (int ret = rpma_cq_get_fd(cq, &fd); ret != 0) return fail("rpma_cq_get_fd", ret);
  for (;;) {
    const int ret = rpma_cq_get_wc(cq, 1, wc, nullptr);
    if (ret == 0) return 0;
    if (ret != RPMA_E_NO_COMPLETION) return fail("rpma_cq_get_wc", ret);
    if (wait_readable(fd, "completion") != 0) return 1;
    if (int waited = rpma_cq_wait(cq); waited != 0) return fail("rpma_cq_wait", waited);  // acks, re-arms
  }
}

/// Waits (at most wait_ms) for the completion of the connection's one signaled operation
/// and checks its status and opcode.
inline int wait_completion(rpma_conn* conn, ibv_wc_opcode want) {
  ibv_wc wc{};
  if (next_completion(conn, &wc) != 0) return 1;
  if (wc.status != IBV_WC_SUCCESS) {
    std::fprintf(stderr, "error: work completion failed: %s\n", ibv_wc_status_str(wc.status));
    return 1;
  }
  if (wc.opcode != want) {
    std::fprintf(stderr, "error: completion opcode %d, expected %d\n", int(wc.opcode), int(want));
    return 1;
  }
  return 0;
}

/// How a client ends: disconnects, waits for closed, deletes the connection.
inline int disconnect(rpma_conn** conn) {
  if (int ret = rpma_conn_disconnect(*conn); ret != 0) return fail("rpma_conn_disconnect", ret);
  if (expect_event(*conn, RPMA_CONN_CLOSED) != 0) return 1;
  if (int ret = rpma_conn_delete(conn); ret != 0) return fail("rpma_conn_delete", ret);
  std::printf("disconnected\n");
  return 0;
}

/// How a server ends a connection: waits until the client has disconnected, disconnects
/// its side and deletes the connection.
inline int wait_closed(rpma_conn** conn) {
  if (expect_event(*conn, RPMA_CONN_CLOSED) != 0) return 1;
  std::printf("connection closed by the client\n");
  if (int ret = rpma_conn_disconnect(*conn); ret != 0) return fail("rpma_conn_disconnect", ret);
  if (int ret = rpma_conn_delete(conn); ret != 0) return fail("rpma_conn_delete", ret);
  return 0;
}

inline int Client::close() {
  if (int ret = rpma_mr_remote_delete(&remote); ret != 0) return fail("rpma_mr_remote_delete", ret);
  if (disconnect(&conn) != 0) return 1;
  if (int ret = rpma_mr_dereg(&mr); ret != 0) return fail("rpma_mr_dereg", ret);
  if (int ret = rpma_peer_delete(&peer); ret != 0) return fail("rpma_peer_delete", ret);
  return 0;
}

}  // namespace interop
