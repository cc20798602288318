// Shared by the bench programs: failing loudly, timing, and running the three
// implementations interleaved rep by rep with a rotating order.
//
// Every program prints one line per measured repetition:
//   R <tab> bench <tab> param <tab> metric <tab> variant <tab> rep <tab> value
// bench/report.py pairs the variants rep by rep and computes medians and ratios.
#pragma once

#include <rpmapp/rpmapp.hpp>

#include <fcntl.h>
#include <poll.h>
#include <rdma/rdma_cma.h>

#include <array>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <utility>
#include <vector>

namespace bench {

// IBV_ACCESS_LOCAL_WRITE as an int: verbs.h's ibv_reg_mr macro ands its access argument with
// an enumerator of another enum (IBV_ACCESS_OPTIONAL_RANGE), which C++20 deprecates for two
// enumerators (clang 22 refuses it under -Werror).
inline constexpr int local_write = IBV_ACCESS_LOCAL_WRITE;

[[noreturn]] inline void die(const char* what, const std::string& why) {
  std::fprintf(stderr, "bench: %s: %s\n", what, why.c_str());
  std::exit(1);
}

/// Unwraps an rpmapp::expected or exits with its message.
template <class E> decltype(auto) must(E&& e, const char* what) {
  if (!e) die(what, e.error().message());
  if constexpr (std::is_void_v<typename std::remove_cvref_t<E>::value_type>)
    return;
  else
    return std::move(*e);
}

/// Queue pair attributes used by the raw and the hand-written (bench_instr) implementations
/// (as rpmapp and librpma: sq 10, rq 10, one SGE, 8 bytes inline, RC).
inline ibv_qp_init_attr raw_qp_attr(ibv_cq* cq) {
  ibv_qp_init_attr attr{};
  attr.send_cq = cq;
  attr.recv_cq = cq;
  attr.cap.max_send_wr = 10;
  attr.cap.max_recv_wr = 10;
  attr.cap.max_send_sge = 1;
  attr.cap.max_recv_sge = 1;
  attr.cap.max_inline_data = 8;
  attr.qp_type = IBV_QPT_RC;
  return attr;
}

/// A CQ and a QP kept across connections (bench_connect pool): made once with raw verbs
/// (not rdma_create_qp, so rdma_cm leaves their states to the caller), driven through
/// INIT, RTR and RTS with rdma_init_qp_attr for each connection, and back to RESET after.
struct PooledQueues {
  ibv_cq* cq = nullptr;
  ibv_qp* qp = nullptr;
};

inline PooledQueues make_pooled_queues(ibv_context* ctx, ibv_pd* pd) {
  PooledQueues q;
  q.cq = ibv_create_cq(ctx, 10, nullptr, nullptr, 0);
  if (q.cq == nullptr) die("ibv_create_cq", std::strerror(errno));
  ibv_qp_init_attr attr = raw_qp_attr(q.cq);
  q.qp = ibv_create_qp(pd, &attr);
  if (q.qp == nullptr) die("ibv_create_qp", std::strerror(errno));
  return q;
}

inline void free_pooled_queues(PooledQueues q) {
  if (ibv_destroy_qp(q.qp) != 0 || ibv_destroy_cq(q.cq) != 0) die("ibv_destroy_qp/cq", std::strerror(errno));
}

/// The QP of `id`'s connection into `state`, with the attributes rdma_cm gives for it.
inline void move_qp(rdma_cm_id* id, ibv_qp* qp, ibv_qp_state state) {
  ibv_qp_attr attr{};
  int mask = 0;
  attr.qp_state = state;
  if (rdma_init_qp_attr(id, &attr, &mask) != 0)
    die("rdma_init_qp_attr", std::to_string(state) + ": " + std::strerror(errno));
  if (ibv_modify_qp(qp, &attr, mask) != 0) die("ibv_modify_qp", std::strerror(errno));
}

/// Back to RESET for the next connection (its work requests and completions dropped).
inline void reset_qp(const PooledQueues& q) {
  ibv_qp_attr attr{};
  attr.qp_state = IBV_QPS_RESET;
  if (ibv_modify_qp(q.qp, &attr, IBV_QP_STATE) != 0) die("ibv_modify_qp RESET", std::strerror(errno));
  ibv_wc wc[4];
  while (ibv_poll_cq(q.cq, 4, wc) > 0) {
  }
}

inline rdma_conn_param raw_conn_param() {
  rdma_conn_param p{};
  p.responder_resources = RDMA_MAX_RESP_RES;
  p.initiator_depth = RDMA_MAX_INIT_DEPTH;
  p.flow_control = 1;
  p.retry_count = 6;
  p.rnr_retry_count = 7;
  return p;
}

/// For C calls returning 0 on success (librpma codes, librdmacm -1 + errno).
inline void check(int rc, const char* what) {
  if (rc != 0) die(what, "rc " + std::to_string(rc) + ", errno " + std::strerror(errno));
}
template <class P> P* check_ptr(P* p, const char* what) {
  if (p == nullptr) die(what, std::string("null, errno ") + std::strerror(errno));
  return p;
}

inline void set_nonblocking(int fd) {
  int flags = fcntl(fd, F_GETFL);
  if (flags < 0 || fcntl(fd, F_SETFL, flags | O_NONBLOCK) != 0) die("fcntl", std::strerror(errno));
}

inline bool readable(int fd) {
  pollfd p{fd, POLLIN, 0};
  return ::poll(&p, 1, 0) > 0;
}

inline double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

inline const char* env_or(const char* name, const char* fallback) {
  const char* v = std::getenv(name);
  return v && *v ? v : fallback;
}

inline constexpr std::array<const char*, 3> variants = {"rpmapp", "librpma", "raw"};
/// The data-path benchmark's third implementation: verbs written by hand.
inline constexpr std::array<const char*, 3> data_variants = {"rpmapp", "librpma", "hand"};

/// Runs one warm-up round (not reported), then `reps` rounds; in round i the N variants
/// run in the order i, i+1, ..., i+N-1 (mod N), back to back. Each function returns the
/// value of one repetition (e.g. ns per cycle) and is printed as an R line with its name.
inline void interleave_named(const char* bench, const std::string& param, const char* metric, int reps,
                             const std::vector<std::pair<std::string, std::function<double()>>>& run) {
  for (auto& [name, f] : run) (void)f();
  const int n = static_cast<int>(run.size());
  for (int rep = 0; rep < reps; ++rep) {
    for (int k = 0; k < n; ++k) {
      const auto& [name, f] = run[static_cast<std::size_t>((rep + k) % n)];
      const double value = f();
      std::printf("R\t%s\t%s\t%s\t%s\t%d\t%.6g\n", bench, param.c_str(), metric, name.c_str(), rep,
                  value);
      std::fflush(stdout);
    }
  }
}

/// interleave_named for the three implementations (rpmapp, librpma, raw or hand).
inline void interleave(const char* bench, const std::string& param, const char* metric, int reps,
                       const std::array<std::function<double()>, 3>& run,
                       const std::array<const char*, 3>& names = variants) {
  std::vector<std::pair<std::string, std::function<double()>>> named;
  for (std::size_t i = 0; i < run.size(); ++i) named.emplace_back(names[i], run[i]);
  interleave_named(bench, param, metric, reps, named);
}

}  // namespace bench
