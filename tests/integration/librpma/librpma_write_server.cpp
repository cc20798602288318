// librpma 1.2 write server, for the interop tests: it exposes a zeroed region as a write
// destination (flushable to visibility) in common_data, waits for the client to write a
// NUL-terminated text and disconnect, and then prints `written: "<text>"`.
#include "librpma_common.hpp"

#include <cstring>

static constexpr size_t buffer_size = 1024;

int main(int argc, char** argv) {
  using namespace interop;
  if (!start(argc, argv)) return 2;
  const char* addr = argv[1];
  const char* port = argv[2];

  static char memory[buffer_size];
  Server server;
  if (open_region(addr, RPMA_UTIL_IBV_CONTEXT_LOCAL, memory, sizeof memory,
                  RPMA_MR_USAGE_WRITE_DST | RPMA_MR_USAGE_FLUSH_TYPE_VISIBILITY, &server.peer,
                  &server.mr) != 0)
    return 1;

  if (listen_and_accept(server, addr, port) != 0) return 1;
  std::printf("connection established: the client may write %zu bytes\n", sizeof memory);
  if (wait_closed(&server.conn) != 0) return 1;

  // The client's write and flush completed before it disconnected.
  if (std::memchr(memory, '\0', sizeof memory) == nullptr)
    return fail("the region holds no NUL-terminated text");
  std::printf("written: \"%s\"\n", memory);

  return server.close();
}
