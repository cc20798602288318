// librpma write client (1.2 or 1.3), for the interop tests: it takes the server's region from
// common_data, writes a NUL-terminated text to its start (rpma_write, then rpma_flush to
// visibility, whose completion says both are done), prints `wrote: "<text>"` and
// disconnects.
#include "librpma_common.hpp"

#include <cstring>

static const char text[] = "Written by the librpma write client";

int main(int argc, char** argv) {
  using namespace interop;
  if (!start(argc, argv)) return 2;
  const char* addr = argv[1];
  const char* port = argv[2];

  static char memory[sizeof text];
  std::memcpy(memory, text, sizeof text);
  Client client;
  if (open_region(addr, RPMA_UTIL_IBV_CONTEXT_REMOTE, memory, sizeof memory, RPMA_MR_USAGE_WRITE_SRC,
                  &client.peer, &client.mr) != 0)
    return 1;

  size_t size = 0;
  if (connect_to_region(client, addr, port, &size) != 0) return 1;
  if (size < sizeof memory) return fail("the server's region is too small for the text");

  if (int ret = rpma_write(client.conn, client.remote, 0, client.mr, 0, sizeof memory,
                           RPMA_F_COMPLETION_ON_ERROR, nullptr);
      ret != 0)
    return fail("rpma_write", ret);
  if (int ret = rpma_flush(client.conn, client.remote, 0, sizeof memory, RPMA_FLUSH_TYPE_VISIBILITY,
                           RPMA_F_COMPLETION_ALWAYS, nullptr);
      ret != 0)
    return fail("rpma_flush", ret);
  // librpma 1.2 flushes with an RDMA READ; 1.3 natively where the device can.
  ibv_wc_opcode flushed = IBV_WC_RDMA_READ;
  if (flush_completion(addr, RPMA_UTIL_IBV_CONTEXT_REMOTE, &flushed) != 0) return 1;
  if (wait_completion(client.conn, flushed) != 0) return 1;
  std::printf("wrote: \"%s\" (flush %s)\n", memory, flushed == IBV_WC_RDMA_READ ? "emulated" : "native");

  return client.close();
}
