// librpma 1.2 read client, for the interop tests: the counterpart of 05-read's client,
// written against librpma's API. It takes the server's region from common_data, reads it
// with one rpma_read into its own region and prints `read: "<text>"`.
#include "librpma_common.hpp"

#include <cstring>

static constexpr size_t buffer_size = 1024;

int main(int argc, char** argv) {
  using namespace interop;
  if (!parse_args(argc, argv)) return 2;
  const char* addr = argv[1];
  const char* port = argv[2];

  rpma_peer* peer = nullptr;
  Defer peer_delete{[&] { if (peer) (void)rpma_peer_delete(&peer); }};
  if (new_peer(addr, RPMA_UTIL_IBV_CONTEXT_REMOTE, &peer) != 0) return 1;

  static char memory[buffer_size];
  rpma_mr_local* dst = nullptr;
  Defer dst_dereg{[&] { if (dst) (void)rpma_mr_dereg(&dst); }};
  if (int ret = rpma_mr_reg(peer, memory, sizeof memory, RPMA_MR_USAGE_READ_DST, &dst); ret != 0)
    return fail("rpma_mr_reg", ret);

  rpma_conn* conn = nullptr;
  Defer conn_delete{[&] { if (conn) (void)rpma_conn_delete(&conn); }};
  if (connect_with_retry(peer, addr, port, &conn) != 0) return 1;

  rpma_mr_remote* src = nullptr;
  Defer src_delete{[&] { if (src) (void)rpma_mr_remote_delete(&src); }};
  if (remote_region(conn, &src) != 0) return 1;
  size_t size = 0;
  if (int ret = rpma_mr_remote_get_size(src, &size); ret != 0) return fail("rpma_mr_remote_get_size", ret);
  if (size > sizeof memory) return fail("the server's region does not fit in the buffer");

  if (int ret = rpma_read(conn, dst, 0, src, 0, size, RPMA_F_COMPLETION_ALWAYS, nullptr); ret != 0)
    return fail("rpma_read", ret);
  if (wait_completion(conn, IBV_WC_RDMA_READ) != 0) return 1;
  if (std::memchr(memory, '\0', size) == nullptr)
    return fail("the server's region holds no NUL-terminated text");
  std::printf("read: \"%s\"\n", memory);

  if (int ret = rpma_mr_remote_delete(&src); ret != 0) return fail("rpma_mr_remote_delete", ret);
  if (disconnect(&conn) != 0) return 1;
  if (int ret = rpma_mr_dereg(&dst); ret != 0) return fail("rpma_mr_dereg", ret);
  if (int ret = rpma_peer_delete(&peer); ret != 0) return fail("rpma_peer_delete", ret);
  return 0;
}
