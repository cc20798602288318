// The one seam through which every librdmacm / libibverbs (and event-wait) call passes.
// Production code calls provider().<fn>; unit tests install a fake with ProviderOverride
// so that any call can fail with any errno and every created resource is counted.
#pragma once

#include <rpmapp/version.hpp>

#include <fcntl.h>
#include <infiniband/verbs.h>
#include <poll.h>
#include <rdma/rdma_cma.h>

RPMAPP_BEGIN_NAMESPACE
namespace detail {

struct Provider {
  // librdmacm
  rdma_event_channel* (*create_event_channel)();
  void (*destroy_event_channel)(rdma_event_channel*);
  int (*create_id)(rdma_event_channel*, rdma_cm_id**, void*, rdma_port_space);
  int (*destroy_id)(rdma_cm_id*);
  int (*getaddrinfo)(const char*, const char*, const rdma_addrinfo*, rdma_addrinfo**);
  void (*freeaddrinfo)(rdma_addrinfo*);
  int (*bind_addr)(rdma_cm_id*, sockaddr*);
  int (*listen)(rdma_cm_id*, int backlog);
  int (*resolve_addr)(rdma_cm_id*, sockaddr* src, sockaddr* dst, int timeout_ms);
  int (*resolve_route)(rdma_cm_id*, int timeout_ms);
  int (*get_cm_event)(rdma_event_channel*, rdma_cm_event**);
  int (*ack_cm_event)(rdma_cm_event*);
  int (*migrate_id)(rdma_cm_id*, rdma_event_channel*);
  int (*create_qp)(rdma_cm_id*, ibv_pd*, ibv_qp_init_attr*);
  void (*destroy_qp)(rdma_cm_id*);
  int (*accept)(rdma_cm_id*, rdma_conn_param*);
  int (*reject)(rdma_cm_id*, const void* private_data, uint8_t len);
  int (*connect)(rdma_cm_id*, rdma_conn_param*);
  int (*disconnect)(rdma_cm_id*);
  // librdmacm's own device contexts (open for the process; the array is the caller's)
  ibv_context** (*get_devices)(int* num_devices);
  void (*free_devices)(ibv_context**);
  // libibverbs
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
};

inline const Provider system_provider = {
    rdma_create_event_channel,
    rdma_destroy_event_channel,
    rdma_create_id,
    rdma_destroy_id,
    rdma_getaddrinfo,
    rdma_freeaddrinfo,
    rdma_bind_addr,
    rdma_listen,
    rdma_resolve_addr,
    rdma_resolve_route,
    rdma_get_cm_event,
    rdma_ack_cm_event,
    rdma_migrate_id,
    rdma_create_qp,
    rdma_destroy_qp,
    rdma_accept,
    rdma_reject,
    rdma_connect,
    rdma_disconnect,
    rdma_get_devices,
    rdma_free_devices,
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
