// librpma 1.2 write client, for the interop tests: it takes the server's region from
// common_data, writes a NUL-terminated text to its start (rpma_write, then rpma_flush to
// visibility, whose completion says both are done), prints `wrote: "<text>"` and
// disconnects.
#include "librpma_common.hpp"

#include <cstring>

static const char text[] = "Written by the librpma write client";

int main(int argc, char** argv) {
  using namespace interop;
  if (!parse_args(argc, argv)) return 2;
  const char* addr = argv[1];
  const char* port = argv[2];

  rpma_peer* peer = nullptr;
  Defer peer_delete{[&] { if (peer) (void)rpma_peer_delete(&peer); }};
  if (new_peer(addr, RPMA_UTIL_IBV_CONTEXT_REMOTE, &peer) != 0) return 1;

  static char memory[sizeof text];
  std::memcpy(memory, text, sizeof text);
  rpma_mr_local* src = nullptr;
  Defer src_dereg{[&] { if (src) (void)rpma_mr_dereg(&src); }};
  if (int ret = rpma_mr_reg(peer, memory, sizeof memory, RPMA_MR_USAGE_WRITE_SRC, &src); ret != 0)
    return fail("rpma_mr_reg", ret);

  rpma_conn* conn = nullptr;
  Defer conn_delete{[&] { if (conn) (void)rpma_conn_delete(&conn); }};
  if (connect_with_retry(peer, addr, port, &conn) != 0) return 1;

  rpma_mr_remote* dst = nullptr;
  Defer dst_delete{[&] { if (dst) (void)rpma_mr_remote_delete(&dst); }};
  if (remote_region(conn, &dst) != 0) return 1;
  size_t size = 0;
  if (int ret = rpma_mr_remote_get_size(dst, &size); ret != 0) return fail("rpma_mr_remote_get_size", ret);
  if (size < sizeof memory) return fail("the server's region is too small for the text");

  if (int ret = rpma_write(conn, dst, 0, src, 0, sizeof memory, RPMA_F_COMPLETION_ON_ERROR, nullptr);
      ret != 0)
    return fail("rpma_write", ret);
  if (int ret = rpma_flush(conn, dst, 0, sizeof memory, RPMA_FLUSH_TYPE_VISIBILITY,
                           RPMA_F_COMPLETION_ALWAYS, nullptr);
      ret != 0)
    return fail("rpma_flush", ret);
  // librpma 1.2 flushes with an RDMA READ.
  if (wait_completion(conn, IBV_WC_RDMA_READ) != 0) return 1;
  std::printf("wrote: \"%s\"\n", memory);

  if (int ret = rpma_mr_remote_delete(&dst); ret != 0) return fail("rpma_mr_remote_delete", ret);
  if (disconnect(&conn) != 0) return 1;
  if (int ret = rpma_mr_dereg(&src); ret != 0) return fail("rpma_mr_dereg", ret);
  if (int ret = rpma_peer_delete(&peer); ret != 0) return fail("rpma_peer_delete", ret);
  return 0;
}
