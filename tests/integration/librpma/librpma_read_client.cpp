// librpma 1.2 read client, for the interop tests: the counterpart of 05-read's client,
// written against librpma's API. It takes the server's region from common_data, reads it
// with one rpma_read into its own region and prints `read: "<text>"`.
#include "librpma_common.hpp"

#include <cstring>

static constexpr size_t buffer_size = 1024;

int main(int argc, char** argv) {
  using namespace interop;
  if (!start(argc, argv)) return 2;
  const char* addr = argv[1];
  const char* port = argv[2];

  static char memory[buffer_size];
  Client client;
  if (open_region(addr, RPMA_UTIL_IBV_CONTEXT_REMOTE, memory, sizeof memory, RPMA_MR_USAGE_READ_DST,
                  &client.peer, &client.mr) != 0)
    return 1;

  size_t size = 0;
  if (connect_to_region(client, addr, port, &size) != 0) return 1;
  if (size > sizeof memory) return fail("the server's region does not fit in the buffer");

  if (int ret = rpma_read(client.conn, client.mr, 0, client.remote, 0, size, RPMA_F_COMPLETION_ALWAYS,
                          nullptr);
      ret != 0)
    return fail("rpma_read", ret);
  if (wait_completion(client.conn, IBV_WC_RDMA_READ) != 0) return 1;
  if (std::memchr(memory, '\0', size) == nullptr)
    return fail("the server's region holds no NUL-terminated text");
  std::printf("read: \"%s\"\n", memory);

  return client.close();
}
