// librpma 1.2 read server, for the interop tests: the counterpart of 05-read's server,
// written against librpma's API. It registers a region holding a NUL-terminated text as a
// read source, accepts with its descriptor in common_data and waits for the client to
// disconnect.
#include "librpma_common.hpp"

#include <cstring>

static const char text[] = "Hello from the librpma read server!";

int main(int argc, char** argv) {
  using namespace interop;
  if (!parse_args(argc, argv)) return 2;
  const char* addr = argv[1];
  const char* port = argv[2];

  rpma_peer* peer = nullptr;
  Defer peer_delete{[&] { if (peer) (void)rpma_peer_delete(&peer); }};
  if (new_peer(addr, RPMA_UTIL_IBV_CONTEXT_LOCAL, &peer) != 0) return 1;

  static char memory[sizeof text];
  std::memcpy(memory, text, sizeof text);
  rpma_mr_local* mr = nullptr;
  Defer mr_dereg{[&] { if (mr) (void)rpma_mr_dereg(&mr); }};
  if (int ret = rpma_mr_reg(peer, memory, sizeof memory, RPMA_MR_USAGE_READ_SRC, &mr); ret != 0)
    return fail("rpma_mr_reg", ret);

  common_data data{};
  size_t desc_size = 0;
  if (int ret = rpma_mr_get_descriptor_size(mr, &desc_size); ret != 0)
    return fail("rpma_mr_get_descriptor_size", ret);
  if (desc_size > sizeof data.descriptors) return fail("the descriptor does not fit in common_data");
  data.mr_desc_size = static_cast<std::uint8_t>(desc_size);
  if (int ret = rpma_mr_get_descriptor(mr, data.descriptors); ret != 0)
    return fail("rpma_mr_get_descriptor", ret);

  rpma_ep* ep = nullptr;
  Defer ep_shutdown{[&] { if (ep) (void)rpma_ep_shutdown(&ep); }};
  if (listen_and_print(peer, addr, port, &ep) != 0) return 1;

  rpma_conn* conn = nullptr;
  Defer conn_delete{[&] { if (conn) (void)rpma_conn_delete(&conn); }};
  if (accept_with(ep, data, &conn) != 0) return 1;
  std::printf("connection established: the client may read %zu bytes\n", sizeof memory);
  if (wait_closed(&conn) != 0) return 1;

  if (int ret = rpma_mr_dereg(&mr); ret != 0) return fail("rpma_mr_dereg", ret);
  if (int ret = rpma_ep_shutdown(&ep); ret != 0) return fail("rpma_ep_shutdown", ret);
  if (int ret = rpma_peer_delete(&peer); ret != 0) return fail("rpma_peer_delete", ret);
  return 0;
}
