// librpma grant client, for the interop tests (its server is rpmapp_grant_server): written
// against librpma's API, it takes the grant's descriptor from the server's first message
// (rpma_mr_remote_from_descriptor, unchanged), reads the server's text through it, writes
// its own at the server's write offset, and tells the server in a message. Once the server
// says it revoked the grant, a read through the same descriptor must fail with a remote
// access error. Prints `read: "<text>"`, then `after revocation: remote access error`.
// On iWARP the responder answers a bad key with a TERMINATE message and siw then ends the
// connection: the read is flushed instead (`after revocation: flushed, the connection
// terminated (iWARP)`).
#include "librpma_common.hpp"

#include <cstring>

static constexpr size_t buffer_size = 1024;
static constexpr size_t descriptor_size = 21;      // librpma's descriptor
static constexpr size_t descriptor_offset = 512;   // where the server's first message lands
static constexpr size_t note_offset = 600;         // this client's note to the server
static constexpr size_t revoked_offset = 640;      // where the server's second message lands
static constexpr size_t write_src_offset = 256;    // what this client writes, from
static constexpr size_t server_write_offset = 512;  // to (rpmapp_grant_server's write_offset)
static constexpr char written[] = "Written by the librpma grant client";

int main(int argc, char** argv) {
  using namespace interop;
  if (!start(argc, argv)) return 2;
  const char* addr = argv[1];
  const char* port = argv[2];

  static char memory[buffer_size];
  Client client;
  if (open_region(addr, RPMA_UTIL_IBV_CONTEXT_REMOTE, memory, sizeof memory,
                  RPMA_MR_USAGE_READ_DST | RPMA_MR_USAGE_WRITE_SRC | RPMA_MR_USAGE_SEND | RPMA_MR_USAGE_RECV,
                  &client.peer, &client.mr) != 0)
    return 1;
  if (connect_with_retry(client.peer, addr, port, &client.conn, client.mr, descriptor_offset,
                         descriptor_size) != 0)
    return 1;
  if (wait_completion(client.conn, IBV_WC_RECV) != 0) return 1;
  if (int ret = rpma_mr_remote_from_descriptor(memory + descriptor_offset, descriptor_size, &client.remote);
      ret != 0)
    return fail("rpma_mr_remote_from_descriptor", ret);

  // read the server's text (the start of the granted region)
  if (int ret = rpma_read(client.conn, client.mr, 0, client.remote, 0, 64, RPMA_F_COMPLETION_ALWAYS, nullptr);
      ret != 0)
    return fail("rpma_read", ret);
  if (wait_completion(client.conn, IBV_WC_RDMA_READ) != 0) return 1;
  if (std::memchr(memory, '\0', 64) == nullptr) return fail("the server's region holds no NUL-terminated text");
  std::printf("read: \"%s\"\n", memory);

  // write this client's text into the granted region
  std::memcpy(memory + write_src_offset, written, sizeof written);
  if (int ret = rpma_write(client.conn, client.remote, server_write_offset, client.mr, write_src_offset,
                           sizeof written, RPMA_F_COMPLETION_ALWAYS, nullptr);
      ret != 0)
    return fail("rpma_write", ret);
  if (wait_completion(client.conn, IBV_WC_RDMA_WRITE) != 0) return 1;

  // the receive for the server's "revoked", then the note that the write is done
  if (int ret = rpma_recv(client.conn, client.mr, revoked_offset, 16, nullptr); ret != 0)
    return fail("rpma_recv", ret);
  if (int ret = rpma_send(client.conn, client.mr, note_offset, 1, RPMA_F_COMPLETION_ALWAYS, nullptr); ret != 0)
    return fail("rpma_send", ret);
  if (wait_completion(client.conn, IBV_WC_SEND) != 0) return 1;
  if (wait_completion(client.conn, IBV_WC_RECV) != 0) return 1;

  // the same descriptor after the revocation
  if (int ret = rpma_read(client.conn, client.mr, 0, client.remote, 0, 8, RPMA_F_COMPLETION_ALWAYS, nullptr);
      ret != 0)
    return fail("rpma_read", ret);
  ibv_wc wc{};
  if (next_completion(client.conn, &wc) != 0) return 1;
  ibv_context* device = nullptr;
  if (int ret = rpma_utils_get_ibv_context(addr, RPMA_UTIL_IBV_CONTEXT_REMOTE, &device); ret != 0)
    return fail("rpma_utils_get_ibv_context", ret);
  const bool iwarp = device->device->transport_type == IBV_TRANSPORT_IWARP;
  const ibv_wc_status want = iwarp ? IBV_WC_WR_FLUSH_ERR : IBV_WC_REM_ACCESS_ERR;
  if (wc.status != want) {
    std::fprintf(stderr, "error: a read through the revoked grant completed with %s, not %s\n",
                 ibv_wc_status_str(wc.status), ibv_wc_status_str(want));
    return 1;
  }
  std::printf(iwarp ? "after revocation: flushed, the connection terminated (iWARP)\n"
                    : "after revocation: remote access error\n");

  return client.close();
}
