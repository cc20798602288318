// Benchmark 1's per-call breakdown: where a listen + shutdown cycle spends its time, call by
// call, for rpmapp, librpma and raw librdmacm alike.
//
// This header defines, in the executable that includes it (exactly one: bench_listen), the
// librdmacm functions a listen + shutdown cycle calls, and poll. The dynamic linker binds
// librpma.so's calls to the executable's definitions first (ELF interposition), and
// rpmapp's default provider and the raw code call them directly, so all three go through
// the same wrappers. Each wrapper calls the real function (dlsym RTLD_NEXT) and, while
// `listen_calls::timing` is on, adds its wall time and count to its call's row.
#pragma once

#include <dlfcn.h>
#include <poll.h>
#include <rdma/rdma_cma.h>

#include <array>
#include <chrono>
#include <cstdio>
#include <cstdlib>

namespace listen_calls {

enum Call {
  create_event_channel,
  create_id,
  getaddrinfo,
  freeaddrinfo,
  bind_addr,
  listen,
  get_cm_event,
  ack_cm_event,
  reject,
  destroy_id,
  destroy_event_channel,
  poll_call,
  call_count
};

inline constexpr std::array<const char*, call_count> names = {
    "rdma_create_event_channel", "rdma_create_id", "rdma_getaddrinfo", "rdma_freeaddrinfo",
    "rdma_bind_addr", "rdma_listen", "rdma_get_cm_event", "rdma_ack_cm_event", "rdma_reject",
    "rdma_destroy_id", "rdma_destroy_event_channel", "poll"};

struct Row {
  double ns = 0;
  long count = 0;
};

inline bool timing = false;
inline std::array<Row, call_count> rows{};

inline void reset() { rows = {}; }

/// The next definition of `name` after this executable's: the library's own.
template <class F> F real(const char* name) {
  void* f = dlsym(RTLD_NEXT, name);
  if (f == nullptr) {
    std::fprintf(stderr, "bench: dlsym(RTLD_NEXT, %s) found nothing\n", name);
    std::exit(1);
  }
  return reinterpret_cast<F>(f);
}

/// Times one call into its row while `timing` is on (clock reads leave errno alone).
class Timed {
 public:
  explicit Timed(Call call) noexcept : call_(call) {
    if (timing) start_ = std::chrono::steady_clock::now();
  }
  ~Timed() {
    if (!timing) return;
    rows[call_].ns += std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - start_).count();
    ++rows[call_].count;
  }
  Timed(const Timed&) = delete;
  Timed& operator=(const Timed&) = delete;

 private:
  Call call_;
  std::chrono::steady_clock::time_point start_{};
};

}  // namespace listen_calls

#define LISTEN_CALLS_WRAP(ret, fn, call, params, args)                          \
  extern "C" ret fn params {                                                    \
    static const auto next = listen_calls::real<ret(*) params>(#fn);            \
    listen_calls::Timed timed(listen_calls::call);                              \
    return next args;                                                           \
  }

LISTEN_CALLS_WRAP(rdma_event_channel*, rdma_create_event_channel, create_event_channel, (void), ())
LISTEN_CALLS_WRAP(int, rdma_create_id, create_id,
                  (rdma_event_channel * channel, rdma_cm_id** id, void* context, rdma_port_space ps),
                  (channel, id, context, ps))
LISTEN_CALLS_WRAP(int, rdma_getaddrinfo, getaddrinfo,
                  (const char* node, const char* service, const rdma_addrinfo* hints, rdma_addrinfo** res),
                  (node, service, hints, res))
LISTEN_CALLS_WRAP(void, rdma_freeaddrinfo, freeaddrinfo, (rdma_addrinfo * res), (res))
LISTEN_CALLS_WRAP(int, rdma_bind_addr, bind_addr, (rdma_cm_id * id, sockaddr* addr), (id, addr))
LISTEN_CALLS_WRAP(int, rdma_listen, listen, (rdma_cm_id * id, int backlog), (id, backlog))
LISTEN_CALLS_WRAP(int, rdma_get_cm_event, get_cm_event, (rdma_event_channel * channel, rdma_cm_event** event),
                  (channel, event))
LISTEN_CALLS_WRAP(int, rdma_ack_cm_event, ack_cm_event, (rdma_cm_event * event), (event))
LISTEN_CALLS_WRAP(int, rdma_reject, reject, (rdma_cm_id * id, const void* data, uint8_t len), (id, data, len))
LISTEN_CALLS_WRAP(int, rdma_destroy_id, destroy_id, (rdma_cm_id * id), (id))
LISTEN_CALLS_WRAP(void, rdma_destroy_event_channel, destroy_event_channel, (rdma_event_channel * channel),
                  (channel))
LISTEN_CALLS_WRAP(int, poll, poll_call, (pollfd * fds, nfds_t n, int timeout), (fds, n, timeout))

#undef LISTEN_CALLS_WRAP
