// A minimal deterministic fake of the provider seam (rpmapp::detail::Provider) for
// counting instructions of the control path and the data path under callgrind. It never allocates: every
// object comes from a fixed pool, events go through a small queue per event channel, and
// every call that succeeds in real life succeeds here. A posted work request that asks
// for a completion (signaled send, every receive) completes at once: its ibv_wc waits in
// one ring that poll_cq reads (one CQ for everything). Each call appends its number to
// `trace` so that a benchmark can check that two call sequences made the same calls.
// Single-threaded. Independent of tests/unit (whose fake may change).
#pragma once

#include <rpmapp/detail/provider.hpp>

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>

#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <cstring>

namespace bench::fake {

enum Call : unsigned char {
  c_create_event_channel, c_destroy_event_channel, c_create_id, c_destroy_id, c_bind_addr,
  c_listen, c_resolve_addr, c_resolve_route, c_get_cm_event,
  c_ack_cm_event, c_migrate_id, c_create_qp, c_destroy_qp, c_accept, c_reject, c_connect,
  c_disconnect, c_modify_qp, c_get_devices, c_free_devices, c_get_device_list, c_free_device_list, c_alloc_pd, c_dealloc_pd, c_create_comp_channel,
  c_destroy_comp_channel, c_create_cq, c_destroy_cq, c_req_notify_cq, c_fcntl, c_poll,
  c_query_device_ex, c_reg_mr, c_dereg_mr, c_advise_mr, c_create_qp_ex, c_post_send, c_post_recv,
  c_post_srq_recv, c_post_atomic_write, c_post_flush, c_poll_cq, c_get_cq_event, c_ack_cq_events, c_create_srq,
  c_destroy_srq, c_alloc_mw, c_dealloc_mw, c_getrandom,
};

inline constexpr int pool_size = 8;
inline constexpr int queue_size = 8;
inline constexpr int fd_base = 1000;
inline constexpr int cq_ring = 64;

struct Queued {
  rdma_cm_id* id;
  rdma_cm_event_type type;
};

struct Channel {
  rdma_event_channel channel;
  bool used;
  int head, count;
  Queued queue[queue_size];
};

struct World {
  ibv_device device;
  ibv_context context;
  ibv_pd pd;
  ibv_comp_channel comp_channel;
  ibv_cq cq;
  ibv_qp qp;
  Channel channels[pool_size];
  rdma_cm_id ids[pool_size];
  bool id_used[pool_size];
  rdma_cm_event events[pool_size];
  bool event_used[pool_size];
  unsigned char private_data[56];
  unsigned short next_port;
  rdma_cm_id* listener;  // the last id that listened
  ibv_srq srq;
  ibv_mr mrs[pool_size];
  bool mr_used[pool_size];
  std::uint32_t next_key;
  ibv_wc completions[cq_ring];  // what poll_cq returns next
  int wc_head, wc_count;
  unsigned char trace[256];
  int trace_len;
};

inline World world;

inline void note(Call c) {
  if (world.trace_len < static_cast<int>(sizeof world.trace)) world.trace[world.trace_len] = c;
  ++world.trace_len;
}

inline void reset() {
  std::memset(&world, 0, sizeof world);
  std::strcpy(world.device.name, "fake0");
  world.context.device = &world.device;
  world.pd.context = &world.context;
  world.cq.context = &world.context;
  world.qp.qp_num = 42;
  world.qp.send_cq = world.qp.recv_cq = &world.cq;
  world.srq.context = &world.context;
  world.next_key = 0x100;
  world.next_port = 20000;
  for (int i = 0; i < pool_size; ++i) world.channels[i].channel.fd = fd_base + i;
}

inline Channel& channel_of(rdma_event_channel* ch) { return world.channels[ch->fd - fd_base]; }

inline void push(rdma_event_channel* ch, rdma_cm_id* id, rdma_cm_event_type type) {
  Channel& c = channel_of(ch);
  if (c.count == queue_size) std::abort();
  c.queue[(c.head + c.count++) % queue_size] = {id, type};
}

inline rdma_cm_id* new_id(rdma_event_channel* ch) {
  for (int i = 0; i < pool_size; ++i) {
    if (!world.id_used[i]) {
      world.id_used[i] = true;
      rdma_cm_id* id = &world.ids[i];
      std::memset(id, 0, sizeof *id);
      id->channel = ch;
      id->ps = RDMA_PS_TCP;
      return id;
    }
  }
  std::abort();
}

/// A work request's completion arrives (the ring is the CQ; overflowing it is a bug).
inline void complete(std::uint64_t wr_id, ibv_wc_opcode opcode, std::uint32_t byte_len) {
  if (world.wc_count == cq_ring) std::abort();
  ibv_wc& wc = world.completions[(world.wc_head + world.wc_count++) % cq_ring];
  wc = ibv_wc{};
  wc.wr_id = wr_id;
  wc.status = IBV_WC_SUCCESS;
  wc.opcode = opcode;
  wc.byte_len = byte_len;
  wc.qp_num = world.qp.qp_num;
}

inline std::uint32_t sge_bytes(const ibv_sge* sg, int n) {
  std::uint32_t total = 0;
  for (int i = 0; i < n; ++i) total += sg[i].length;
  return total;
}

inline ibv_wc_opcode wc_opcode_of(ibv_wr_opcode op) {
  switch (op) {
    case IBV_WR_RDMA_READ: return IBV_WC_RDMA_READ;
    case IBV_WR_RDMA_WRITE:
    case IBV_WR_RDMA_WRITE_WITH_IMM: return IBV_WC_RDMA_WRITE;
    default: return IBV_WC_SEND;
  }
}

/// A client's CONNECT_REQUEST arrives on `listener`'s channel.
inline void incoming(rdma_cm_id* listener) {
  rdma_cm_id* id = new_id(listener->channel);
  id->verbs = &world.context;
  push(listener->channel, id, RDMA_CM_EVENT_CONNECT_REQUEST);
}

inline const rpmapp::detail::Provider provider = {
    // create_event_channel
    []() -> rdma_event_channel* {
      note(c_create_event_channel);
      for (auto& c : world.channels)
        if (!c.used) {
          c.used = true;
          c.head = c.count = 0;
          return &c.channel;
        }
      errno = EMFILE;
      return nullptr;
    },
    // destroy_event_channel
    [](rdma_event_channel* ch) {
      note(c_destroy_event_channel);
      channel_of(ch).used = false;
    },
    // create_id
    [](rdma_event_channel* ch, rdma_cm_id** out, void* ctx, rdma_port_space) {
      note(c_create_id);
      *out = new_id(ch);
      (*out)->context = ctx;
      return 0;
    },
    // destroy_id
    [](rdma_cm_id* id) {
      note(c_destroy_id);
      world.id_used[id - world.ids] = false;
      return 0;
    },
    // bind_addr: a specific address binds to the fake device; port 0 gets a port
    [](rdma_cm_id* id, sockaddr* sa) {
      note(c_bind_addr);
      auto* in = reinterpret_cast<sockaddr_in*>(&id->route.addr.src_addr);
      std::memcpy(in, sa, sizeof *in);
      if (in->sin_port == 0) in->sin_port = htons(world.next_port);
      if (in->sin_addr.s_addr != 0) id->verbs = &world.context;
      return 0;
    },
    // listen
    [](rdma_cm_id* id, int) {
      note(c_listen);
      world.listener = id;
      return 0;
    },
    // resolve_addr
    [](rdma_cm_id* id, sockaddr*, sockaddr* dst, int) {
      note(c_resolve_addr);
      std::memcpy(&id->route.addr.dst_addr, dst, sizeof(sockaddr_in));
      id->verbs = &world.context;
      push(id->channel, id, RDMA_CM_EVENT_ADDR_RESOLVED);
      return 0;
    },
    // resolve_route
    [](rdma_cm_id* id, int) {
      note(c_resolve_route);
      push(id->channel, id, RDMA_CM_EVENT_ROUTE_RESOLVED);
      return 0;
    },
    // get_cm_event: EAGAIN when the channel is empty (as on a non-blocking fd)
    [](rdma_event_channel* ch, rdma_cm_event** out) {
      note(c_get_cm_event);
      Channel& c = channel_of(ch);
      if (c.count == 0) {
        errno = EAGAIN;
        return -1;
      }
      Queued q = c.queue[c.head];
      c.head = (c.head + 1) % queue_size;
      --c.count;
      for (int i = 0; i < pool_size; ++i) {
        if (!world.event_used[i]) {
          world.event_used[i] = true;
          rdma_cm_event* e = &world.events[i];
          std::memset(e, 0, sizeof *e);
          e->id = q.id;
          e->event = q.type;
          if (q.type == RDMA_CM_EVENT_CONNECT_REQUEST || q.type == RDMA_CM_EVENT_ESTABLISHED) {
            e->param.conn.private_data = world.private_data;
            e->param.conn.private_data_len = q.type == RDMA_CM_EVENT_CONNECT_REQUEST ? 56 : 0;
          }
          *out = e;
          return 0;
        }
      }
      std::abort();
    },
    // ack_cm_event
    [](rdma_cm_event* e) {
      note(c_ack_cm_event);
      world.event_used[e - world.events] = false;
      return 0;
    },
    // migrate_id
    [](rdma_cm_id* id, rdma_event_channel* ch) {
      note(c_migrate_id);
      id->channel = ch;
      return 0;
    },
    // create_qp
    [](rdma_cm_id* id, ibv_pd*, ibv_qp_init_attr*) {
      note(c_create_qp);
      id->qp = &world.qp;
      return 0;
    },
    // destroy_qp
    [](rdma_cm_id* id) {
      note(c_destroy_qp);
      id->qp = nullptr;
      return 0;
    },
    // accept
    [](rdma_cm_id* id, rdma_conn_param*) {
      note(c_accept);
      push(id->channel, id, RDMA_CM_EVENT_ESTABLISHED);
      return 0;
    },
    // reject
    [](rdma_cm_id*, const void*, uint8_t) {
      note(c_reject);
      return 0;
    },
    // connect
    [](rdma_cm_id* id, rdma_conn_param*) {
      note(c_connect);
      push(id->channel, id, RDMA_CM_EVENT_ESTABLISHED);
      return 0;
    },
    // disconnect
    [](rdma_cm_id* id) {
      note(c_disconnect);
      push(id->channel, id, RDMA_CM_EVENT_DISCONNECTED);
      return 0;
    },
    // modify_qp (rpmapp moves an iWARP queue pair to the error state; the fake device is IB)
    [](ibv_qp*, ibv_qp_attr*, int) {
      note(c_modify_qp);
      return 0;
    },
    // get_devices: the one fake device, whose context is librdmacm's
    [](int* n) -> ibv_context** {
      note(c_get_devices);
      static ibv_context* list[2];
      list[0] = &world.context;
      list[1] = nullptr;
      if (n) *n = 1;
      return list;
    },
    // free_devices
    [](ibv_context**) { note(c_free_devices); },
    // get_device_list: the one fake device, present
    [](int* n) -> ibv_device** {
      note(c_get_device_list);
      static ibv_device* list[2];
      list[0] = &world.device;
      list[1] = nullptr;
      if (n) *n = 1;
      return list;
    },
    // free_device_list
    [](ibv_device**) { note(c_free_device_list); },
    // alloc_pd
    [](ibv_context*) -> ibv_pd* {
      note(c_alloc_pd);
      return &world.pd;
    },
    // dealloc_pd
    [](ibv_pd*) {
      note(c_dealloc_pd);
      return 0;
    },
    // create_comp_channel
    [](ibv_context*) -> ibv_comp_channel* {
      note(c_create_comp_channel);
      return &world.comp_channel;
    },
    // destroy_comp_channel
    [](ibv_comp_channel*) {
      note(c_destroy_comp_channel);
      return 0;
    },
    // create_cq
    [](ibv_context*, int, void*, ibv_comp_channel*, int) -> ibv_cq* {
      note(c_create_cq);
      return &world.cq;
    },
    // destroy_cq
    [](ibv_cq*) {
      note(c_destroy_cq);
      return 0;
    },
    // req_notify_cq
    [](ibv_cq*, int) {
      note(c_req_notify_cq);
      return 0;
    },
    // fcntl: rpmapp makes each event channel O_NONBLOCK (one F_SETFL)
    [](int, int cmd, int) {
      note(c_fcntl);
      return cmd == F_GETFL ? O_RDWR : 0;
    },
    // poll: readable when the channel has a queued event; never blocks
    [](pollfd* fds, nfds_t n, int) {
      note(c_poll);
      int ready = 0;
      for (nfds_t i = 0; i < n; ++i) {
        const int idx = fds[i].fd - fd_base;
        fds[i].revents = idx >= 0 && idx < pool_size && world.channels[idx].count > 0 ? POLLIN : 0;
        if (fds[i].revents) ++ready;
      }
      return ready;
    },
    // query_device_ex: no on-demand paging, no native atomic write, and rxe's limits
    // (ConnConfig's sizes are checked against them before anything is created)
    [](ibv_context*, const ibv_query_device_ex_input*, ibv_device_attr_ex* attr) {
      note(c_query_device_ex);
      *attr = ibv_device_attr_ex{};
      attr->orig_attr.max_qp_wr = 1 << 20;
      attr->orig_attr.max_sge = 32;
      attr->orig_attr.max_sge_rd = 32;
      attr->orig_attr.max_cqe = (1 << 15) - 1;
      attr->orig_attr.max_srq_wr = 1 << 20;
      attr->orig_attr.atomic_cap = IBV_ATOMIC_HCA;
      attr->orig_attr.max_qp_init_rd_atom = 128;
      return 0;
    },
    // reg_mr
    [](ibv_pd* pd, void* addr, size_t length, int access) -> ibv_mr* {
      note(c_reg_mr);
      for (int i = 0; i < pool_size; ++i) {
        if (!world.mr_used[i]) {
          world.mr_used[i] = true;
          ibv_mr& mr = world.mrs[i];
          mr = ibv_mr{};
          mr.context = &world.context;
          mr.pd = pd;
          mr.addr = addr;
          mr.length = length;
          mr.lkey = mr.rkey = world.next_key++;
          (void)access;
          return &mr;
        }
      }
      errno = ENOMEM;
      return nullptr;
    },
    // dereg_mr
    [](ibv_mr* mr) {
      note(c_dereg_mr);
      world.mr_used[mr - world.mrs] = false;
      return 0;
    },
    // advise_mr
    [](ibv_pd*, ibv_advise_mr_advice, uint32_t, ibv_sge*, uint32_t) {
      note(c_advise_mr);
      return 0;
    },
    // create_qp_ex
    [](rdma_cm_id* id, ibv_qp_init_attr_ex*) {
      note(c_create_qp_ex);
      id->qp = &world.qp;
      return 0;
    },
    // post_send: each signaled work request completes at once
    [](ibv_qp*, ibv_send_wr* wr, ibv_send_wr**) {
      note(c_post_send);
      for (; wr != nullptr; wr = wr->next)
        if (wr->send_flags & IBV_SEND_SIGNALED)
          complete(wr->wr_id, wc_opcode_of(wr->opcode), sge_bytes(wr->sg_list, wr->num_sge));
      return 0;
    },
    // post_recv: each receive completes at once, as if a message had arrived
    [](ibv_qp*, ibv_recv_wr* wr, ibv_recv_wr**) {
      note(c_post_recv);
      for (; wr != nullptr; wr = wr->next) complete(wr->wr_id, IBV_WC_RECV, sge_bytes(wr->sg_list, wr->num_sge));
      return 0;
    },
    // post_srq_recv
    [](ibv_srq*, ibv_recv_wr* wr, ibv_recv_wr**) {
      note(c_post_srq_recv);
      for (; wr != nullptr; wr = wr->next) complete(wr->wr_id, IBV_WC_RECV, sge_bytes(wr->sg_list, wr->num_sge));
      return 0;
    },
    // post_atomic_write
    [](ibv_qp*, uint64_t wr_id, unsigned flags, uint32_t, uint64_t, const void*) {
      note(c_post_atomic_write);
      if (flags & IBV_SEND_SIGNALED)
        complete(wr_id, static_cast<ibv_wc_opcode>(rpmapp::detail::native_atomic_write_abi::wc_atomic_write), 8);
      return 0;
    },
    // post_flush
    [](ibv_qp*, uint64_t wr_id, unsigned flags, uint32_t, uint64_t, size_t, uint8_t, uint8_t) {
      note(c_post_flush);
      if (flags & IBV_SEND_SIGNALED)
        complete(wr_id, static_cast<ibv_wc_opcode>(rpmapp::detail::native_flush_abi::wc_flush), 0);
      return 0;
    },
    // poll_cq: up to n completions from the ring
    [](ibv_cq*, int n, ibv_wc* out) {
      note(c_poll_cq);
      int got = 0;
      for (; got < n && world.wc_count > 0; ++got) {
        out[got] = world.completions[world.wc_head];
        world.wc_head = (world.wc_head + 1) % cq_ring;
        --world.wc_count;
      }
      return got;
    },
    // get_cq_event: the one CQ, when something waits in it
    [](ibv_comp_channel*, ibv_cq** cq, void** ctx) {
      note(c_get_cq_event);
      if (world.wc_count == 0) {
        errno = EAGAIN;
        return -1;
      }
      *cq = &world.cq;
      *ctx = nullptr;
      return 0;
    },
    // ack_cq_events
    [](ibv_cq*, unsigned) { note(c_ack_cq_events); },
    // create_srq
    [](ibv_pd*, ibv_srq_init_attr*) -> ibv_srq* {
      note(c_create_srq);
      return &world.srq;
    },
    // destroy_srq
    [](ibv_srq*) {
      note(c_destroy_srq);
      return 0;
    },
    // alloc_mw, dealloc_mw, getrandom: grants are not measured against this fake
    [](ibv_pd*, ibv_mw_type) -> ibv_mw* {
      note(c_alloc_mw);
      errno = EOPNOTSUPP;
      return nullptr;
    },
    [](ibv_mw*) {
      note(c_dealloc_mw);
      return 0;
    },
    [](void*, size_t, unsigned) -> ssize_t {
      note(c_getrandom);
      errno = ENOSYS;
      return -1;
    },
    // the event loop's calls: the system's (the loop is not measured against the fake)
    ::epoll_create1,
    ::epoll_ctl,
    ::epoll_wait,
    ::eventfd,
    ::read,
    ::write,
    ::close,
    rpmapp::detail::system_provider.pthread_create,
};

}  // namespace bench::fake
