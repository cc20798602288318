#include "fake_provider.hpp"

#include "fake_assertions.hpp"

#include <arpa/inet.h>
#include <net/if.h>
#include <netdb.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstring>
#include <type_traits>

#include <fcntl.h>
#include <sstream>
#include <utility>

namespace fake {
namespace {

FakeProvider* g_current = nullptr;

constexpr std::size_t connect_pad = 56;
constexpr std::size_t accept_pad = 196;
constexpr std::size_t reject_pad = 148;  // IB_CM_REJ_PRIVATE_DATA_SIZE

bool on_iwarp(const ibv_context* ctx) {
  return ctx != nullptr && ctx->device != nullptr && ctx->device->transport_type == IBV_TRANSPORT_IWARP;
}

// What an event's private data is padded to: IB CM's size; nothing on iWARP, where MPA
// delivers it at its length (siw_cm.c).
std::size_t pad_on(const rdma_cm_id* id, std::size_t ib_size) { return on_iwarp(id->verbs) ? 0 : ib_size; }

// The padding of an injected event's private data (none unless `pad`).
std::size_t event_pad(const rdma_cm_id* id, rdma_cm_event_type type, bool pad) {
  if (pad && type == RDMA_CM_EVENT_ESTABLISHED) return pad_on(id, accept_pad);
  if (pad && type == RDMA_CM_EVENT_REJECTED) return pad_on(id, reject_pad);
  return 0;
}

// siw: one byte counts the data and MPA v2's 4-byte IRD/ORD block (siw_send_mpareqrep)
constexpr std::size_t iwarp_private_data = 251;

in_addr ipv4(const char* text) {
  in_addr a{};
  inet_pton(AF_INET, text, &a);
  return a;
}

const char* const device_addresses[device_count] = {"169.254.77.1", "169.254.78.1"};
// Each device's IPv6 link-local address, on the netdev `lo` (the one interface every
// host has, so that the library's scope checks pass): "fe80::77:1%lo".
const char* const device_addresses6[device_count] = {"fe80::77:1", "fe80::78:1"};

// "addr" or "addr%scope" as getaddrinfo(AI_NUMERICHOST) parses it: a name scope only on
// a link-local address, a decimal one on any IPv6 address. False when not numeric.
bool set_sockaddr(sockaddr_storage& out, const std::string& text, std::uint16_t port) {
  std::memset(&out, 0, sizeof out);
  auto* sin = reinterpret_cast<sockaddr_in*>(&out);
  auto* sin6 = reinterpret_cast<sockaddr_in6*>(&out);
  const auto percent = text.find('%');
  const std::string addr = text.substr(0, percent);
  if (percent == std::string::npos && inet_pton(AF_INET, addr.c_str(), &sin->sin_addr) == 1) {
    sin->sin_family = AF_INET;
    sin->sin_port = htons(port);
    return true;
  }
  if (inet_pton(AF_INET6, addr.c_str(), &sin6->sin6_addr) != 1) return false;
  sin6->sin6_family = AF_INET6;
  sin6->sin6_port = htons(port);
  if (percent == std::string::npos) return true;
  const std::string scope = text.substr(percent + 1);
  if (!scope.empty() && scope.find_first_not_of("0123456789") == std::string::npos) {
    sin6->sin6_scope_id = static_cast<std::uint32_t>(std::strtoul(scope.c_str(), nullptr, 10));
    return true;
  }
  if (IN6_IS_ADDR_LINKLOCAL(&sin6->sin6_addr)) sin6->sin6_scope_id = if_nametoindex(scope.c_str());
  return sin6->sin6_scope_id != 0;
}

// The device whose IPv4 or IPv6 address `sa` is, or -1.
int device_owning(const sockaddr* sa) {
  for (int d = 0; d < device_count; ++d) {
    sockaddr_storage own{};
    if (sa->sa_family == AF_INET) {
      set_sockaddr(own, device_addresses[d], 0);
      if (reinterpret_cast<const sockaddr_in*>(sa)->sin_addr.s_addr ==
          reinterpret_cast<const sockaddr_in*>(&own)->sin_addr.s_addr)
        return d;
    } else if (sa->sa_family == AF_INET6) {
      set_sockaddr(own, device_addresses6[d], 0);
      if (std::memcmp(&reinterpret_cast<const sockaddr_in6*>(sa)->sin6_addr,
                      &reinterpret_cast<const sockaddr_in6*>(&own)->sin6_addr, sizeof(in6_addr)) == 0)
        return d;
    }
  }
  return -1;
}

std::size_t sockaddr_len(const sockaddr* sa) {
  return sa->sa_family == AF_INET6 ? sizeof(sockaddr_in6) : sizeof(sockaddr_in);
}

std::uint16_t port_of(const sockaddr* sa) {
  if (sa->sa_family == AF_INET) return ntohs(reinterpret_cast<const sockaddr_in*>(sa)->sin_port);
  if (sa->sa_family == AF_INET6) return ntohs(reinterpret_cast<const sockaddr_in6*>(sa)->sin6_port);
  return 0;
}

void set_port(sockaddr* sa, std::uint16_t port) {
  if (sa->sa_family == AF_INET) reinterpret_cast<sockaddr_in*>(sa)->sin_port = htons(port);
  if (sa->sa_family == AF_INET6) reinterpret_cast<sockaddr_in6*>(sa)->sin6_port = htons(port);
}

bool is_wildcard(const sockaddr* sa) {
  if (sa->sa_family == AF_INET)
    return reinterpret_cast<const sockaddr_in*>(sa)->sin_addr.s_addr == htonl(INADDR_ANY);
  if (sa->sa_family == AF_INET6) {
    const auto& a = reinterpret_cast<const sockaddr_in6*>(sa)->sin6_addr;
    return std::memcmp(&a, &in6addr_any, sizeof a) == 0;
  }
  return false;
}

}  // namespace

std::string Sent::text() const {
  return std::string(reinterpret_cast<const char*>(data.data()), data.size());
}

bool cannot_fail(std::string_view call) {
  return call == "rdma_destroy_event_channel" ||
         call == "rdma_free_devices" || call == "ibv_free_device_list" || call == "ibv_ack_cq_events";
}

std::vector<std::pair<std::string, int>> failable_calls(const std::vector<std::string>& log) {
  std::vector<std::pair<std::string, int>> out;
  std::map<std::string, int> seen;
  for (const auto& call : log) {
    int n = ++seen[call];
    if (!cannot_fail(call)) out.emplace_back(call, n);
  }
  return out;
}

// ------------------------------------------------------------------------------------
// The provider functions.

struct FakeProvider::Impl {
  static FakeProvider& f() { return *g_current; }

  // A call that can be failed: logs it and returns true (with errno set) when it must fail.
  static bool fails(const char* call) {
    int err = 0;
    if (!f().injected(call, err)) return false;
    errno = err;
    return true;
  }

  static rdma_event_channel* create_event_channel() {
    auto lock = f().lock();
    if (fails("rdma_create_event_channel")) return nullptr;
    auto* ch = new rdma_event_channel{};
    ch->fd = f().next_fd_++;
    f().channels_[ch];
    f().created("event_channel");
    return ch;
  }

  static void destroy_event_channel(rdma_event_channel* ch) {
    auto lock = f().lock();
    f().calls_.emplace_back("rdma_destroy_event_channel");
    auto it = f().channels_.find(ch);
    if (it == f().channels_.end()) return f().note("rdma_destroy_event_channel: channel not alive");
    for (auto& [id, info] : f().ids_)
      if (id->channel == ch) f().note("rdma_destroy_event_channel: a cm_id is still on the channel");
    for (rdma_cm_event* ev : it->second.queue) f().discard_event(ev);  // the kernel's job
    f().drop_watches(ch->fd);  // the kernel drops a closed file from every epoll set
    f().channels_.erase(it);
    f().changed_.notify_all();
    f().destroyed("event_channel");
    delete ch;
  }

  static int create_id(rdma_event_channel* ch, rdma_cm_id** out, void* ctx, rdma_port_space ps) {
    auto lock = f().lock();
    if (fails("rdma_create_id")) return -1;
    if (ch != nullptr && !f().channels_.count(ch)) {
      f().note("rdma_create_id: channel not alive");
      errno = EINVAL;
      return -1;
    }
    auto* id = new rdma_cm_id{};
    id->channel = ch;
    id->context = ctx;
    id->ps = ps;
    f().ids_[id];
    f().created("cm_id");
    *out = id;
    return 0;
  }

  static int destroy_id(rdma_cm_id* id) {
    auto lock = f().lock();
    bool failed = fails("rdma_destroy_id");
    auto it = f().ids_.find(id);
    if (it == f().ids_.end()) {
      f().note("rdma_destroy_id: cm_id not alive");
      errno = EINVAL;
      return -1;
    }
    if (id->qp != nullptr) f().note("rdma_destroy_id: the cm_id still has a queue pair");
    for (rdma_cm_event* ev : f().unacked_)
      if (ev->id == id)
        f().note("rdma_destroy_id: an event of the id is not acknowledged (would block)");
    // Requests queued on a listener and not yet taken are the kernel's to clean up.
    // The kernel drops the id's events not yet read (ucma_destroy_private_ctx), so a
    // channel reused after its id is gone delivers none of them.
    if (!failed && id->channel != nullptr) {
      if (auto ch = f().channels_.find(id->channel); ch != f().channels_.end()) {
        auto& queue = ch->second.queue;
        for (auto ev = queue.begin(); ev != queue.end();) {
          if ((*ev)->id == id) {
            f().discard_event(*ev);
            ev = queue.erase(ev);
          } else {
            ++ev;
          }
        }
      }
    }
    f().ids_.erase(it);
    f().destroyed("cm_id");
    delete id;
    return failed ? -1 : 0;
  }

  static bool id_ok(rdma_cm_id* id, const char* call) {
    if (f().ids_.count(id)) return true;
    f().note(std::string(call) + ": cm_id not alive");
    errno = EINVAL;
    return false;
  }

  static int bind_addr(rdma_cm_id* id, sockaddr* addr) {
    auto lock = f().lock();
    if (fails("rdma_bind_addr")) return -1;
    if (!id_ok(id, "rdma_bind_addr")) return -1;
    if (addr == nullptr) {
      errno = EINVAL;
      return -1;
    }
    int device = -1;
    if (addr->sa_family == AF_INET6) {  // the kernel's cma_check_linklocal
      const auto* sin6 = reinterpret_cast<const sockaddr_in6*>(addr);
      if (IN6_IS_ADDR_LINKLOCAL(&sin6->sin6_addr) && sin6->sin6_scope_id == 0) {
        errno = EINVAL;
        return -1;
      }
    }
    if (!is_wildcard(addr)) {
      device = device_owning(addr);
      if (device < 0) {
        errno = EADDRNOTAVAIL;
        return -1;
      }
    }
    std::uint16_t port = port_of(addr);
    if (port == 0) port = f().next_port_++;
    // Two specific addresses of one device clash only within a family (they differ).
    for (auto& [other, info] : f().ids_)
      if (other != id && info.bound && info.port == port &&
          (info.device < 0 || device < 0 ||
           (info.device == device && other->route.addr.src_addr.sa_family == addr->sa_family))) {
        errno = EADDRINUSE;
        return -1;
      }
    std::memcpy(&id->route.addr.src_storage, addr, sockaddr_len(addr));
    set_port(&id->route.addr.src_addr, port);
    id->verbs = device < 0 ? nullptr : f().cm_contexts_[device];
    auto& info = f().ids_[id];
    info.bound = true;
    info.port = port;
    info.device = device;
    return 0;
  }

  static int listen(rdma_cm_id* id, int backlog) {
    auto lock = f().lock();
    if (fails("rdma_listen")) return -1;
    if (!id_ok(id, "rdma_listen")) return -1;
    auto& info = f().ids_[id];
    if (!info.bound) {
      f().note("rdma_listen: the cm_id is not bound");
      errno = EINVAL;
      return -1;
    }
    info.listening = true;
    f().backlogs.push_back(backlog);
    return 0;
  }

  static int resolve_addr(rdma_cm_id* id, sockaddr* src, sockaddr* dst, int timeout_ms) {
    auto lock = f().lock();
    if (fails("rdma_resolve_addr")) return -1;
    if (!id_ok(id, "rdma_resolve_addr")) return -1;
    if (dst == nullptr || timeout_ms <= 0) {
      errno = EINVAL;
      return -1;
    }
    (void)src;
    int device = f().resolve_device(dst);
    std::memcpy(&id->route.addr.dst_storage, dst, sockaddr_len(dst));
    if (device >= 0) {
      sockaddr_storage local{};
      if (dst->sa_family == AF_INET6) {  // the source keeps the destination's scope
        set_sockaddr(local, device_addresses6[device], f().next_port_++);
        reinterpret_cast<sockaddr_in6*>(&local)->sin6_scope_id =
            reinterpret_cast<const sockaddr_in6*>(dst)->sin6_scope_id;
      } else {
        set_sockaddr(local, device_addresses[device], f().next_port_++);
      }
      std::memcpy(&id->route.addr.src_storage, &local, sizeof local);
    }
    if (id->channel == nullptr) {  // a synchronous id: resolved (or not) on return
      if (device < 0) {
        errno = EHOSTUNREACH;
        return -1;
      }
      id->verbs = f().cm_contexts_[device];
      return 0;
    }
    rdma_cm_event_type type = f().addr_event;
    int status = f().addr_status;
    if (type == RDMA_CM_EVENT_ADDR_RESOLVED && device < 0) {
      type = RDMA_CM_EVENT_ADDR_ERROR;
      status = -EHOSTUNREACH;
    }
    if (type == RDMA_CM_EVENT_ADDR_RESOLVED) id->verbs = f().cm_contexts_[device];
    auto* ev = f().make_event(id, type, {}, 0, status);
    if (f().auto_resolve) f().queue_event(id->channel, ev);
    else f().held_.emplace_back(id->channel, ev);
    return 0;
  }

  static int resolve_route(rdma_cm_id* id, int timeout_ms) {
    auto lock = f().lock();
    if (fails("rdma_resolve_route")) return -1;
    if (!id_ok(id, "rdma_resolve_route")) return -1;
    if (id->verbs == nullptr || timeout_ms <= 0 || id->channel == nullptr) {
      errno = EINVAL;
      return -1;
    }
    auto* ev = f().make_event(id, f().route_event, {}, 0, f().route_status);
    if (f().auto_resolve) f().queue_event(id->channel, ev);
    else f().held_.emplace_back(id->channel, ev);
    return 0;
  }

  static int get_cm_event(rdma_event_channel* ch, rdma_cm_event** out) {
    auto lock = f().lock();
    if (fails("rdma_get_cm_event")) return -1;
    rdma_cm_event* ev = nullptr;
    for (;;) {  // librdmacm reads again after an event it consumes itself
      auto it = f().channels_.find(ch);
      if (it == f().channels_.end()) {
        f().note("rdma_get_cm_event: channel not alive");
        errno = EINVAL;
        return -1;
      }
      if (it->second.queue.empty()) {
        if (it->second.nonblocking) {  // the kernel's ucma_get_event: -EAGAIN
          errno = EAGAIN;
          return -1;
        }
        if (!f().wait_for_event(lock, ch, f().watchdog)) {
          f().note("rdma_get_cm_event blocked on an empty blocking channel: a hang in production");
          errno = ETIME;
          return -1;
        }
        continue;
      }
      ev = it->second.queue.front();
      it->second.queue.pop_front();
      if (!f().events_[ev].internal) break;
      f().discard_event(ev);
    }
    auto& data = f().events_[ev];
    if (data.child != nullptr) {  // librdmacm makes the request's cm_id now
      f().ids_[data.child];
      f().created("cm_id");
      data.child = nullptr;
    }
    // The connecting side's queue pair is moved to RTS when librdmacm handles the reply.
    if (ev->event == RDMA_CM_EVENT_ESTABLISHED && ev->id != nullptr && ev->id->qp != nullptr &&
        f().qps_.count(ev->id->qp) && f().qps_[ev->id->qp].state == QpState::init) {
      f().qps_[ev->id->qp].state = QpState::rts;
      ev->id->qp->state = IBV_QPS_RTS;
    }
    f().unacked_.insert(ev);
    f().created("unacked_event");
    *out = ev;
    return 0;
  }

  static int ack_cm_event(rdma_cm_event* ev) {
    auto lock = f().lock();
    bool failed = fails("rdma_ack_cm_event");
    if (!f().unacked_.erase(ev)) {
      f().note("rdma_ack_cm_event: event not delivered or already acknowledged");
      errno = EINVAL;
      return -1;
    }
    f().destroyed("unacked_event");
    f().events_.erase(ev);
    delete ev;
    return failed ? -1 : 0;
  }

  static int migrate_id(rdma_cm_id* id, rdma_event_channel* ch) {
    auto lock = f().lock();
    if (fails("rdma_migrate_id")) return -1;
    if (!id_ok(id, "rdma_migrate_id")) return -1;
    auto to = f().channels_.find(ch);
    if (to == f().channels_.end()) {
      f().note("rdma_migrate_id: channel not alive");
      errno = EINVAL;
      return -1;
    }
    for (rdma_cm_event* ev : f().unacked_)
      if (ev->id == id) f().note("rdma_migrate_id: an event of the id is not acknowledged (would block)");
    if (id->channel != nullptr) {
      auto& from = f().channels_[id->channel].queue;
      for (auto ev = from.begin(); ev != from.end();) {
        if ((*ev)->id == id) {
          to->second.queue.push_back(*ev);
          ev = from.erase(ev);
        } else {
          ++ev;
        }
      }
    }
    id->channel = ch;
    return 0;
  }

  // rdma_create_qp and rdma_create_qp_ex: librdmacm's checks, then ibv_create_qp's.
  static int make_qp(const char* call, rdma_cm_id* id, ibv_pd* pd, ibv_cq* send_cq,
                     ibv_cq* recv_cq, ibv_srq* srq, ibv_qp_cap& cap, ibv_qp_type type,
                     bool atomic_write, bool flush = false, bool extended = false) {
    if (!id_ok(id, call)) return -1;
    if (!f().pds_.count(pd) || id->qp != nullptr) {
      f().note(std::string(call) + ": bad pd, attributes, or the id already has a qp");
      errno = EINVAL;
      return -1;
    }
    if (id->verbs == nullptr || pd->context != id->verbs) {  // as librdmacm checks
      errno = EINVAL;
      return -1;
    }
    if (!f().cqs_.count(send_cq) || !f().cqs_.count(recv_cq)) {
      f().note(std::string(call) + ": completion queue not alive");
      errno = EINVAL;
      return -1;
    }
    if (srq != nullptr && (!f().srqs_.count(srq) || srq->pd != pd)) {
      f().note(std::string(call) + ": shared receive queue not alive or on another pd");
      errno = EINVAL;
      return -1;
    }
    const int device = f().device_of_context(id->verbs);
    // ibv_create_qp_ex: a comp_mask beyond the pd needs the provider's create_qp_ex
    if (extended && !f().caps_[device].extended_qps) {
      errno = EOPNOTSUPP;
      return -1;
    }
    if (atomic_write && !(f().caps_[device].device_cap_flags_ex & DeviceCaps::atomic_write_flag)) {
      errno = EOPNOTSUPP;
      return -1;
    }
    // a flush QP on a device without flushes is refused, as for atomic write above (not
    // read in rxe's source; the VM only shows the accepted case)
    if (flush && (f().caps_[device].device_cap_flags_ex & DeviceCaps::flush_flags) == 0) {
      errno = EOPNOTSUPP;
      return -1;
    }
    // the device's limits, as rxe_qp_chk_cap and siw_create_qp check them
    const DeviceCaps& limits = f().caps_[device];
    const auto over = [](std::uint32_t value, int limit) { return value > static_cast<std::uint32_t>(limit); };
    if (cap.max_send_wr == 0 || (srq == nullptr && cap.max_recv_wr == 0) ||
        over(cap.max_send_wr, limits.max_qp_wr) || (srq == nullptr && over(cap.max_recv_wr, limits.max_qp_wr)) ||
        over(cap.max_send_sge, limits.max_sge) || over(cap.max_recv_sge, limits.max_sge) ||
        over(cap.max_inline_data, limits.max_inline_data)) {
      errno = EINVAL;
      return -1;
    }
    auto* qp = new ibv_qp{};
    qp->context = id->verbs;
    qp->pd = pd;
    qp->send_cq = send_cq;
    qp->recv_cq = recv_cq;
    qp->srq = srq;
    qp->qp_num = f().next_qp_num_++;
    qp->qp_type = type;
    qp->state = IBV_QPS_INIT;  // librdmacm moves it to INIT
    id->qp = qp;
    if (srq != nullptr) cap.max_recv_wr = 0;
    auto& info = f().qps_[qp];
    info.cap = cap;
    info.atomic_write = atomic_write;
    info.flush = flush;
    f().qp_pd[qp->qp_num] = pd;
    f().created("qp");
    return 0;
  }

  static int create_qp(rdma_cm_id* id, ibv_pd* pd, ibv_qp_init_attr* attr) {
    auto lock = f().lock();
    if (fails("rdma_create_qp")) return -1;
    if (attr == nullptr) {
      f().note("rdma_create_qp: no attributes");
      errno = EINVAL;
      return -1;
    }
    if (make_qp("rdma_create_qp", id, pd, attr->send_cq, attr->recv_cq, attr->srq, attr->cap,
                attr->qp_type, false) != 0)
      return -1;
    f().last_qp_attr = *attr;
    return 0;
  }

  static int create_qp_ex(rdma_cm_id* id, ibv_qp_init_attr_ex* attr) {
    auto lock = f().lock();
    if (fails("rdma_create_qp_ex")) return -1;
    if (attr == nullptr || !(attr->comp_mask & IBV_QP_INIT_ATTR_PD)) {
      f().note("rdma_create_qp_ex: no attributes or no pd in comp_mask");
      errno = EINVAL;
      return -1;
    }
    const bool atomic_write = (attr->comp_mask & IBV_QP_INIT_ATTR_SEND_OPS_FLAGS) &&
                              (attr->send_ops_flags & rpmapp::detail::native_atomic_write_abi::qp_ex_with_atomic_write);
    const bool flush = (attr->comp_mask & IBV_QP_INIT_ATTR_SEND_OPS_FLAGS) &&
                       (attr->send_ops_flags & rpmapp::detail::native_flush_abi::qp_ex_with_flush);
    if (make_qp("rdma_create_qp_ex", id, attr->pd, attr->send_cq, attr->recv_cq, attr->srq,
                attr->cap, attr->qp_type, atomic_write, flush,
                attr->comp_mask != IBV_QP_INIT_ATTR_PD) != 0)
      return -1;
    f().last_qp_attr_ex = *attr;
    return 0;
  }

  // The seam's destroy_qp: ibv_destroy_qp of id->qp, then id->qp = NULL.
  static int destroy_qp(rdma_cm_id* id) {
    auto lock = f().lock();
    int err = 0;
    const bool failed = f().injected("ibv_destroy_qp", err);
    if (!f().ids_.count(id)) {
      f().note("ibv_destroy_qp: cm_id not alive");
      return EINVAL;
    }
    if (id->qp == nullptr || !f().qps_.count(id->qp)) {
      f().note("ibv_destroy_qp: the cm_id has no queue pair");
      return EINVAL;
    }
    if (failed) {  // the kernel refused: the queue pair lives on, holding what it uses
      f().survivors_.insert(id->qp);
      id->qp = nullptr;
      return err;
    }
    for (Window& w : f().windows_)
      if (w.bound && w.qp == id->qp) {
        // rxe_destroy_qp waits (up to 50 s) for the window's reference to the queue pair
        f().note("ibv_destroy_qp: a type 2 memory window is still bound to the queue pair");
        w.qp = nullptr;
      }
    // Its outstanding work requests go with it (nothing reaches the CQs).
    f().qps_.erase(id->qp);
    delete id->qp;
    id->qp = nullptr;
    f().destroyed("qp");
    return 0;
  }

  static std::vector<std::byte> bytes(const void* data, std::size_t len) {
    const auto* p = static_cast<const std::byte*>(data);
    return p ? std::vector<std::byte>(p, p + len) : std::vector<std::byte>();
  }

  static int accept(rdma_cm_id* id, rdma_conn_param* param) {
    auto lock = f().lock();
    if (fails("rdma_accept")) return -1;
    if (!id_ok(id, "rdma_accept")) return -1;
    if (param) f().last_conn_param = *param;
    if (id->qp != nullptr && f().qps_.count(id->qp)) {  // librdmacm: RTR, then RTS
      f().qps_[id->qp].state = QpState::rts;
      id->qp->state = IBV_QPS_RTS;
    }
    f().accepts.push_back({id, param ? bytes(param->private_data, param->private_data_len)
                                     : std::vector<std::byte>()});
    return 0;
  }

  static int reject(rdma_cm_id* id, const void* data, uint8_t len) {
    auto lock = f().lock();
    if (fails("rdma_reject")) return -1;
    if (!id_ok(id, "rdma_reject")) return -1;
    // ib_send_cm_rej (siw_reject on iWARP) refuses it; nothing is sent
    if (data != nullptr && len > (on_iwarp(id->verbs) ? iwarp_private_data : reject_pad)) {
      errno = EINVAL;
      return -1;
    }
    f().rejects.push_back({id, bytes(data, len)});
    return 0;
  }

  static int connect(rdma_cm_id* id, rdma_conn_param* param) {
    auto lock = f().lock();
    if (fails("rdma_connect")) return -1;
    if (!id_ok(id, "rdma_connect")) return -1;
    if (on_iwarp(id->verbs) && f().connects_on_hold_) {
      ++f().connects_in_call_;
      f().changed_.notify_all();
      // bounded: a test that never releases goes on after the watchdog
      f().changed_.wait_for(lock, f().watchdog, [] { return !f().connects_on_hold_; });
      --f().connects_in_call_;
    }
    if (param) f().last_conn_param = *param;
    f().connects.push_back({id, param ? bytes(param->private_data, param->private_data_len)
                                      : std::vector<std::byte>()});
    return 0;
  }

  static int disconnect(rdma_cm_id* id) {
    auto lock = f().lock();
    if (fails("rdma_disconnect")) return -1;
    if (!id_ok(id, "rdma_disconnect")) return -1;
    // librdmacm's ucma_shutdown: IB, ucma_modify_qp_err (flushed); iWARP, ucma_modify_qp_sqd
    // (siw's closing state: what is queued stays, never completed)
    if (id->qp != nullptr && f().qps_.count(id->qp) && !on_iwarp(id->verbs)) f().flush_qp(id->qp);
    f().disconnects.push_back(id);
    return 0;
  }

  // Only the move to the error state (what rpmapp asks for): everything queued is flushed.
  static int modify_qp(ibv_qp* qp, ibv_qp_attr* attr, int attr_mask) {
    auto lock = f().lock();
    if (fails("ibv_modify_qp")) return errno;
    if (qp == nullptr || !f().qps_.count(qp)) return EINVAL;
    if (attr == nullptr || attr_mask != IBV_QP_STATE || attr->qp_state != IBV_QPS_ERR) return EINVAL;
    f().flush_qp(qp);
    return 0;
  }

  static ibv_context** get_devices(int* num_devices) {
    auto lock = f().lock();
    if (fails("rdma_get_devices")) {
      if (num_devices) *num_devices = 0;
      return nullptr;
    }
    // librdmacm syncs its list first: a removed device is dropped, and its context closed
    // (ibv_close_device) unless a cm_id or an earlier list still holds it
    for (int d = 0; d < device_count; ++d)
      if (f().removed_[d]) f().librdmacm_closes(d);
    auto* list = new ibv_context*[device_count + 1];
    int n = 0;
    for (int d = 0; d < device_count; ++d)
      if (!f().removed_[d]) list[n++] = f().cm_contexts_[d];
    list[n] = nullptr;
    f().device_lists_.insert(list);
    f().created("device_list");
    if (num_devices) *num_devices = n;
    return list;
  }

  static void free_devices(ibv_context** list) {
    auto lock = f().lock();
    f().calls_.emplace_back("rdma_free_devices");
    if (!f().device_lists_.erase(list)) return f().note("rdma_free_devices: list not alive");
    f().destroyed("device_list");
    delete[] list;
  }

  static ibv_device** get_device_list(int* num_devices) {
    auto lock = f().lock();
    if (fails("ibv_get_device_list")) {
      if (num_devices) *num_devices = 0;
      return nullptr;
    }
    auto* list = new ibv_device*[device_count + 1];
    int n = 0;
    for (int d = 0; d < device_count; ++d)
      if (!f().removed_[d]) list[n++] = &f().devices_[d];
    list[n] = nullptr;
    f().ibv_device_lists_.insert(list);
    f().created("ibv_device_list");
    if (num_devices) *num_devices = n;
    return list;
  }

  static void free_device_list(ibv_device** list) {
    auto lock = f().lock();
    f().calls_.emplace_back("ibv_free_device_list");
    if (!f().ibv_device_lists_.erase(list)) return f().note("ibv_free_device_list: list not alive");
    f().destroyed("ibv_device_list");
    delete[] list;
  }

  static ibv_pd* alloc_pd(ibv_context* ctx) {
    auto lock = f().lock();
    if (fails("ibv_alloc_pd")) return nullptr;
    if (f().device_of_context(ctx) < 0) {
      f().note("ibv_alloc_pd: not a fake device context");
      errno = EINVAL;
      return nullptr;
    }
    auto* pd = new ibv_pd{};
    pd->context = ctx;
    f().pds_.insert(pd);
    f().created("pd");
    return pd;
  }

  static int dealloc_pd(ibv_pd* pd) {
    auto lock = f().lock();
    int err = 0;
    bool failed = f().injected("ibv_dealloc_pd", err);
    if (!f().pds_.count(pd)) {
      f().note("ibv_dealloc_pd: pd not alive");
      return EINVAL;
    }
    for (auto& [qp, info] : f().qps_)
      if (qp->pd == pd) {
        if (!f().refuse_for_survivor(pd, "pd")) f().note("ibv_dealloc_pd: a queue pair still uses the pd");
        return EBUSY;
      }
    for (auto& [mr, access] : f().mrs_)  // the kernel's EBUSY: the pd is still in use
      if (mr->pd == pd) {
        f().note("ibv_dealloc_pd: a memory region is still registered on the pd");
        return EBUSY;
      }
    for (auto& [srq, info] : f().srqs_)
      if (srq->pd == pd) {
        f().note("ibv_dealloc_pd: a shared receive queue still uses the pd");
        return EBUSY;
      }
    for (const Window& w : f().windows_)
      if (w.pd == pd) {
        f().note("ibv_dealloc_pd: a memory window is still allocated on the pd");
        return EBUSY;
      }
    f().pds_.erase(pd);
    f().destroyed("pd");
    delete pd;
    return failed ? err : 0;
  }

  static ibv_comp_channel* create_comp_channel(ibv_context* ctx) {
    auto lock = f().lock();
    if (fails("ibv_create_comp_channel")) return nullptr;
    if (f().device_of_context(ctx) < 0) {
      f().note("ibv_create_comp_channel: not a fake device context");
      errno = EINVAL;
      return nullptr;
    }
    auto* ch = new ibv_comp_channel{};
    ch->context = ctx;
    ch->fd = f().next_fd_++;
    f().comp_channels_[ch];
    f().created("comp_channel");
    return ch;
  }

  static int destroy_comp_channel(ibv_comp_channel* ch) {
    auto lock = f().lock();
    int err = 0;
    bool failed = f().injected("ibv_destroy_comp_channel", err);
    if (!f().comp_channels_.count(ch)) {
      f().note("ibv_destroy_comp_channel: channel not alive");
      return EINVAL;
    }
    if (ch->refcnt != 0) {
      if (!f().refuse_for_survivor(ch, "comp_channel"))
        f().note("ibv_destroy_comp_channel: a completion queue still uses the channel");
      return EBUSY;
    }
    f().drop_watches(ch->fd);
    f().comp_channels_.erase(ch);
    f().destroyed("comp_channel");
    delete ch;
    return failed ? err : 0;
  }

  static ibv_cq* create_cq(ibv_context* ctx, int cqe, void* cq_context, ibv_comp_channel* ch,
                           int vector) {
    auto lock = f().lock();
    if (fails("ibv_create_cq")) return nullptr;
    const int device = f().device_of_context(ctx);
    if (device < 0 || cqe < 1 || cqe > f().caps_[device].max_cqe || vector != 0 ||
        (ch != nullptr && (!f().comp_channels_.count(ch) || ch->context != ctx))) {
      f().note("ibv_create_cq: bad context, size or completion channel");
      errno = EINVAL;
      return nullptr;
    }
    auto* cq = new ibv_cq{};
    cq->context = ctx;
    cq->channel = ch;
    cq->cq_context = cq_context;
    cq->cqe = cqe;
    if (ch) ++ch->refcnt;
    f().cqs_[cq];
    f().created("cq");
    return cq;
  }

  static int destroy_cq(ibv_cq* cq) {
    auto lock = f().lock();
    int err = 0;
    bool failed = f().injected("ibv_destroy_cq", err);
    if (!f().cqs_.count(cq)) {
      f().note("ibv_destroy_cq: cq not alive");
      return EINVAL;
    }
    for (auto& [qp, info] : f().qps_)
      if (qp->send_cq == cq || qp->recv_cq == cq) {
        if (!f().refuse_for_survivor(cq, "cq")) f().note("ibv_destroy_cq: a queue pair still uses the cq");
        return EBUSY;
      }
    if (unsigned n = f().cqs_[cq].unacked; n != 0) {  // the real call blocks forever
      f().note("ibv_destroy_cq: " + std::to_string(n) +
               " completion event(s) not acknowledged (would block forever)");
      f().alive_["unacked_cq_event"] -= n;
    }
    if (cq->channel) {
      --cq->channel->refcnt;
      auto& events = f().comp_channels_[cq->channel].events;  // the kernel drops them
      events.erase(std::remove(events.begin(), events.end(), cq), events.end());
    }
    f().cqs_.erase(cq);
    f().destroyed("cq");
    delete cq;
    return failed ? err : 0;
  }

  static int req_notify_cq(ibv_cq* cq, int) {
    auto lock = f().lock();
    int err = 0;
    if (f().injected("ibv_req_notify_cq", err)) return err;
    if (!f().cqs_.count(cq)) {
      f().note("ibv_req_notify_cq: cq not alive");
      return EINVAL;
    }
    f().cqs_[cq].armed = true;
    return 0;
  }

  static int fcntl(int fd, int cmd, int arg) {
    auto lock = f().lock();
    if (fails("fcntl")) return -1;
    auto* ch = f().channel_by_fd(fd);
    auto* comp = ch == nullptr ? f().comp_by_fd(fd) : nullptr;
    if (ch == nullptr && comp == nullptr) {
      f().note("fcntl: not the fd of a live event channel");
      errno = EBADF;
      return -1;
    }
    bool& nonblocking = ch != nullptr ? ch->nonblocking : comp->nonblocking;
    if (cmd == F_GETFL) return O_RDWR | (nonblocking ? O_NONBLOCK : 0);
    if (cmd == F_SETFL) {
      nonblocking = (arg & O_NONBLOCK) != 0;
      return 0;
    }
    f().note("fcntl: a command the fake does not model");
    errno = EINVAL;
    return -1;
  }

  static int poll(pollfd* fds, nfds_t n, int timeout_ms) {
    auto lock = f().lock();
    if (fails("poll")) return -1;
    for (nfds_t i = 0; i < n; ++i)
      if (f().channel_by_fd(fds[i].fd) == nullptr && f().comp_by_fd(fds[i].fd) == nullptr)
        f().note("poll: not the fd of a live event channel");
    auto count = [&] {
      int ready = 0;
      for (nfds_t i = 0; i < n; ++i) {
        fds[i].revents = 0;
        auto* ch = f().channel_by_fd(fds[i].fd);
        auto* comp = ch == nullptr ? f().comp_by_fd(fds[i].fd) : nullptr;
        if (ch == nullptr && comp == nullptr) fds[i].revents = POLLNVAL;
        else if (ch != nullptr && !ch->queue.empty() && (fds[i].events & POLLIN)) fds[i].revents = POLLIN;
        else if (comp != nullptr && !comp->events.empty() && (fds[i].events & POLLIN))
          fds[i].revents = POLLIN;
        if (fds[i].revents != 0) ++ready;
      }
      return ready;
    };
    int ready = count();
    if (ready == 0 && timeout_ms != 0) {
      const auto limit = timeout_ms < 0 ? f().watchdog : std::chrono::milliseconds(timeout_ms);
      f().changed_.wait_for(lock, limit, [&] { return count() > 0; });
      ready = count();
      if (ready == 0 && timeout_ms < 0) {
        f().note("poll waited forever on an empty channel: a hang in production");
        errno = ETIME;
        return -1;
      }
    }
    for (nfds_t i = 0; i < n; ++i) {  // several pollers woken by one event
      auto* ch = f().channel_by_fd(fds[i].fd);
      if (ch == nullptr || !(fds[i].revents & POLLIN) || ch->arrived >= ch->rendezvous) continue;
      ++ch->arrived;
      f().changed_.notify_all();
      const int fd = fds[i].fd;
      auto all_here = [&] {
        auto* c = f().channel_by_fd(fd);
        return c == nullptr || c->arrived >= c->rendezvous;
      };
      if (!f().changed_.wait_for(lock, f().watchdog, all_here))
        f().note("poll: the other pollers of rendezvous_polls never came");
    }
    for (nfds_t i = 0; i < n; ++i) {  // "another thread" reads between the poll and the read
      auto* ch = f().channel_by_fd(fds[i].fd);
      if (ch != nullptr && (fds[i].revents & POLLIN) && ch->take_after_poll > 0) {
        --ch->take_after_poll;
        f().discard_event(ch->queue.front());
        ch->queue.pop_front();
        ++f().taken_after_poll_;
      }
    }
    return ready;
  }

  // ---- the data path

  static int query_device_ex(ibv_context* ctx, const ibv_query_device_ex_input*,
                             ibv_device_attr_ex* attr) {
    auto lock = f().lock();
    int err = 0;
    if (f().injected("ibv_query_device_ex", err)) return err;
    const int device = f().device_of_context(ctx);
    if (device < 0 || attr == nullptr) {
      f().note("ibv_query_device_ex: not a fake device context");
      return EINVAL;
    }
    *attr = ibv_device_attr_ex{};
    const DeviceCaps& caps = f().caps_[device];
    std::snprintf(attr->orig_attr.fw_ver, sizeof attr->orig_attr.fw_ver, "fake");
    attr->orig_attr.max_qp_wr = caps.max_qp_wr;
    attr->orig_attr.max_sge = caps.max_sge;
    attr->orig_attr.max_sge_rd = caps.max_sge_rd;
    attr->orig_attr.max_cqe = caps.max_cqe;
    attr->orig_attr.max_mr_size = ~0ull;
    attr->orig_attr.max_srq_wr = caps.max_srq_wr;
    attr->orig_attr.atomic_cap = caps.atomic_cap;
    attr->orig_attr.max_qp_init_rd_atom = caps.max_qp_init_rd_atom;
    attr->odp_caps.general_caps = caps.odp_general_caps;
    attr->odp_caps.per_transport_caps.rc_odp_caps = caps.rc_odp_caps;
    attr->device_cap_flags_ex = caps.device_cap_flags_ex;
    attr->orig_attr.device_cap_flags = caps.device_cap_flags;
    return 0;
  }

  static ibv_mr* reg_mr(ibv_pd* pd, void* addr, size_t length, int access) {
    auto lock = f().lock();
    Registration reg{pd, addr, length, access, nullptr, 0};
    auto refuse = [&](int err) -> ibv_mr* {
      reg.err = err;
      f().registrations_.push_back(reg);
      errno = err;
      return nullptr;
    };
    int err = 0;
    if (f().injected("ibv_reg_mr", err)) return refuse(err);
    if (!f().pds_.count(pd)) {
      f().note("ibv_reg_mr: pd not alive");
      return refuse(EINVAL);
    }
    // The kernel's ib_check_mr_access: remote write needs local write; ODP needs the device.
    if ((access & IBV_ACCESS_REMOTE_WRITE) && !(access & IBV_ACCESS_LOCAL_WRITE)) return refuse(EINVAL);
    const DeviceCaps& caps = f().caps_[f().device_of_context(pd->context)];
    if ((access & IBV_ACCESS_ON_DEMAND) && !(caps.odp_general_caps & IBV_ODP_SUPPORT))
      return refuse(EOPNOTSUPP);
    // ib_check_mr_access: a flush right the device lacks is EOPNOTSUPP
    namespace abi = rpmapp::detail::native_flush_abi;
    if ((access & abi::access_flush_global) && !(caps.device_cap_flags_ex & abi::device_flush_global))
      return refuse(EOPNOTSUPP);
    if ((access & abi::access_flush_persistent) && !(caps.device_cap_flags_ex & abi::device_flush_persistent))
      return refuse(EOPNOTSUPP);
    if (addr == nullptr || length == 0) return refuse(EINVAL);
    if (f().needs_odp_.count(addr) && !(access & IBV_ACCESS_ON_DEMAND)) return refuse(EOPNOTSUPP);
    // rxe_mr_fill_pages_from_sgt: "Page can't be persistent" unless it is pmem
    if ((access & abi::access_flush_persistent) && !f().persistent_.count(addr)) return refuse(EINVAL);
    auto* mr = new ibv_mr{};
    mr->context = pd->context;
    mr->pd = pd;
    mr->addr = addr;
    mr->length = length;
    mr->lkey = f().next_key_++;
    mr->rkey = f().next_key_++;
    mr->handle = mr->lkey;
    f().mrs_[mr] = access;
    f().created("mr");
    reg.mr = mr;
    f().registrations_.push_back(reg);
    return mr;
  }

  static int dereg_mr(ibv_mr* mr) {
    auto lock = f().lock();
    int err = 0;
    bool failed = f().injected("ibv_dereg_mr", err);
    if (!f().mrs_.count(mr)) {
      f().note("ibv_dereg_mr: mr not alive");
      return EINVAL;
    }
    // rxe_dereg_mr (IBA 10.6.7.2.6): refused while windows are bound to it
    for (const Window& w : f().windows_)
      if (w.bound && w.mr == mr) {
        f().note("ibv_dereg_mr: a memory window is still bound to the region (rxe: EINVAL)");
        return EINVAL;
      }
    f().mrs_.erase(mr);
    f().destroyed("mr");
    delete mr;
    return failed ? err : 0;
  }

  static int advise_mr(ibv_pd* pd, ibv_advise_mr_advice advice, uint32_t flags, ibv_sge* sges,
                       uint32_t n) {
    auto lock = f().lock();
    Advice record{pd, advice, flags, {}, 0};
    if (sges != nullptr) record.sge.assign(sges, sges + n);
    auto result = [&](int rc) {
      record.result = rc;
      f().advices_.push_back(record);
      return rc;
    };
    int err = 0;
    if (f().injected("ibv_advise_mr", err)) return result(err);
    if (!f().pds_.count(pd)) {
      f().note("ibv_advise_mr: pd not alive");
      return result(EINVAL);
    }
    // libibverbs: EOPNOTSUPP when the provider has no advise_mr (rxe has none)
    if (!(f().caps_[f().device_of_context(pd->context)].odp_general_caps & IBV_ODP_SUPPORT))
      return result(EOPNOTSUPP);
    if (sges == nullptr || n == 0) return result(EINVAL);
    for (uint32_t i = 0; i < n; ++i)
      if (!f().sge_ok(pd, sges[i], false)) return result(EINVAL);
    return result(0);
  }

  static bool qp_ok(ibv_qp* qp, const char* call) {
    if (f().qps_.count(qp)) return true;
    f().note(std::string(call) + ": queue pair not alive");
    return false;
  }

  static std::uint32_t total_length(const ibv_sge* sge, int n) {
    std::uint64_t sum = 0;
    for (int i = 0; i < n; ++i) sum += sge[i].length;
    return static_cast<std::uint32_t>(sum);
  }

  // siw's provider (rdma-core's providers/siw), for the queues of an iWARP device (on_iwarp):
  // a post fails with the errno negated, a receive needs a scatter/gather entry (even for
  // 0 bytes), and the opcodes with immediate data and the atomics are refused.
  static bool iwarp_refuses(const ibv_send_wr& wr) {
    return wr.opcode == IBV_WR_RDMA_WRITE_WITH_IMM || wr.opcode == IBV_WR_SEND_WITH_IMM ||
           wr.opcode == IBV_WR_ATOMIC_CMP_AND_SWP || wr.opcode == IBV_WR_ATOMIC_FETCH_AND_ADD;
  }

  static int post_send(ibv_qp* qp, ibv_send_wr* wr, ibv_send_wr** bad) {
    auto lock = f().lock();
    if (bad != nullptr) *bad = nullptr;
    int err = 0;
    if (f().injected("ibv_post_send", err)) {
      if (bad != nullptr) *bad = wr;
      return err;
    }
    if (!qp_ok(qp, "ibv_post_send") || bad == nullptr || wr == nullptr) return EINVAL;
    auto& info = f().qps_[qp];
    const bool iwarp = on_iwarp(qp->context);
    for (; wr != nullptr; wr = wr->next) {
      auto refuse = [&](int rc) {
        *bad = wr;
        return iwarp ? -rc : rc;
      };
      if (iwarp && iwarp_refuses(*wr)) return refuse(EINVAL);
      if (info.state == QpState::init) return refuse(EINVAL);  // rxe: not in RTS
      if (wr->opcode == IBV_WR_BIND_MW) {  // rxe's validate_send_wr
        if (wr->num_sge != 0 || wr->imm_data != 0 || qp->qp_type != IBV_QPT_RC) return refuse(EINVAL);
        if (info.sends.size() >= info.cap.max_send_wr) return refuse(ENOMEM);
        post_bind(qp, info, *wr);
        continue;
      }
      if (wr->num_sge < 0 || static_cast<std::uint32_t>(wr->num_sge) > info.cap.max_send_sge ||
          (wr->num_sge > 0 && wr->sg_list == nullptr))
        return refuse(EINVAL);
      const std::uint32_t length = total_length(wr->sg_list, wr->num_sge);
      const bool inline_data = (wr->send_flags & IBV_SEND_INLINE) != 0;
      if (inline_data && length > info.cap.max_inline_data) return refuse(EINVAL);
      if (info.sends.size() >= info.cap.max_send_wr) return refuse(ENOMEM);
      PostedWr posted;
      posted.queue = PostedWr::Queue::send;
      posted.qp_num = qp->qp_num;
      posted.wr_id = wr->wr_id;
      posted.opcode = wr->opcode;
      posted.send_flags = wr->send_flags;
      posted.sge.assign(wr->sg_list, wr->sg_list + wr->num_sge);
      if (wr->opcode == IBV_WR_RDMA_WRITE || wr->opcode == IBV_WR_RDMA_WRITE_WITH_IMM ||
          wr->opcode == IBV_WR_RDMA_READ) {
        posted.remote_addr = wr->wr.rdma.remote_addr;
        posted.rkey = wr->wr.rdma.rkey;
      }
      if (wr->opcode == IBV_WR_RDMA_WRITE_WITH_IMM || wr->opcode == IBV_WR_SEND_WITH_IMM)
        posted.imm_data = wr->imm_data;
      for (const ibv_sge& sge : posted.sge) {
        if (inline_data) {  // the data is copied now; the lkey is not looked at
          const auto* p = reinterpret_cast<const std::byte*>(static_cast<std::uintptr_t>(sge.addr));
          posted.inline_data.insert(posted.inline_data.end(), p, p + sge.length);
        } else if (!f().sge_ok(qp->pd, sge, wr->opcode == IBV_WR_RDMA_READ)) {
          posted.local_ok = false;
        }
      }
      Outstanding out{wr->wr_id, wr->opcode, (wr->send_flags & IBV_SEND_SIGNALED) != 0,
                      posted.local_ok, length, posted.sge};
      f().posted_.push_back(std::move(posted));
      if (info.state == QpState::error) {  // flushed at once
        f().complete_one(qp, out, qp->send_cq, IBV_WC_WR_FLUSH_ERR, false);
        continue;
      }
      info.sends.push_back(std::move(out));
    }
    return 0;
  }

  // A bind accepted by ibv_post_send: rxe executes it when its requester reaches it; here
  // at once (the window is bound), while its completion waits for complete_sends. A bind
  // the kernel refuses completes with IBV_WC_MW_BIND_ERR and breaks the connection: rpmapp
  // must never post one, so it is recorded as a failure (and completes that way). So does
  // a bind whose window is deallocated before the bind completed (dealloc_mw).
  static void post_bind(ibv_qp* qp, QpInfo& info, const ibv_send_wr& wr) {
    PostedWr posted;
    posted.queue = PostedWr::Queue::send;
    posted.qp_num = qp->qp_num;
    posted.wr_id = wr.wr_id;
    posted.opcode = wr.opcode;
    posted.send_flags = wr.send_flags;
    posted.rkey = wr.bind_mw.rkey;
    posted.mw = wr.bind_mw.mw;
    posted.bind_mr = wr.bind_mw.bind_info.mr;
    posted.bind_addr = wr.bind_mw.bind_info.addr;
    posted.bind_length = wr.bind_mw.bind_info.length;
    posted.bind_access = wr.bind_mw.bind_info.mw_access_flags;
    Outstanding out{wr.wr_id, wr.opcode, (wr.send_flags & IBV_SEND_SIGNALED) != 0, true, 0, {}, wr.bind_mw.mw};
    f().posted_.push_back(posted);
    if (info.state == QpState::error) {  // flushed at once, the window left as it was
      f().complete_one(qp, out, qp->send_cq, IBV_WC_WR_FLUSH_ERR, false);
      return;
    }
    if (const std::string why = f().bind_refusal(qp, wr); !why.empty()) {
      f().note("ibv_post_send: a bind the kernel refuses: " + why);
      out.local_ok = false;
    } else {
      Window& w = *f().window_of(wr.bind_mw.mw);
      w.rkey = (w.rkey & ~0xffu) | (wr.bind_mw.rkey & 0xffu);
      w.bound = true;
      w.qp = w.type == IBV_MW_TYPE_2 ? qp : nullptr;
      w.mr = wr.bind_mw.bind_info.mr;
      w.addr = wr.bind_mw.bind_info.addr;
      w.length = wr.bind_mw.bind_info.length;
      w.access = wr.bind_mw.bind_info.mw_access_flags;
    }
    info.sends.push_back(std::move(out));
  }

  static ibv_mw* alloc_mw(ibv_pd* pd, ibv_mw_type type) {
    auto lock = f().lock();
    if (fails("ibv_alloc_mw")) return nullptr;
    if (!f().pds_.count(pd)) {
      f().note("ibv_alloc_mw: pd not alive");
      errno = EINVAL;
      return nullptr;
    }
    // libibverbs: EOPNOTSUPP when the provider has no alloc_mw (siw)
    const unsigned caps = f().caps_[f().device_of_context(pd->context)].device_cap_flags;
    if (!(caps & IBV_DEVICE_MEM_WINDOW)) {
      errno = EOPNOTSUPP;
      return nullptr;
    }
    if (type != IBV_MW_TYPE_1 && type != IBV_MW_TYPE_2) {
      errno = EINVAL;
      return nullptr;
    }
    auto* mw = new ibv_mw{};
    mw->context = pd->context;
    mw->pd = pd;
    mw->type = type;
    // rxe_alloc_mw: the pool index, then a random byte (here a fixed one: the key's low
    // byte is rpmapp's to choose at the bind)
    mw->rkey = (f().next_mw_index_++ << 8) | 0x5a;
    mw->handle = mw->rkey;
    Window w;
    w.mw = mw;
    w.type = type;
    w.pd = pd;
    w.rkey = mw->rkey;
    f().windows_.push_back(w);
    f().created("mw");
    return mw;
  }

  static int dealloc_mw(ibv_mw* mw) {
    auto lock = f().lock();
    int err = 0;
    bool failed = f().injected("ibv_dealloc_mw", err);
    auto it = std::find_if(f().windows_.begin(), f().windows_.end(),
                           [&](const Window& w) { return w.mw == mw; });
    if (it == f().windows_.end()) {
      f().note("ibv_dealloc_mw: memory window not alive");
      return EINVAL;
    }
    // rxe_dealloc_mw: always succeeds, unbinding it (an injected failure still releases
    // it). A bind of it not yet completed would find no window: it fails (MW_BIND_ERR).
    for (auto& [qp, info] : f().qps_)
      for (Outstanding& wr : info.sends)
        if (wr.opcode == IBV_WR_BIND_MW && wr.mw == mw) wr.local_ok = false;
    f().windows_.erase(it);
    f().destroyed("mw");
    delete mw;
    return failed ? err : 0;
  }

  static ssize_t getrandom(void* buf, size_t n, unsigned int flags) {
    auto lock = f().lock();
    if (fails("getrandom")) return -1;
    if (flags & ~(GRND_NONBLOCK | GRND_RANDOM)) {
      errno = EINVAL;
      return -1;
    }
    auto* out = static_cast<std::uint8_t*>(buf);
    std::size_t given = 0;
    for (; given < n && !f().random_bytes_.empty(); ++given) {
      out[given] = f().random_bytes_.front();
      f().random_bytes_.pop_front();
    }
    if (given == n) return static_cast<ssize_t>(n);
    const ssize_t rest = ::getrandom(out + given, n - given, flags);
    return rest < 0 ? rest : static_cast<ssize_t>(given) + rest;
  }

  // One receive into `queue` (a QP's or an SRQ's): ENOMEM when full.
  static int post_one_recv(const ibv_pd* pd, ibv_recv_wr* wr, std::uint32_t max_wr,
                           std::uint32_t max_sge, std::deque<Outstanding>& queue,
                           PostedWr posted) {
    if (wr->num_sge < 0 || static_cast<std::uint32_t>(wr->num_sge) > max_sge ||
        (wr->num_sge > 0 && wr->sg_list == nullptr) || (wr->num_sge == 0 && on_iwarp(pd->context)))
      return EINVAL;
    if (queue.size() >= max_wr) return ENOMEM;
    posted.wr_id = wr->wr_id;
    posted.sge.assign(wr->sg_list, wr->sg_list + wr->num_sge);
    for (const ibv_sge& sge : posted.sge)
      if (!f().sge_ok(pd, sge, true)) posted.local_ok = false;
    queue.push_back({wr->wr_id, -1, true, posted.local_ok,
                     total_length(wr->sg_list, wr->num_sge), posted.sge});
    f().posted_.push_back(std::move(posted));
    return 0;
  }

  static int post_recv(ibv_qp* qp, ibv_recv_wr* wr, ibv_recv_wr** bad) {
    auto lock = f().lock();
    if (bad != nullptr) *bad = nullptr;
    int err = 0;
    if (f().injected("ibv_post_recv", err)) {
      if (bad != nullptr) *bad = wr;
      return err;
    }
    if (!qp_ok(qp, "ibv_post_recv") || bad == nullptr || wr == nullptr) return EINVAL;
    auto& info = f().qps_[qp];
    if (qp->srq != nullptr) {  // rxe: a QP with an SRQ has no receive queue
      *bad = wr;
      return EINVAL;
    }
    const bool iwarp = on_iwarp(qp->context);
    for (; wr != nullptr; wr = wr->next) {
      PostedWr posted;
      posted.queue = PostedWr::Queue::recv;
      posted.qp_num = qp->qp_num;
      const std::size_t before = info.recvs.size();
      if (int rc = post_one_recv(qp->pd, wr, info.cap.max_recv_wr, info.cap.max_recv_sge,
                                 info.recvs, std::move(posted));
          rc != 0) {
        *bad = wr;
        return iwarp ? -rc : rc;
      }
      if (info.state == QpState::error && info.recvs.size() > before) {
        Outstanding out = std::move(info.recvs.back());
        info.recvs.pop_back();
        f().complete_one(qp, out, qp->recv_cq, IBV_WC_WR_FLUSH_ERR, true);
      }
    }
    return 0;
  }

  static int post_srq_recv(ibv_srq* srq, ibv_recv_wr* wr, ibv_recv_wr** bad) {
    auto lock = f().lock();
    if (bad != nullptr) *bad = nullptr;
    int err = 0;
    if (f().injected("ibv_post_srq_recv", err)) {
      if (bad != nullptr) *bad = wr;
      return err;
    }
    if (!f().srqs_.count(srq)) {
      f().note("ibv_post_srq_recv: shared receive queue not alive");
      return EINVAL;
    }
    if (bad == nullptr || wr == nullptr) return EINVAL;
    auto& info = f().srqs_[srq];
    for (; wr != nullptr; wr = wr->next) {
      PostedWr posted;
      posted.queue = PostedWr::Queue::srq;
      posted.srq = srq;
      const bool iwarp = on_iwarp(srq->context);
      if (int rc = post_one_recv(srq->pd, wr, info.max_wr, info.max_sge, info.recvs, std::move(posted));
          rc != 0) {
        *bad = wr;
        return iwarp ? -rc : rc;
      }
    }
    return 0;
  }

  // The extended QP's ibv_wr_start .. ibv_wr_complete (one work request): the checks rxe
  // and the system table's wrapper make (`has_op`: the QP was created for the operation),
  // then `fill` completes the PostedWr and the request is queued (flushed at once on a QP
  // in error).
  template <class Fill>
  static int post_extended(ibv_qp* qp, bool QpInfo::*has_op, uint64_t wr_id, unsigned send_flags,
                           uint32_t rkey, uint64_t remote_addr, int opcode, std::uint32_t byte_len,
                           Fill fill) {
    auto lock = f().lock();
    int err = 0;
    if (f().injected("ibv_wr_complete", err)) return err;
    if (!qp_ok(qp, "ibv_wr_complete")) return EINVAL;
    auto& info = f().qps_[qp];
    if (!(info.*has_op)) return EOPNOTSUPP;  // as the system table's wrapper
    if (info.state == QpState::init) return EINVAL;
    if (info.sends.size() >= info.cap.max_send_wr) return ENOSPC;  // rxe's check_qp_queue_full
    PostedWr posted;
    posted.queue = PostedWr::Queue::send;
    posted.qp_num = qp->qp_num;
    posted.wr_id = wr_id;
    posted.opcode = opcode;
    posted.send_flags = send_flags;
    posted.remote_addr = remote_addr;
    posted.rkey = rkey;
    if (int refused = fill(posted); refused != 0) return refused;
    f().posted_.push_back(std::move(posted));
    Outstanding out{wr_id, opcode, (send_flags & IBV_SEND_SIGNALED) != 0, true, byte_len, {}};
    if (info.state == QpState::error) f().complete_one(qp, out, qp->send_cq, IBV_WC_WR_FLUSH_ERR, false);
    else info.sends.push_back(std::move(out));
    return 0;
  }

  static int post_atomic_write(ibv_qp* qp, uint64_t wr_id, unsigned send_flags, uint32_t rkey,
                               uint64_t remote_addr, const void* src8) {
    return post_extended(qp, &QpInfo::atomic_write, wr_id, send_flags, rkey, remote_addr,
                         rpmapp::detail::native_atomic_write_abi::wr_atomic_write, 8, [&](PostedWr& posted) {
                           posted.native_atomic = true;
                           const auto* p = static_cast<const std::byte*>(src8);
                           posted.inline_data.assign(p, p + 8);
                           return 0;
                         });
  }

  static int post_flush(ibv_qp* qp, uint64_t wr_id, unsigned send_flags, uint32_t rkey,
                        uint64_t remote_addr, size_t len, uint8_t type, uint8_t level) {
    namespace abi = rpmapp::detail::native_flush_abi;
    return post_extended(qp, &QpInfo::flush, wr_id, send_flags, rkey, remote_addr, abi::wr_flush, 0,
                         [&](PostedWr& posted) {
                           // the values verbs.h defines: one type bit (GLOBAL or
                           // PERSISTENT), level RANGE (0) or MR (1); not checked against rxe
                           if ((type != abi::type_global && type != abi::type_persistent) || level > 1)
                             return EINVAL;
                           posted.native_flush = true;
                           posted.flush_len = len;
                           posted.flush_type = type;
                           posted.flush_level = level;
                           return 0;
                         });
  }

  static int poll_cq(ibv_cq* cq, int n, ibv_wc* out) {
    auto lock = f().lock();
    int err = 0;
    if (f().injected("ibv_poll_cq", err)) return -err;  // providers return a negative value
    if (!f().cqs_.count(cq)) {
      f().note("ibv_poll_cq: cq not alive");
      return -EINVAL;
    }
    auto& info = f().cqs_[cq];
    if (info.poll_result) {
      const int result = *info.poll_result;
      info.poll_result.reset();
      return result;
    }
    int taken = 0;
    while (taken < n && !info.wcs.empty()) {
      out[taken++] = info.wcs.front();
      info.wcs.pop_front();
    }
    if (taken == 0 && info.after_empty_poll) {
      ibv_wc wc = *info.after_empty_poll;
      info.after_empty_poll.reset();
      f().push_wc(cq, wc);
    }
    return taken;
  }

  static int get_cq_event(ibv_comp_channel* ch, ibv_cq** cq, void** context) {
    auto lock = f().lock();
    if (fails("ibv_get_cq_event")) return -1;
    if (!f().comp_channels_.count(ch)) {
      f().note("ibv_get_cq_event: completion channel not alive");
      errno = EINVAL;
      return -1;
    }
    auto& info = f().comp_channels_[ch];
    if (info.events.empty()) {
      if (info.nonblocking) {
        errno = EAGAIN;
        return -1;
      }
      const bool got = f().changed_.wait_for(lock, f().watchdog, [&] {
        auto it = f().comp_channels_.find(ch);
        return it == f().comp_channels_.end() || !it->second.events.empty();
      });
      if (!got) {
        f().note("ibv_get_cq_event blocked on an empty blocking channel: a hang in production");
        errno = ETIME;
        return -1;
      }
      if (!f().comp_channels_.count(ch)) {
        errno = EBADF;
        return -1;
      }
    }
    auto& events = f().comp_channels_[ch].events;
    ibv_cq* fired = events.front();
    events.pop_front();
    ++f().cqs_[fired].unacked;
    f().created("unacked_cq_event");
    *cq = fired;
    if (context != nullptr) *context = fired->cq_context;
    return 0;
  }

  static void ack_cq_events(ibv_cq* cq, unsigned int n) {
    auto lock = f().lock();
    f().calls_.emplace_back("ibv_ack_cq_events");
    auto it = f().cqs_.find(cq);
    if (it == f().cqs_.end()) return f().note("ibv_ack_cq_events: cq not alive");
    if (n > it->second.unacked) return f().note("ibv_ack_cq_events: more events than delivered");
    it->second.unacked -= n;
    f().alive_["unacked_cq_event"] -= n;
    f().acked_cq_events_ += n;
  }

  static ibv_srq* create_srq(ibv_pd* pd, ibv_srq_init_attr* attr) {
    auto lock = f().lock();
    if (fails("ibv_create_srq")) return nullptr;
    if (!f().pds_.count(pd) || attr == nullptr) {
      f().note("ibv_create_srq: pd not alive or no attributes");
      errno = EINVAL;
      return nullptr;
    }
    const DeviceCaps& limits = f().caps_[f().device_of_context(pd->context)];
    if (attr->attr.max_wr == 0 || attr->attr.max_wr > static_cast<std::uint32_t>(limits.max_srq_wr) ||
        attr->attr.max_sge == 0) {
      errno = EINVAL;
      return nullptr;
    }
    auto* srq = new ibv_srq{};
    srq->context = pd->context;
    srq->pd = pd;
    srq->srq_context = attr->srq_context;
    auto& info = f().srqs_[srq];
    info.max_wr = attr->attr.max_wr;
    info.max_sge = attr->attr.max_sge;
    f().created("srq");
    return srq;
  }

  static int destroy_srq(ibv_srq* srq) {
    auto lock = f().lock();
    int err = 0;
    bool failed = f().injected("ibv_destroy_srq", err);
    if (!f().srqs_.count(srq)) {
      f().note("ibv_destroy_srq: shared receive queue not alive");
      return EINVAL;
    }
    for (auto& [qp, info] : f().qps_)
      if (qp->srq == srq) {
        if (!f().refuse_for_survivor(srq, "srq"))
          f().note("ibv_destroy_srq: a queue pair still uses the shared receive queue");
        return EBUSY;
      }
    f().srqs_.erase(srq);
    f().destroyed("srq");
    delete srq;
    return failed ? err : 0;
  }

  // ---- epoll and eventfd (fs/eventpoll.c, fs/eventfd.c)

  static bool real_open(int fd) { return fd >= 0 && ::fcntl(fd, F_GETFD) != -1; }

  static int epoll_create1(int flags) {
    auto lock = f().lock();
    if (fails("epoll_create1")) return -1;
    if ((flags & ~EPOLL_CLOEXEC) != 0) {
      errno = EINVAL;
      return -1;
    }
    const int fd = f().next_fd_++;
    f().epolls_[fd];
    f().created("epoll");
    return fd;
  }

  static int epoll_ctl(int epfd, int op, int fd, epoll_event* event) {
    auto lock = f().lock();
    if (fails("epoll_ctl")) return -1;
    // The kernel's do_epoll_ctl, in its order.
    if (op != EPOLL_CTL_DEL && event == nullptr) {
      errno = EFAULT;
      return -1;
    }
    const FdKind epfd_kind = f().fake_kind(epfd);
    if (epfd_kind == FdKind::none && !real_open(epfd)) {
      f().note("epoll_ctl: epfd is not an open fd");
      errno = EBADF;
      return -1;
    }
    const FdKind kind = f().fake_kind(fd);
    const bool real = kind == FdKind::none;
    if (real) {  // the kernel itself says whether it is open and can be polled
      epoll_event probe{EPOLLIN, {}};
      if (::epoll_ctl(f().probe_epoll_, EPOLL_CTL_ADD, fd, &probe) != 0) {
        if (errno == EBADF || errno == EPERM) return -1;
        f().note("epoll_ctl: probing the real fd failed unexpectedly");
        return -1;
      }
      ::epoll_ctl(f().probe_epoll_, EPOLL_CTL_DEL, fd, nullptr);
    }
    if (epfd == fd || epfd_kind != FdKind::epoll) {
      if (epfd_kind != FdKind::epoll) f().note("epoll_ctl: epfd is not an epoll fd of the fake");
      errno = EINVAL;
      return -1;
    }
    if (kind == FdKind::epoll) {
      f().note("epoll_ctl: an epoll fd inside an epoll set is not modelled");
      errno = EINVAL;
      return -1;
    }
    if (op != EPOLL_CTL_DEL && (event->events & (EPOLLEXCLUSIVE | EPOLLWAKEUP))) {
      f().note("epoll_ctl: EPOLLEXCLUSIVE / EPOLLWAKEUP are not modelled");
      errno = EINVAL;
      return -1;
    }
    auto& set = f().epolls_[epfd];
    auto it = set.find(fd);
    switch (op) {
      case EPOLL_CTL_ADD:
        if (it != set.end()) {
          errno = EEXIST;
          return -1;
        }
        it = set.emplace(fd, Watch{}).first;
        it->second.real = real;
        break;
      case EPOLL_CTL_MOD:
        if (it == set.end()) {
          errno = ENOENT;
          return -1;
        }
        break;
      case EPOLL_CTL_DEL:
        if (it == set.end()) {
          errno = ENOENT;
          return -1;
        }
        set.erase(it);
        return 0;
      default:
        errno = EINVAL;
        return -1;
    }
    if (real && (event->events & EPOLLET))
      f().note("epoll_ctl: EPOLLET on a real fd is not modelled (treated as level-triggered)");
    // ep_insert / ep_modify: store, re-arm, and queue it if it is ready now.
    Watch& w = it->second;
    w.events = event->events | EPOLLERR | EPOLLHUP;
    w.data = event->data;
    w.armed = true;
    w.edge_pending = true;
    w.order = ++f().next_order_;
    f().changed_.notify_all();
    return 0;
  }

  static int epoll_wait(int epfd, epoll_event* events, int maxevents, int timeout_ms) {
    using clock = std::chrono::steady_clock;
    auto lock = f().lock();
    if (fails("epoll_wait")) return -1;
    // The kernel's do_epoll_wait, in its order.
    if (maxevents <= 0 || static_cast<std::size_t>(maxevents) > INT_MAX / sizeof(epoll_event)) {
      errno = EINVAL;
      return -1;
    }
    if (events == nullptr) {
      errno = EFAULT;
      return -1;
    }
    const FdKind kind = f().fake_kind(epfd);
    if (kind != FdKind::epoll) {
      const bool open = kind != FdKind::none || real_open(epfd);
      f().note(open ? "epoll_wait: epfd is not an epoll fd of the fake"
                    : "epoll_wait: epfd is not an open fd");
      errno = open ? EINVAL : EBADF;
      return -1;
    }
    const auto limit = timeout_ms < 0 ? f().watchdog : std::chrono::milliseconds(timeout_ms);
    const auto deadline = clock::now() + limit;
    for (;;) {
      const int n = f().collect_ready(epfd, events, maxevents);
      if (n < 0) {
        f().note("epoll_wait: the epoll fd was closed while waiting on it");
        errno = EBADF;
        return -1;
      }
      if (n > 0) return n;
      const auto now = clock::now();
      if (now >= deadline) break;
      auto slice = std::chrono::duration_cast<clock::duration>(deadline - now);
      // Nothing signals a real fd becoming ready: look again soon.
      if (f().watches_real_fd(epfd))
        slice = std::min<clock::duration>(slice, std::chrono::milliseconds(1));
      f().changed_.wait_for(lock, slice);
    }
    if (timeout_ms < 0) {
      f().note("epoll_wait waited forever with nothing ready: a hang in production");
      errno = ETIME;
      return -1;
    }
    return 0;
  }

  static int eventfd(unsigned int initval, int flags) {
    auto lock = f().lock();
    if (fails("eventfd")) return -1;
    if ((flags & ~(EFD_CLOEXEC | EFD_NONBLOCK | EFD_SEMAPHORE)) != 0) {
      errno = EINVAL;
      return -1;
    }
    const int fd = f().next_fd_++;
    auto& e = f().eventfds_[fd];
    e.count = initval;
    e.nonblocking = (flags & EFD_NONBLOCK) != 0;
    e.semaphore = (flags & EFD_SEMAPHORE) != 0;
    f().created("eventfd");
    return fd;
  }

  // Waits (the mutex released) until `ok` holds for eventfd `fd` or it is closed; -1 with
  // errno when it cannot go on (non-blocking, the watchdog, closed meanwhile).
  template <class Ok>
  static int wait_eventfd(FakeProvider::Lock& lock, int fd, const char* call, Ok ok) {
    if (ok(f().eventfds_[fd])) return 0;
    if (f().eventfds_[fd].nonblocking) {
      errno = EAGAIN;
      return -1;
    }
    const bool done = f().changed_.wait_for(lock, f().watchdog, [&] {
      auto it = f().eventfds_.find(fd);
      return it == f().eventfds_.end() || ok(it->second);
    });
    if (!done) {
      f().note(std::string(call) + " blocked on an eventfd: a hang in production");
      errno = ETIME;
      return -1;
    }
    if (!f().eventfds_.count(fd)) {
      f().note(std::string(call) + ": the eventfd was closed while waiting on it");
      errno = EBADF;
      return -1;
    }
    return 0;
  }

  static bool channel_fd_misuse(FdKind kind, const char* call) {
    if (kind != FdKind::event_channel && kind != FdKind::comp_channel) return false;
    f().note(std::string(call) + ": the fd of a channel belongs to librdmacm / libibverbs");
    return true;
  }

  static int pthread_create(pthread_t* thread, void* (*run)(void*), void* arg) {
    auto lock = f().lock();
    if (fails("pthread_create")) return errno;
    lock.unlock();
    return rpmapp::detail::system_provider.pthread_create(thread, run, arg);
  }

  static ssize_t read(int fd, void* buf, size_t n) {
    auto lock = f().lock();
    if (fails("read")) return -1;
    const FdKind kind = f().fake_kind(fd);
    if (kind == FdKind::none) {
      lock.unlock();  // it may block
      return ::read(fd, buf, n);
    }
    if (kind != FdKind::eventfd) {  // an epoll file has no read; a channel's is librdmacm's
      if (!channel_fd_misuse(kind, "read")) f().note("read: of an epoll fd");
      errno = EINVAL;
      return -1;
    }
    if (n < sizeof(std::uint64_t)) {
      errno = EINVAL;
      return -1;
    }
    if (wait_eventfd(lock, fd, "read", [](const EventFd& e) { return e.count != 0; }) != 0)
      return -1;
    auto& e = f().eventfds_[fd];
    const std::uint64_t value = e.semaphore ? 1 : e.count;
    e.count -= value;
    std::memcpy(buf, &value, sizeof value);
    f().wakeup(fd);  // writers (EPOLLOUT)
    return sizeof value;
  }

  static ssize_t write(int fd, const void* buf, size_t n) {
    auto lock = f().lock();
    if (fails("write")) return -1;
    const FdKind kind = f().fake_kind(fd);
    if (kind == FdKind::none) {
      lock.unlock();
      return ::write(fd, buf, n);
    }
    if (kind != FdKind::eventfd) {
      if (!channel_fd_misuse(kind, "write")) f().note("write: to an epoll fd");
      errno = EINVAL;
      return -1;
    }
    constexpr std::uint64_t max = std::numeric_limits<std::uint64_t>::max();
    std::uint64_t value = 0;
    if (n < sizeof value) {
      errno = EINVAL;
      return -1;
    }
    std::memcpy(&value, buf, sizeof value);
    if (value == max) {
      errno = EINVAL;
      return -1;
    }
    if (wait_eventfd(lock, fd, "write", [&](const EventFd& e) { return max - e.count > value; }) != 0)
      return -1;
    f().eventfds_[fd].count += value;
    f().wakeup(fd);
    return sizeof value;
  }

  static int close(int fd) {
    auto lock = f().lock();
    // Linux releases the fd even when close reports an error: so does an injected one.
    const bool failed = fails("close");
    const int err = errno;
    const FdKind kind = f().fake_kind(fd);
    switch (kind) {
      case FdKind::none: {
        f().drop_watches(fd);
        lock.unlock();
        const int rc = ::close(fd);
        if (!failed) return rc;
        errno = err;
        return -1;
      }
      case FdKind::epoll:
        f().epolls_.erase(fd);
        f().destroyed("epoll");
        f().changed_.notify_all();
        break;
      case FdKind::eventfd:
        f().drop_watches(fd);
        f().eventfds_.erase(fd);
        f().destroyed("eventfd");
        break;
      case FdKind::event_channel:
      case FdKind::comp_channel:
        channel_fd_misuse(kind, "close");
        break;
    }
    if (!failed) return 0;
    errno = err;
    return -1;
  }
};

namespace {

// Every successful call leaves sentinel_errno in errno (see fake_provider.hpp).
enum class Ok { zero, non_negative };

template <auto Fn, Ok ok = Ok::zero>
struct Sentinel;

template <class R, class... Args, R (*Fn)(Args...), Ok ok>
struct Sentinel<Fn, ok> {
  static R call(Args... args) {
    if constexpr (std::is_void_v<R>) {
      Fn(args...);
      errno = sentinel_errno;
    } else {
      R result = Fn(args...);
      bool success;
      if constexpr (std::is_pointer_v<R>) success = result != nullptr;
      else success = ok == Ok::non_negative ? result >= 0 : result == 0;
      if (success) errno = sentinel_errno;
      return result;
    }
  }
};

const rpmapp::detail::Provider fake_table = {
    Sentinel<&FakeProvider::Impl::create_event_channel>::call,
    Sentinel<&FakeProvider::Impl::destroy_event_channel>::call,
    Sentinel<&FakeProvider::Impl::create_id>::call,
    Sentinel<&FakeProvider::Impl::destroy_id>::call,
    Sentinel<&FakeProvider::Impl::bind_addr>::call,
    Sentinel<&FakeProvider::Impl::listen>::call,
    Sentinel<&FakeProvider::Impl::resolve_addr>::call,
    Sentinel<&FakeProvider::Impl::resolve_route>::call,
    Sentinel<&FakeProvider::Impl::get_cm_event>::call,
    Sentinel<&FakeProvider::Impl::ack_cm_event>::call,
    Sentinel<&FakeProvider::Impl::migrate_id>::call,
    Sentinel<&FakeProvider::Impl::create_qp>::call,
    Sentinel<&FakeProvider::Impl::destroy_qp>::call,
    Sentinel<&FakeProvider::Impl::accept>::call,
    Sentinel<&FakeProvider::Impl::reject>::call,
    Sentinel<&FakeProvider::Impl::connect>::call,
    Sentinel<&FakeProvider::Impl::disconnect>::call,
    Sentinel<&FakeProvider::Impl::modify_qp>::call,
    Sentinel<&FakeProvider::Impl::get_devices>::call,
    Sentinel<&FakeProvider::Impl::free_devices>::call,
    Sentinel<&FakeProvider::Impl::get_device_list>::call,
    Sentinel<&FakeProvider::Impl::free_device_list>::call,
    Sentinel<&FakeProvider::Impl::alloc_pd>::call,
    Sentinel<&FakeProvider::Impl::dealloc_pd>::call,
    Sentinel<&FakeProvider::Impl::create_comp_channel>::call,
    Sentinel<&FakeProvider::Impl::destroy_comp_channel>::call,
    Sentinel<&FakeProvider::Impl::create_cq>::call,
    Sentinel<&FakeProvider::Impl::destroy_cq>::call,
    Sentinel<&FakeProvider::Impl::req_notify_cq>::call,
    Sentinel<&FakeProvider::Impl::fcntl, Ok::non_negative>::call,
    Sentinel<&FakeProvider::Impl::poll, Ok::non_negative>::call,
    Sentinel<&FakeProvider::Impl::query_device_ex>::call,
    Sentinel<&FakeProvider::Impl::reg_mr>::call,
    Sentinel<&FakeProvider::Impl::dereg_mr>::call,
    Sentinel<&FakeProvider::Impl::advise_mr>::call,
    Sentinel<&FakeProvider::Impl::create_qp_ex>::call,
    Sentinel<&FakeProvider::Impl::post_send>::call,
    Sentinel<&FakeProvider::Impl::post_recv>::call,
    Sentinel<&FakeProvider::Impl::post_srq_recv>::call,
    Sentinel<&FakeProvider::Impl::post_atomic_write>::call,
    Sentinel<&FakeProvider::Impl::post_flush>::call,
    Sentinel<&FakeProvider::Impl::poll_cq, Ok::non_negative>::call,
    Sentinel<&FakeProvider::Impl::get_cq_event>::call,
    Sentinel<&FakeProvider::Impl::ack_cq_events>::call,
    Sentinel<&FakeProvider::Impl::create_srq>::call,
    Sentinel<&FakeProvider::Impl::destroy_srq>::call,
    Sentinel<&FakeProvider::Impl::alloc_mw>::call,
    Sentinel<&FakeProvider::Impl::dealloc_mw>::call,
    Sentinel<&FakeProvider::Impl::getrandom, Ok::non_negative>::call,
    Sentinel<&FakeProvider::Impl::epoll_create1, Ok::non_negative>::call,
    Sentinel<&FakeProvider::Impl::epoll_ctl>::call,
    Sentinel<&FakeProvider::Impl::epoll_wait, Ok::non_negative>::call,
    Sentinel<&FakeProvider::Impl::eventfd, Ok::non_negative>::call,
    Sentinel<&FakeProvider::Impl::read, Ok::non_negative>::call,
    Sentinel<&FakeProvider::Impl::write, Ok::non_negative>::call,
    Sentinel<&FakeProvider::Impl::close>::call,
    Sentinel<&FakeProvider::Impl::pthread_create>::call,
};
}  // namespace

// ------------------------------------------------------------------------------------

FakeProvider::FakeProvider() {
  REQUIRE(g_current == nullptr);
  for (int d = 0; d < device_count; ++d) {
    std::snprintf(devices_[d].name, sizeof devices_[d].name, "fake%d", d);
    contexts_[d].device = &devices_[d];
    foreign_[d].device = &devices_[d];
    cm_contexts_[d] = &contexts_[d];
  }
  probe_epoll_ = ::epoll_create1(EPOLL_CLOEXEC);
  REQUIRE(probe_epoll_ >= 0);
  g_current = this;
  override_ = std::make_unique<rpmapp::detail::ProviderOverride>(fake_table);
}

FakeProvider::~FakeProvider() {
  override_.reset();
  // Free whatever the library leaked (reported by problems()), so ASan reports only
  // the library's own leaks.
  for (auto& [ev, data] : events_) {
    delete data.child;
    delete ev;
  }
  for (auto& [ch, state] : channels_) delete ch;
  for (auto& [id, info] : ids_) delete id;
  for (auto& [x, info] : qps_) delete x;
  for (auto& [x, info] : cqs_) delete x;
  for (auto& [x, info] : comp_channels_) delete x;
  for (auto& [x, access] : mrs_) delete x;
  for (auto& [x, info] : srqs_) delete x;
  for (auto* x : pds_) delete x;
  for (auto* x : device_lists_) delete[] x;
  for (auto* x : ibv_device_lists_) delete[] x;
  ::close(probe_epoll_);
  g_current = nullptr;
}

FakeProvider& FakeProvider::current() { return *g_current; }

ibv_context* FakeProvider::context(int device) {
  auto held = lock();
  return cm_contexts_[device];
}

ibv_context* FakeProvider::foreign_context_locked(int device) {
  return cm_contexts_[device] == &contexts_[device] ? &foreign_[device] : &contexts_[device];
}

ibv_context* FakeProvider::foreign_context(int device) {
  auto held = lock();
  return foreign_context_locked(device);
}

void FakeProvider::swap_contexts(int device) {
  auto held = lock();
  cm_contexts_[device] = foreign_context_locked(device);
}

std::string FakeProvider::address(int device) { return device_addresses[device]; }

void FakeProvider::remove_device(int device) {
  auto held = lock();
  removed_[device] = true;
  ibv_context* context = cm_contexts_[device];
  for (auto& [id, info] : ids_)
    if (id->verbs == context && id->channel != nullptr)
      queue_event(id->channel, make_event(id, RDMA_CM_EVENT_DEVICE_REMOVAL, {}, 0, 0));
}

bool FakeProvider::device_context_closed(int device) const {
  auto held = lock();
  return context_closed_[device];
}

void FakeProvider::librdmacm_closes(int device) {
  if (context_closed_[device]) return;
  ibv_context* context = cm_contexts_[device];
  for (auto& [id, info] : ids_)
    if (id->verbs == context) return;  // ucma_put_device closes it with the last one
  for (ibv_context** list : device_lists_)
    for (ibv_context** entry = list; *entry != nullptr; ++entry)
      if (*entry == context) return;
  context_closed_[device] = true;
  for (ibv_pd* pd : pds_)
    if (pd->context == context)
      note("rdma_get_devices: librdmacm closed the context of removed device " +
           std::string(devices_[device].name) + " while a protection domain of it was alive");
}

void FakeProvider::fail(std::string call, int err, int nth) {
  auto held = lock();
  faults_.push_back({std::move(call), err, nth});
}

bool FakeProvider::injected(const char* call, int& err) {
  calls_.emplace_back(call);
  for (auto it = faults_.begin(); it != faults_.end(); ++it) {
    if (it->call != call) continue;
    if (--it->remaining == 0) {
      err = it->err;
      faults_.erase(it);
      return true;
    }
  }
  return false;
}

std::size_t FakeProvider::pending_faults() const {
  auto held = lock();
  return faults_.size();
}

std::vector<std::string> FakeProvider::calls() const {
  auto held = lock();
  return calls_;
}

std::size_t FakeProvider::mark() const {
  auto held = lock();
  return calls_.size();
}

void FakeProvider::clear_calls() {
  auto held = lock();
  calls_.clear();
}

std::vector<std::string> FakeProvider::failures() const {
  auto held = lock();
  return failures_;
}

bool FakeProvider::id_alive(const rdma_cm_id* id) const {
  auto held = lock();
  return ids_.count(const_cast<rdma_cm_id*>(id)) != 0;
}

std::vector<std::string> FakeProvider::calls_since(std::size_t mark) const {
  auto held = lock();
  return {calls_.begin() + static_cast<std::ptrdiff_t>(mark), calls_.end()};
}

int FakeProvider::device_of_context(const ibv_context* ctx) const {
  for (int d = 0; d < device_count; ++d)
    if (ctx == &contexts_[d] || ctx == &foreign_[d]) return d;
  return -1;
}

FakeProvider::Channel* FakeProvider::channel_by_fd(int fd, rdma_event_channel** out) {
  for (auto& [ch, state] : channels_)
    if (ch->fd == fd) {
      if (out) *out = ch;
      return &state;
    }
  return nullptr;
}

int FakeProvider::resolve_device(const sockaddr* dst) const {
  if (dst->sa_family == AF_INET6) {  // fe80::77:* through fake0, fe80::78:* through fake1
    const auto* sin6 = reinterpret_cast<const sockaddr_in6*>(dst);
    if (!IN6_IS_ADDR_LINKLOCAL(&sin6->sin6_addr) || sin6->sin6_scope_id == 0) return -1;
    sockaddr_storage own{};
    for (int d = 0; d < device_count; ++d) {
      set_sockaddr(own, device_addresses6[d], 0);
      const auto& own6 = reinterpret_cast<const sockaddr_in6*>(&own)->sin6_addr;
      if (std::memcmp(&sin6->sin6_addr, &own6, 14) == 0) return d;  // all but the last group
    }
    return -1;
  }
  if (dst->sa_family != AF_INET) return -1;
  std::uint32_t a = ntohl(reinterpret_cast<const sockaddr_in*>(dst)->sin_addr.s_addr);
  for (int d = 0; d < device_count; ++d) {
    std::uint32_t own = ntohl(ipv4(device_addresses[d]).s_addr);
    if ((a & 0xffffff00u) == (own & 0xffffff00u)) return d;
  }
  return -1;
}

rdma_cm_event* FakeProvider::make_event(rdma_cm_id* id, rdma_cm_event_type type,
                                        std::string_view data, std::size_t pad_to,
                                        int status) {
  auto* ev = new rdma_cm_event{};
  ev->id = id;
  ev->event = type;
  ev->status = status;
  auto& owned = events_[ev];
  if (!data.empty() || pad_to != 0) {
    const auto* p = reinterpret_cast<const std::byte*>(data.data());
    owned.data.assign(p, p + data.size());
    if (owned.data.size() < pad_to) owned.data.resize(pad_to, std::byte{0});
    ev->param.conn.private_data = owned.data.data();
    ev->param.conn.private_data_len = static_cast<std::uint8_t>(owned.data.size());
  }
  return ev;
}

void FakeProvider::queue_event(rdma_event_channel* ch, rdma_cm_event* ev) {
  channels_[ch].queue.push_back(ev);
  wakeup(ch->fd);
}

void FakeProvider::discard_event(rdma_cm_event* ev) {
  auto it = events_.find(ev);
  if (it != events_.end()) {
    delete it->second.child;  // a request never taken: librdmacm never made its id
    events_.erase(it);
  }
  delete ev;
}

void FakeProvider::deliver_held() {
  auto guard = lock();
  auto held = std::move(held_);
  held_.clear();
  for (auto& [ch, ev] : held) {
    if (channels_.count(ch)) queue_event(ch, ev);
    else discard_event(ev);
  }
}

void FakeProvider::inject_connect_request(int listener_fd, const Request& request) {
  auto held = lock();
  rdma_event_channel* ch = nullptr;
  REQUIRE(channel_by_fd(listener_fd, &ch) != nullptr);
  rdma_cm_id* listener = nullptr;
  for (auto& [id, info] : ids_)
    if (id->channel == ch && info.listening) listener = id;
  REQUIRE(listener != nullptr);
  auto* child = new rdma_cm_id{};
  child->channel = ch;
  child->ps = RDMA_PS_TCP;
  child->verbs = cm_contexts_[request.device];
  child->context = listener->context;  // librdmacm: a request's id takes its listener's context
  sockaddr_storage local{}, remote{};
  // An IPv6 request has IPv6 addresses, without scope ids (the kernel's cma_save_ip6_info).
  set_sockaddr(remote, request.peer, request.peer_port);
  set_sockaddr(local, remote.ss_family == AF_INET6 ? device_addresses6[request.device]
                                                   : device_addresses[request.device],
               ids_[listener].port);
  std::memcpy(&child->route.addr.src_storage, &local, sizeof local);
  std::memcpy(&child->route.addr.dst_storage, &remote, sizeof remote);
  auto* ev = make_event(child, RDMA_CM_EVENT_CONNECT_REQUEST, request.private_data, pad_on(child, connect_pad), 0);
  ev->listen_id = listener;
  events_[ev].child = child;
  queue_event(ch, ev);
}

void FakeProvider::inject_event(int fd, rdma_cm_event_type type, std::string_view data,
                                int status, bool pad) {
  auto held = lock();
  rdma_event_channel* ch = nullptr;
  REQUIRE(channel_by_fd(fd, &ch) != nullptr);
  rdma_cm_id* target = nullptr;
  for (auto& [id, info] : ids_)
    if (id->channel == ch) target = id;
  REQUIRE(target != nullptr);
  queue_event(ch, make_event(target, type, data, event_pad(target, type, pad), status));
}

void FakeProvider::inject_event_on_qp(std::uint32_t qp_num, rdma_cm_event_type type, std::string_view data,
                                      int status, bool pad) {
  auto held = lock();
  rdma_cm_id* target = nullptr;
  for (auto& [id, info] : ids_)
    if (id->qp != nullptr && id->qp->qp_num == qp_num) target = id;
  REQUIRE(target != nullptr);
  REQUIRE(target->channel != nullptr);
  queue_event(target->channel, make_event(target, type, data, event_pad(target, type, pad), status));
}

std::size_t FakeProvider::queued(int fd) const {
  auto held = lock();
  for (auto& [ch, state] : channels_)
    if (ch->fd == fd) return state.queue.size();
  return 0;
}

void FakeProvider::set_nonblocking(int fd, bool on) {
  auto held = lock();
  auto* ch = channel_by_fd(fd);
  REQUIRE(ch != nullptr);
  ch->nonblocking = on;
}

bool FakeProvider::nonblocking(int fd) const {
  auto held = lock();
  for (auto& [ch, state] : channels_)
    if (ch->fd == fd) return state.nonblocking;
  FAIL("no live event channel has fd " << fd);
  return false;
}

void FakeProvider::take_after_poll(int fd, int times) {
  auto held = lock();
  auto* ch = channel_by_fd(fd);
  REQUIRE(ch != nullptr);
  ch->take_after_poll = times;
}

void FakeProvider::rendezvous_polls(int fd, int pollers) {
  auto held = lock();
  auto* ch = channel_by_fd(fd);
  REQUIRE(ch != nullptr);
  ch->rendezvous = pollers;
  ch->arrived = 0;
}

std::size_t FakeProvider::taken_after_poll() const {
  auto held = lock();
  return taken_after_poll_;
}

void FakeProvider::inject_internal_event(int fd) {
  auto held = lock();
  rdma_event_channel* ch = nullptr;
  REQUIRE(channel_by_fd(fd, &ch) != nullptr);
  auto* ev = make_event(nullptr, RDMA_CM_EVENT_CONNECT_ERROR, {}, 0, 0);
  events_[ev].internal = true;
  queue_event(ch, ev);
}

bool FakeProvider::wait_for_event(Lock& held, rdma_event_channel* ch,
                                  std::chrono::milliseconds limit) {
  return changed_.wait_for(held, limit, [&] {
    auto it = channels_.find(ch);
    return it == channels_.end() || !it->second.queue.empty();
  });
}

bool FakeProvider::refuse_for_survivor(const void* object, const char* kind) {
  for (ibv_qp* qp : survivors_) {
    const bool held = qp->pd == object || qp->srq == object || qp->send_cq == object ||
                      qp->recv_cq == object ||
                      (qp->send_cq != nullptr && qp->send_cq->channel == object) ||
                      (qp->recv_cq != nullptr && qp->recv_cq->channel == object);
    if (held) {
      refused_.emplace(object, kind);
      return true;
    }
  }
  return false;
}

long FakeProvider::refused(const std::string& kind) const {
  auto held = lock();
  return std::count_if(refused_.begin(), refused_.end(),
                       [&](const auto& entry) { return entry.second == kind; });
}

void FakeProvider::close_contexts() {
  auto held = lock();
  for (ibv_qp* qp : survivors_) {
    qps_.erase(qp);
    delete qp;
    destroyed("qp");
  }
  survivors_.clear();
  // The CQs before the channels they hold a reference to.
  for (const char* kind : {"cq", "srq", "comp_channel", "pd"})
    for (auto it = refused_.begin(); it != refused_.end();) {
      if (it->second != kind) {
        ++it;
        continue;
      }
      void* object = const_cast<void*>(it->first);
      if (it->second == std::string("cq")) {
        auto* cq = static_cast<ibv_cq*>(object);
        if (cq->channel) --cq->channel->refcnt;
        cqs_.erase(cq);
        delete cq;
      } else if (it->second == std::string("srq")) {
        auto* srq = static_cast<ibv_srq*>(object);
        srqs_.erase(srq);
        delete srq;
      } else if (it->second == std::string("comp_channel")) {
        auto* ch = static_cast<ibv_comp_channel*>(object);
        drop_watches(ch->fd);
        comp_channels_.erase(ch);
        delete ch;
      } else {
        auto* pd = static_cast<ibv_pd*>(object);
        pds_.erase(pd);
        delete pd;
      }
      destroyed(it->second);
      it = refused_.erase(it);
    }
}

long FakeProvider::alive(const std::string& kind) const {
  auto held = lock();
  auto it = alive_.find(kind);
  return it == alive_.end() ? 0 : it->second;
}

std::string FakeProvider::problems() const {
  auto held = lock();
  return problems_locked();
}

std::string FakeProvider::problems_locked() const {
  std::ostringstream out;
  for (auto& [kind, n] : alive_)
    if (n != 0) out << kind << ": " << n << " alive\n";
  for (auto& f : failures_) out << f << "\n";
  return out.str();
}

void FakeProvider::expect_clean() const {
  INFO("calls: " << [&] {
    std::string s;
    for (auto& c : calls()) s += c + " ";
    return s;
  }());
  CHECK(problems() == "");
}

// ------------------------------------------------------------------------------------
// epoll and eventfd.

// The fake gives these the values of poll's flags, as Linux does.
static_assert(EPOLLIN == POLLIN && EPOLLOUT == POLLOUT && EPOLLPRI == POLLPRI &&
              EPOLLERR == POLLERR && EPOLLHUP == POLLHUP && EPOLLRDHUP == POLLRDHUP &&
              EPOLLRDNORM == POLLRDNORM && EPOLLWRNORM == POLLWRNORM);

FakeProvider::FdKind FakeProvider::fake_kind(int fd) {
  if (epolls_.count(fd)) return FdKind::epoll;
  if (eventfds_.count(fd)) return FdKind::eventfd;
  if (channel_by_fd(fd) != nullptr) return FdKind::event_channel;
  if (comp_by_fd(fd) != nullptr) return FdKind::comp_channel;
  return FdKind::none;
}

std::optional<std::uint32_t> FakeProvider::readiness(int fd, bool real) {
  constexpr std::uint32_t readable = EPOLLIN | EPOLLRDNORM;
  if (real) {
    pollfd p{fd, static_cast<short>(POLLIN | POLLOUT | POLLPRI | POLLRDHUP | POLLRDNORM | POLLWRNORM), 0};
    if (::poll(&p, 1, 0) < 0) return 0u;
    if (p.revents & POLLNVAL) return std::nullopt;
    return static_cast<std::uint32_t>(static_cast<unsigned short>(p.revents));
  }
  if (auto* ch = channel_by_fd(fd)) return ch->queue.empty() ? 0u : readable;  // ucma_poll
  if (auto* comp = comp_by_fd(fd)) return comp->events.empty() ? 0u : readable;
  auto it = eventfds_.find(fd);
  if (it == eventfds_.end()) return std::nullopt;
  constexpr std::uint64_t max = std::numeric_limits<std::uint64_t>::max();
  std::uint32_t ready = 0;  // eventfd_poll: no RDNORM / WRNORM
  if (it->second.count > 0) ready |= EPOLLIN;
  if (it->second.count == max) ready |= EPOLLERR;  // unreachable through write()
  if (it->second.count < max - 1) ready |= EPOLLOUT;
  return ready;
}

void FakeProvider::wakeup(int fd) {
  for (auto& [epfd, set] : epolls_)
    if (auto it = set.find(fd); it != set.end()) it->second.edge_pending = true;
  changed_.notify_all();
}

void FakeProvider::drop_watches(int fd) {
  for (auto& [epfd, set] : epolls_) closed_while_watched_ += set.erase(fd);
  changed_.notify_all();
}

bool FakeProvider::watches_real_fd(int epfd) const {
  auto it = epolls_.find(epfd);
  if (it == epolls_.end()) return false;
  for (auto& [fd, w] : it->second)
    if (w.real) return true;
  return false;
}

int FakeProvider::collect_ready(int epfd, epoll_event* out, int max) {
  auto found = epolls_.find(epfd);
  if (found == epolls_.end()) return -1;
  auto& set = found->second;
  std::vector<std::pair<std::uint64_t, int>> by_order;
  for (auto& [fd, w] : set) by_order.emplace_back(w.order, fd);
  std::sort(by_order.begin(), by_order.end());
  int n = 0;
  for (auto& [order, fd] : by_order) {
    if (n == max) break;
    auto it = set.find(fd);
    Watch& w = it->second;
    if (!w.armed) continue;                                 // EPOLLONESHOT, until MOD
    if ((w.events & EPOLLET) && !w.real && !w.edge_pending) continue;  // no wakeup since
    const auto ready = readiness(fd, w.real);
    if (!ready) {  // a real fd closed behind the fake's back: the kernel dropped it
      set.erase(it);
      ++closed_while_watched_;
      continue;
    }
    w.edge_pending = false;
    const std::uint32_t revents = *ready & w.events;
    if (revents == 0) continue;
    out[n].events = revents;
    out[n].data = w.data;
    ++n;
    w.order = ++next_order_;  // a level-triggered entry goes back to the tail
    if (w.events & EPOLLONESHOT) w.armed = false;
  }
  return n;
}

std::size_t FakeProvider::closed_while_watched() const {
  auto held = lock();
  return closed_while_watched_;
}

std::map<int, std::uint32_t> FakeProvider::watched(int epfd) const {
  auto held = lock();
  std::map<int, std::uint32_t> out;
  auto it = epolls_.find(epfd);
  if (it != epolls_.end())
    for (auto& [fd, w] : it->second) out[fd] = w.events;
  return out;
}

std::uint64_t FakeProvider::eventfd_value(int fd) const {
  auto held = lock();
  auto it = eventfds_.find(fd);
  REQUIRE(it != eventfds_.end());
  return it->second.count;
}

// ------------------------------------------------------------------------------------
// The data path.

bool FakeProvider::sge_ok(const ibv_pd* pd, const ibv_sge& sge, bool device_writes) const {
  if (sge.length == 0) return true;
  for (auto& [mr, access] : mrs_) {
    if (mr->lkey != sge.lkey) continue;
    const auto start = reinterpret_cast<std::uintptr_t>(mr->addr);
    const bool inside = sge.addr >= start && sge.addr - start <= mr->length &&
                        sge.length <= mr->length - (sge.addr - start);
    return mr->pd == pd && inside && (!device_writes || (access & IBV_ACCESS_LOCAL_WRITE));
  }
  return false;
}

FakeProvider::CompChannelInfo* FakeProvider::comp_by_fd(int fd) {
  for (auto& [ch, info] : comp_channels_)
    if (ch->fd == fd) return &info;
  return nullptr;
}

void FakeProvider::push_wc(ibv_cq* cq, const ibv_wc& wc) {
  auto it = cqs_.find(cq);
  if (it == cqs_.end()) return note("a completion for a cq that is not alive");
  auto& info = it->second;
  if (info.wcs.size() >= static_cast<std::size_t>(cq->cqe)) {
    note("completion queue overrun (more completions than its size)");
    return;
  }
  info.wcs.push_back(wc);
  if (info.armed && cq->channel != nullptr) {  // one event per arming
    info.armed = false;
    comp_channels_[cq->channel].events.push_back(cq);
    wakeup(cq->channel->fd);
  }
  changed_.notify_all();
}

void FakeProvider::complete_one(ibv_qp* qp, Outstanding& wr, ibv_cq* cq, ibv_wc_status status,
                                bool recv) {
  if (status == IBV_WC_SUCCESS && !wr.local_ok)
    status = wr.opcode == IBV_WR_BIND_MW ? IBV_WC_MW_BIND_ERR : IBV_WC_LOC_PROT_ERR;
  if (!recv && status == IBV_WC_SUCCESS && !wr.signaled) return;  // silent
  ibv_wc wc{};
  wc.wr_id = wr.wr_id;
  wc.status = status;
  wc.qp_num = qp->qp_num;
  if (recv) {
    wc.opcode = IBV_WC_RECV;
  } else {
    switch (wr.opcode) {
      case IBV_WR_RDMA_WRITE:
      case IBV_WR_RDMA_WRITE_WITH_IMM: wc.opcode = IBV_WC_RDMA_WRITE; break;
      case IBV_WR_RDMA_READ:
        wc.opcode = IBV_WC_RDMA_READ;
        wc.byte_len = wr.byte_len;
        break;
      case rpmapp::detail::native_atomic_write_abi::wr_atomic_write:
        wc.opcode = static_cast<ibv_wc_opcode>(rpmapp::detail::native_atomic_write_abi::wc_atomic_write);
        break;
      case IBV_WR_BIND_MW: wc.opcode = IBV_WC_BIND_MW; break;
      case rpmapp::detail::native_flush_abi::wr_flush:
        wc.opcode = static_cast<ibv_wc_opcode>(rpmapp::detail::native_flush_abi::wc_flush);
        break;
      default: wc.opcode = IBV_WC_SEND; break;
    }
  }
  push_wc(cq, wc);
}

Window* FakeProvider::window_of(const ibv_mw* mw) {
  for (Window& w : windows_)
    if (w.mw == mw) return &w;
  return nullptr;
}

std::string FakeProvider::bind_refusal(const ibv_qp* qp, const ibv_send_wr& wr) {
  const Window* w = window_of(wr.bind_mw.mw);
  if (w == nullptr) return "the window is not alive";
  if (wr.bind_mw.mw->rkey != w->rkey) return "the window's key is not the kernel's (mw_rkey)";
  const ibv_mw_bind_info& info = wr.bind_mw.bind_info;
  const auto mr = mrs_.find(info.mr);
  if (info.length != 0 && mr == mrs_.end()) return "the region is not alive";
  if (w->type == IBV_MW_TYPE_1) return "a type 1 window is bound with ibv_bind_mw";
  if (w->bound) return "a type 2 window that is already bound";
  if (qp->pd != w->pd) return "the queue pair is on another pd";
  if (info.length == 0) return "a zero length (that invalidates)";
  const int mr_access = mr->second;
  if (!(mr_access & IBV_ACCESS_MW_BIND)) return "the region was registered without IBV_ACCESS_MW_BIND";
  if ((info.mw_access_flags & (IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_ATOMIC)) &&
      !(mr_access & IBV_ACCESS_LOCAL_WRITE))
    return "a writable window on a region without IBV_ACCESS_LOCAL_WRITE";
  if (info.mw_access_flags & IBV_ACCESS_ZERO_BASED) return "a zero-based window (rpmapp binds by address)";
  const auto start = reinterpret_cast<std::uintptr_t>(info.mr->addr);
  if (info.addr < start || info.addr + info.length > start + info.mr->length)
    return "the range is outside the region";
  return "";
}

std::vector<Window> FakeProvider::windows() const {
  auto held = lock();
  return windows_;
}

void FakeProvider::random_bytes(std::vector<std::uint8_t> bytes) {
  auto held = lock();
  random_bytes_.assign(bytes.begin(), bytes.end());
}

bool FakeProvider::remote_access(std::uint32_t qp_num, std::uint32_t rkey, std::uint64_t addr,
                                 std::size_t len, int access) const {
  auto held = lock();
  const ibv_qp* qp = nullptr;
  for (const auto& [q, info] : qps_)
    if (q->qp_num == qp_num) qp = q;
  if (qp == nullptr) return false;
  const ibv_mr* mr = nullptr;
  int mr_access = 0;
  const auto window = std::find_if(windows_.begin(), windows_.end(),
                                   [&](const Window& w) { return (w.rkey >> 8) == (rkey >> 8); });
  if (window != windows_.end()) {  // rxe_lookup_mw
    if (window->rkey != rkey || window->pd != qp->pd || !window->bound || window->length == 0 ||
        (window->type == IBV_MW_TYPE_2 && window->qp != qp) || (static_cast<unsigned>(access) & window->access) != static_cast<unsigned>(access))
      return false;
    mr = window->mr;
  } else {  // lookup_mr: the region's own key
    for (const auto& [m, a] : mrs_)
      if (m->rkey == rkey && (a & (IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_ATOMIC))) {
        mr = m;
        mr_access = a;
      }
    if (mr == nullptr || mr->pd != qp->pd || (access & mr_access) != access) return false;
  }
  // mr_check_range: the region's bounds, for a window too
  const auto start = reinterpret_cast<std::uintptr_t>(mr->addr);
  return addr >= start && len <= mr->length && addr - start <= mr->length - len;
}

void FakeProvider::flush_qp(ibv_qp* qp) {
  auto& info = qps_[qp];
  info.state = QpState::error;
  qp->state = IBV_QPS_ERR;
  for (auto& wr : info.sends) complete_one(qp, wr, qp->send_cq, IBV_WC_WR_FLUSH_ERR, false);
  info.sends.clear();
  for (auto& wr : info.recvs) complete_one(qp, wr, qp->recv_cq, IBV_WC_WR_FLUSH_ERR, true);
  info.recvs.clear();
}

void FakeProvider::set_caps(int device, const DeviceCaps& caps) {
  auto held = lock();
  caps_[device] = caps;
  devices_[device].transport_type = caps.transport;
}

void FakeProvider::persistent_memory(const void* addr) {
  auto lock = this->lock();
  persistent_.insert(addr);
}

void FakeProvider::needs_odp(const void* addr) {
  auto held = lock();
  needs_odp_.insert(addr);
}

std::vector<Registration> FakeProvider::registrations() const {
  auto held = lock();
  return registrations_;
}

std::vector<Advice> FakeProvider::advices() const {
  auto held = lock();
  return advices_;
}

std::vector<PostedWr> FakeProvider::posted() const {
  auto held = lock();
  return posted_;
}

std::size_t FakeProvider::complete_sends(ibv_qp* qp, std::size_t n, ibv_wc_status status) {
  auto held = lock();
  auto it = qps_.find(qp);
  REQUIRE(it != qps_.end());
  std::size_t done = 0;
  while (done < n && !it->second.sends.empty()) {
    Outstanding wr = std::move(it->second.sends.front());
    it->second.sends.pop_front();
    complete_one(qp, wr, qp->send_cq, status, false);
    ++done;
  }
  return done;
}

bool FakeProvider::deliver_recv(ibv_qp* qp, std::span<const std::byte> payload,
                                std::optional<std::uint32_t> imm, bool rdma_with_imm,
                                ibv_wc_status status) {
  auto held = lock();
  auto it = qps_.find(qp);
  REQUIRE(it != qps_.end());
  std::deque<Outstanding>& queue = qp->srq != nullptr ? srqs_[qp->srq].recvs : it->second.recvs;
  if (queue.empty()) return false;
  Outstanding wr = std::move(queue.front());
  queue.pop_front();
  if (status == IBV_WC_SUCCESS && !wr.local_ok)
    status = wr.opcode == IBV_WR_BIND_MW ? IBV_WC_MW_BIND_ERR : IBV_WC_LOC_PROT_ERR;
  if (status == IBV_WC_SUCCESS && !rdma_with_imm && payload.size() > wr.byte_len)
    status = IBV_WC_LOC_LEN_ERR;
  ibv_wc wc{};
  wc.wr_id = wr.wr_id;
  wc.status = status;
  wc.qp_num = qp->qp_num;
  wc.opcode = rdma_with_imm ? IBV_WC_RECV_RDMA_WITH_IMM : IBV_WC_RECV;
  if (status == IBV_WC_SUCCESS) {
    if (!rdma_with_imm) {  // the message lands in the receive's memory
      std::size_t at = 0;
      for (const ibv_sge& sge : wr.sge) {
        const std::size_t n = std::min<std::size_t>(sge.length, payload.size() - at);
        if (n != 0)
          std::memcpy(reinterpret_cast<void*>(static_cast<std::uintptr_t>(sge.addr)),
                      payload.data() + at, n);
        at += n;
      }
    }
    wc.byte_len = static_cast<std::uint32_t>(payload.size());
    if (imm) {
      wc.wc_flags |= IBV_WC_WITH_IMM;
      wc.imm_data = htonl(*imm);
    }
  }
  push_wc(qp->recv_cq, wc);
  return true;
}

void FakeProvider::add_completion(ibv_cq* cq, const ibv_wc& wc) {
  auto held = lock();
  push_wc(cq, wc);
}

void FakeProvider::complete_after_empty_poll(ibv_cq* cq, const ibv_wc& wc) {
  auto held = lock();
  REQUIRE(cqs_.count(cq));
  cqs_[cq].after_empty_poll = wc;
}

void FakeProvider::next_qp_number(std::uint32_t qp_num) {
  auto held = lock();
  next_qp_num_ = qp_num;
}

void FakeProvider::poll_cq_returns(ibv_cq* cq, int result) {
  auto held = lock();
  REQUIRE(cqs_.count(cq));
  cqs_[cq].poll_result = result;
}

std::size_t FakeProvider::outstanding_sends(ibv_qp* qp) const {
  auto held = lock();
  auto it = qps_.find(qp);
  return it == qps_.end() ? 0 : it->second.sends.size();
}

std::size_t FakeProvider::outstanding_recvs(ibv_qp* qp) const {
  auto held = lock();
  auto it = qps_.find(qp);
  return it == qps_.end() ? 0 : it->second.recvs.size();
}

std::size_t FakeProvider::outstanding_srq_recvs(ibv_srq* srq) const {
  auto held = lock();
  auto it = srqs_.find(srq);
  return it == srqs_.end() ? 0 : it->second.recvs.size();
}

std::size_t FakeProvider::cq_entries(ibv_cq* cq) const {
  auto held = lock();
  auto it = cqs_.find(cq);
  return it == cqs_.end() ? 0 : it->second.wcs.size();
}

bool FakeProvider::armed(ibv_cq* cq) const {
  auto held = lock();
  auto it = cqs_.find(cq);
  return it != cqs_.end() && it->second.armed;
}

std::size_t FakeProvider::cq_events_queued(const ibv_comp_channel* ch) const {
  auto held = lock();
  auto it = comp_channels_.find(const_cast<ibv_comp_channel*>(ch));
  return it == comp_channels_.end() ? 0 : it->second.events.size();
}

unsigned long FakeProvider::acked_cq_events() const {
  auto held = lock();
  return acked_cq_events_;
}

void FakeProvider::hold_connects() {
  auto lock = this->lock();
  connects_on_hold_ = true;
}

void FakeProvider::release_connects() {
  auto lock = this->lock();
  connects_on_hold_ = false;
  changed_.notify_all();
}

bool FakeProvider::connects_held(int n) {
  auto lock = this->lock();
  return changed_.wait_for(lock, watchdog, [&] { return connects_in_call_ >= n; });
}

bool FakeProvider::connected(ibv_qp* qp) const {
  auto held = lock();
  auto it = qps_.find(qp);
  return it != qps_.end() && it->second.state == QpState::rts;
}

}  // namespace fake
