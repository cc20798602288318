// Benchmark 5 (compile cost): the same work as rpmapp_tu.cpp with librpma 1.2 and
// <rdma/rdma_cma.h>, compiled with the same compiler and flags.
#include <librpma.h>
#include <rdma/rdma_cma.h>

int listen_and_connect(const char* ip, const char* port) {
  ibv_context* ctx = nullptr;
  if (rpma_utils_get_ibv_context(ip, RPMA_UTIL_IBV_CONTEXT_LOCAL, &ctx)) return 1;
  rpma_peer* peer = nullptr;
  if (rpma_peer_new(ctx, &peer)) return 1;
  rpma_ep* ep = nullptr;
  if (rpma_ep_listen(peer, ip, "0", &ep)) return 2;
  rpma_conn_req* req = nullptr;
  if (rpma_conn_req_new(peer, ip, port, nullptr, &req)) return 3;
  rpma_conn* conn = nullptr;
  if (rpma_conn_req_connect(&req, nullptr, &conn)) return 4;
  rpma_conn_event ev{};
  if (rpma_conn_next_event(conn, &ev) || ev != RPMA_CONN_ESTABLISHED) return 5;
  if (rpma_conn_disconnect(conn)) return 6;
  if (rpma_conn_delete(&conn)) return 7;
  if (rpma_ep_shutdown(&ep)) return 8;
  return rpma_peer_delete(&peer) ? 9 : 0;
}
