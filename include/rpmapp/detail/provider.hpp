// The one seam through which every librdmacm / libibverbs (and event-wait) call passes.
// Production code calls provider().<fn>; unit tests install a fake with ProviderOverride
// so that any call can fail with any errno and every created resource is counted.
#pragma once

#include <rpmapp/detail/verbs_abi.hpp>
#include <rpmapp/version.hpp>

#include <fcntl.h>
#include <infiniband/verbs.h>
#include <poll.h>
#include <pthread.h>
#include <rdma/rdma_cma.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/random.h>
#include <unistd.h>

#include <cerrno>
#include <cstddef>
#include <cstdint>

RPMAPP_BEGIN_NAMESPACE
namespace detail {

/// Whether this build's <infiniband/verbs.h> has ibv_wr_flush (rdma-core 45 on): the
/// extended QP then has a wr_flush member.
template <class QpEx>
concept has_wr_flush = requires(QpEx* qpx) { qpx->wr_flush; };
inline constexpr bool build_has_native_flush = has_wr_flush<ibv_qp_ex>;

/// Whether this build's <infiniband/verbs.h> has ibv_wr_atomic_write (rdma-core 44 on): the
/// extended QP then has a wr_atomic_write member.
template <class QpEx>
concept has_wr_atomic_write = requires(QpEx* qpx) { qpx->wr_atomic_write; };
inline constexpr bool build_has_native_atomic_write = has_wr_atomic_write<ibv_qp_ex>;

/// ibv_wr_start, ibv_wr_atomic_write, ibv_wr_complete on the QP's ibv_qp_ex; EOPNOTSUPP when
/// the build's rdma-core or the QP has no native atomic write.
template <class QpEx = ibv_qp_ex>
int post_native_atomic_write(ibv_qp* qp, std::uint64_t wr_id, unsigned send_flags,
                             std::uint32_t rkey, std::uint64_t remote_addr, const void* src8) {
  if constexpr (has_wr_atomic_write<QpEx>) {
    QpEx* qpx = ibv_qp_to_qp_ex(qp);
    if (qpx == nullptr || qpx->wr_atomic_write == nullptr) return EOPNOTSUPP;
    ibv_wr_start(qpx);
    qpx->wr_id = wr_id;
    qpx->wr_flags = send_flags;
    qpx->wr_atomic_write(qpx, rkey, remote_addr, src8);
    return ibv_wr_complete(qpx);
  } else {
    (void)qp, (void)wr_id, (void)send_flags, (void)rkey, (void)remote_addr, (void)src8;
    return EOPNOTSUPP;
  }
}

/// ibv_wr_start, ibv_wr_flush, ibv_wr_complete on the QP's ibv_qp_ex; EOPNOTSUPP when the
/// build's rdma-core or the QP has no native flush.
template <class QpEx = ibv_qp_ex>
int post_native_flush(ibv_qp* qp, std::uint64_t wr_id, unsigned send_flags, std::uint32_t rkey,
                      std::uint64_t remote_addr, std::size_t len, std::uint8_t type,
                      std::uint8_t level) {
  if constexpr (has_wr_flush<QpEx>) {
    QpEx* qpx = ibv_qp_to_qp_ex(qp);
    if (qpx == nullptr || qpx->wr_flush == nullptr) return EOPNOTSUPP;
    ibv_wr_start(qpx);
    qpx->wr_id = wr_id;
    qpx->wr_flags = send_flags;
    qpx->wr_flush(qpx, rkey, remote_addr, len, type, level);
    return ibv_wr_complete(qpx);
  } else {
    (void)qp, (void)wr_id, (void)send_flags, (void)rkey, (void)remote_addr, (void)len,
        (void)type, (void)level;
    return EOPNOTSUPP;
  }
}

struct Provider {
  // librdmacm
  rdma_event_channel* (*create_event_channel)();
  void (*destroy_event_channel)(rdma_event_channel*);
  int (*create_id)(rdma_event_channel*, rdma_cm_id**, void*, rdma_port_space);
  int (*destroy_id)(rdma_cm_id*);
  int (*bind_addr)(rdma_cm_id*, sockaddr*);
  int (*listen)(rdma_cm_id*, int backlog);
  int (*resolve_addr)(rdma_cm_id*, sockaddr* src, sockaddr* dst, int timeout_ms);
  int (*resolve_route)(rdma_cm_id*, int timeout_ms);
  int (*get_cm_event)(rdma_event_channel*, rdma_cm_event**);
  int (*ack_cm_event)(rdma_cm_event*);
  int (*migrate_id)(rdma_cm_id*, rdma_event_channel*);
  int (*create_qp)(rdma_cm_id*, ibv_pd*, ibv_qp_init_attr*);
  /// What rdma_destroy_qp does for a queue pair whose CQs the caller made: ibv_destroy_qp of
  /// id->qp, then id->qp = NULL (librdmacm's cma.c frees nothing more then), but with
  /// ibv_destroy_qp's errno value, which rdma_destroy_qp drops. Non-zero: the queue pair
  /// survives and still holds its CQs, completion channels, SRQ and PD.
  int (*destroy_qp)(rdma_cm_id*);
  int (*accept)(rdma_cm_id*, rdma_conn_param*);
  int (*reject)(rdma_cm_id*, const void* private_data, uint8_t len);
  int (*connect)(rdma_cm_id*, rdma_conn_param*);
  int (*disconnect)(rdma_cm_id*);
  /// ibv_modify_qp: 0, or an errno value (siw's provider: negated).
  int (*modify_qp)(ibv_qp*, ibv_qp_attr*, int attr_mask);
  // librdmacm's own device contexts (open for the process; the array is the caller's)
  ibv_context** (*get_devices)(int* num_devices);
  void (*free_devices)(ibv_context**);
  // libibverbs
  /// The devices present now (a removed one is no longer listed; the array is the caller's).
  ibv_device** (*get_device_list)(int* num_devices);
  void (*free_device_list)(ibv_device**);
  ibv_pd* (*alloc_pd)(ibv_context*);
  int (*dealloc_pd)(ibv_pd*);
  ibv_comp_channel* (*create_comp_channel)(ibv_context*);
  int (*destroy_comp_channel)(ibv_comp_channel*);
  ibv_cq* (*create_cq)(ibv_context*, int cqe, void* cq_context, ibv_comp_channel*, int vector);
  int (*destroy_cq)(ibv_cq*);
  int (*req_notify_cq)(ibv_cq*, int solicited_only);
  // an event channel's fd: its flags (made O_NONBLOCK), and waiting on it
  int (*fcntl)(int fd, int cmd, int arg);
  int (*poll)(pollfd*, nfds_t, int timeout_ms);
  // ---- the data path (libibverbs; static inline functions are wrapped below)
  /// Returns the errno value (0 on success).
  int (*query_device_ex)(ibv_context*, const ibv_query_device_ex_input*, ibv_device_attr_ex*);
  ibv_mr* (*reg_mr)(ibv_pd*, void* addr, size_t length, int access);
  int (*dereg_mr)(ibv_mr*);
  int (*advise_mr)(ibv_pd*, ibv_advise_mr_advice, uint32_t flags, ibv_sge*, uint32_t num_sge);
  /// rdma_create_qp_ex: used instead of create_qp for a QP with extended send operations.
  int (*create_qp_ex)(rdma_cm_id*, ibv_qp_init_attr_ex*);
  int (*post_send)(ibv_qp*, ibv_send_wr*, ibv_send_wr** bad);
  int (*post_recv)(ibv_qp*, ibv_recv_wr*, ibv_recv_wr** bad);
  int (*post_srq_recv)(ibv_srq*, ibv_recv_wr*, ibv_recv_wr** bad);
  /// A native 8-byte atomic write (ibv_wr_start, ibv_wr_atomic_write, ibv_wr_complete on
  /// the QP's ibv_qp_ex); returns ibv_wr_complete's errno value.
  int (*post_atomic_write)(ibv_qp*, uint64_t wr_id, unsigned send_flags, uint32_t rkey,
                           uint64_t remote_addr, const void* src8);
  /// A native flush of [remote_addr, +len) (ibv_wr_start, ibv_wr_flush with `type` and
  /// `level` (native_flush_abi), ibv_wr_complete); returns ibv_wr_complete's errno value.
  int (*post_flush)(ibv_qp*, uint64_t wr_id, unsigned send_flags, uint32_t rkey,
                    uint64_t remote_addr, size_t len, uint8_t type, uint8_t level);
  int (*poll_cq)(ibv_cq*, int num_entries, ibv_wc*);
  int (*get_cq_event)(ibv_comp_channel*, ibv_cq**, void** cq_context);
  void (*ack_cq_events)(ibv_cq*, unsigned int nevents);
  ibv_srq* (*create_srq)(ibv_pd*, ibv_srq_init_attr*);
  int (*destroy_srq)(ibv_srq*);
  // ---- memory windows (grants); a window is bound with post_send (IBV_WR_BIND_MW)
  ibv_mw* (*alloc_mw)(ibv_pd*, ibv_mw_type);
  /// Returns the errno value (0 on success).
  int (*dealloc_mw)(ibv_mw*);
  /// The key bytes of a grant's window (getrandom(2): -1 and errno, or the bytes written).
  ssize_t (*getrandom)(void*, size_t, unsigned int flags);
  // ---- the event loop: epoll, and an eventfd that wakes it (read/write/close are for
  // the loop's own fds only)
  int (*epoll_create1)(int flags);
  int (*epoll_ctl)(int epfd, int op, int fd, epoll_event*);
  int (*epoll_wait)(int epfd, epoll_event*, int maxevents, int timeout_ms);
  int (*eventfd)(unsigned int initval, int flags);
  ssize_t (*read)(int fd, void*, size_t);
  ssize_t (*write)(int fd, const void*, size_t);
  int (*close)(int fd);
  // ---- a thread of the library's own: EventLoop::connect's rdma_connect on iWARP, which
  // blocks in siw (pthread_create(3) without attributes: the errno value, 0 on success)
  int (*pthread_create)(pthread_t*, void* (*run)(void*), void* arg);
};

inline const Provider system_provider = {
    rdma_create_event_channel,
    rdma_destroy_event_channel,
    rdma_create_id,
    rdma_destroy_id,
    rdma_bind_addr,
    rdma_listen,
    rdma_resolve_addr,
    rdma_resolve_route,
    rdma_get_cm_event,
    rdma_ack_cm_event,
    rdma_migrate_id,
    rdma_create_qp,
    [](rdma_cm_id* id) {
      const int result = ibv_destroy_qp(id->qp);
      id->qp = nullptr;
      return result;
    },
    rdma_accept,
    rdma_reject,
    rdma_connect,
    rdma_disconnect,
    ibv_modify_qp,
    rdma_get_devices,
    rdma_free_devices,
    [](int* num_devices) { return ibv_get_device_list(num_devices); },  // a macro in some builds
    ibv_free_device_list,
    ibv_alloc_pd,
    ibv_dealloc_pd,
    ibv_create_comp_channel,
    ibv_destroy_comp_channel,
    ibv_create_cq,
    ibv_destroy_cq,
    // static inline in <infiniband/verbs.h>: wrap it to take its address
    [](ibv_cq* cq, int solicited_only) { return ibv_req_notify_cq(cq, solicited_only); },
    // variadic in <fcntl.h>: wrap it to give it a fixed signature
    [](int fd, int cmd, int arg) { return ::fcntl(fd, cmd, arg); },
    ::poll,
    [](ibv_context* c, const ibv_query_device_ex_input* in, ibv_device_attr_ex* attr) {
      return ibv_query_device_ex(c, in, attr);
    },
    // a macro in <infiniband/verbs.h>
    [](ibv_pd* pd, void* addr, size_t length, int access) {
      return ibv_reg_mr(pd, addr, length, access);
    },
    ibv_dereg_mr,
    [](ibv_pd* pd, ibv_advise_mr_advice advice, uint32_t flags, ibv_sge* sges, uint32_t n) {
      return ibv_advise_mr(pd, advice, flags, sges, n);
    },
    rdma_create_qp_ex,
    [](ibv_qp* qp, ibv_send_wr* wr, ibv_send_wr** bad) { return ibv_post_send(qp, wr, bad); },
    [](ibv_qp* qp, ibv_recv_wr* wr, ibv_recv_wr** bad) { return ibv_post_recv(qp, wr, bad); },
    [](ibv_srq* srq, ibv_recv_wr* wr, ibv_recv_wr** bad) {
      return ibv_post_srq_recv(srq, wr, bad);
    },
    post_native_atomic_write<>,
    post_native_flush<>,
    [](ibv_cq* cq, int n, ibv_wc* wc) { return ibv_poll_cq(cq, n, wc); },
    ibv_get_cq_event,
    ibv_ack_cq_events,
    ibv_create_srq,
    ibv_destroy_srq,
    // static inline in <infiniband/verbs.h>
    [](ibv_pd* pd, ibv_mw_type type) { return ibv_alloc_mw(pd, type); },
    [](ibv_mw* mw) { return ibv_dealloc_mw(mw); },
    ::getrandom,
    ::epoll_create1,
    ::epoll_ctl,
    ::epoll_wait,
    ::eventfd,
    ::read,
    ::write,
    ::close,
    [](pthread_t* thread, void* (*run)(void*), void* arg) { return ::pthread_create(thread, nullptr, run, arg); },
};

inline const Provider* current_provider = &system_provider;

inline const Provider& provider() noexcept { return *current_provider; }

/// Installs `fake` for the lifetime of the guard (tests only; not thread-safe).
class ProviderOverride {
 public:
  explicit ProviderOverride(const Provider& fake) noexcept : saved_(current_provider) {
    current_provider = &fake;
  }
  ~ProviderOverride() { current_provider = saved_; }
  ProviderOverride(const ProviderOverride&) = delete;
  ProviderOverride& operator=(const ProviderOverride&) = delete;

 private:
  const Provider* saved_;
};

}  // namespace detail
RPMAPP_END_NAMESPACE
