// librpma 1.2 read server, for the interop tests: the counterpart of 05-read's server,
// written against librpma's API. It registers a region holding a NUL-terminated text as a
// read source, accepts with its descriptor in common_data and waits for the client to
// disconnect.
#include "librpma_common.hpp"

#include <cstring>

static const char text[] = "Hello from the librpma read server!";

int main(int argc, char** argv) {
  using namespace interop;
  if (!start(argc, argv)) return 2;
  const char* addr = argv[1];
  const char* port = argv[2];

  static char memory[sizeof text];
  std::memcpy(memory, text, sizeof text);
  Server server;
  if (open_region(addr, RPMA_UTIL_IBV_CONTEXT_LOCAL, memory, sizeof memory, RPMA_MR_USAGE_READ_SRC,
                  &server.peer, &server.mr) != 0)
    return 1;

  if (listen_and_accept(server, addr, port) != 0) return 1;
  std::printf("connection established: the client may read %zu bytes\n", sizeof memory);
  if (wait_closed(&server.conn) != 0) return 1;

  return server.close();
}
