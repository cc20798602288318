#include "fake_provider.hpp"

#include <catch2/catch.hpp>

#include <arpa/inet.h>
#include <net/if.h>
#include <netdb.h>

#include <algorithm>
#include <cerrno>
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
  return call == "rdma_destroy_event_channel" || call == "rdma_freeaddrinfo" ||
         call == "rdma_destroy_qp" || call == "rdma_free_devices";
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
    f().ids_.erase(it);
    f().destroyed("cm_id");
    delete id;
    return failed ? -1 : 0;
  }

  static int getaddrinfo(const char* node, const char* service, const rdma_addrinfo* hints,
                         rdma_addrinfo** out) {
    auto lock = f().lock();
    if (fails("rdma_getaddrinfo")) return -1;
    if (int code = std::exchange(f().getaddrinfo_eai, 0); code != 0) return code;
    sockaddr_storage addr{};
    std::string text = node ? node : "";
    int port = service ? std::atoi(service) : 0;
    if (!set_sockaddr(addr, text, static_cast<std::uint16_t>(port)))
      return EAI_NONAME;  // getaddrinfo with AI_NUMERICHOST; errno is not set
    auto* ai = new rdma_addrinfo{};
    auto* sa = reinterpret_cast<sockaddr*>(new sockaddr_storage(addr));
    ai->ai_family = addr.ss_family;
    ai->ai_qp_type = IBV_QPT_RC;
    ai->ai_port_space = RDMA_PS_TCP;
    if (hints && (hints->ai_flags & RAI_PASSIVE)) {
      ai->ai_flags = RAI_PASSIVE;
      ai->ai_src_addr = sa;
      ai->ai_src_len = static_cast<socklen_t>(sockaddr_len(sa));
    } else {
      ai->ai_dst_addr = sa;
      ai->ai_dst_len = static_cast<socklen_t>(sockaddr_len(sa));
    }
    f().addrinfos_.insert(ai);
    f().created("addrinfo");
    *out = ai;
    return 0;
  }

  static void freeaddrinfo(rdma_addrinfo* ai) {
    auto lock = f().lock();
    f().calls_.emplace_back("rdma_freeaddrinfo");
    if (!f().addrinfos_.erase(ai)) return f().note("rdma_freeaddrinfo: addrinfo not alive");
    delete reinterpret_cast<sockaddr_storage*>(ai->ai_src_addr);
    delete reinterpret_cast<sockaddr_storage*>(ai->ai_dst_addr);
    delete ai;
    f().destroyed("addrinfo");
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

  static int create_qp(rdma_cm_id* id, ibv_pd* pd, ibv_qp_init_attr* attr) {
    auto lock = f().lock();
    if (fails("rdma_create_qp")) return -1;
    if (!id_ok(id, "rdma_create_qp")) return -1;
    if (!f().pds_.count(pd) || attr == nullptr || id->qp != nullptr) {
      f().note("rdma_create_qp: bad pd, attributes, or the id already has a qp");
      errno = EINVAL;
      return -1;
    }
    if (id->verbs == nullptr || pd->context != id->verbs) {  // as librdmacm checks
      errno = EINVAL;
      return -1;
    }
    if (!f().cqs_.count(attr->send_cq) || !f().cqs_.count(attr->recv_cq)) {
      f().note("rdma_create_qp: completion queue not alive");
      errno = EINVAL;
      return -1;
    }
    auto* qp = new ibv_qp{};
    qp->context = id->verbs;
    qp->pd = pd;
    qp->send_cq = attr->send_cq;
    qp->recv_cq = attr->recv_cq;
    qp->qp_num = f().next_qp_num_++;
    qp->qp_type = attr->qp_type;
    id->qp = qp;
    f().qps_.insert(qp);
    f().qp_pd[qp->qp_num] = pd;
    f().last_qp_attr = *attr;
    f().created("qp");
    return 0;
  }

  static void destroy_qp(rdma_cm_id* id) {
    auto lock = f().lock();
    f().calls_.emplace_back("rdma_destroy_qp");
    if (!f().ids_.count(id)) return f().note("rdma_destroy_qp: cm_id not alive");
    if (id->qp == nullptr || !f().qps_.erase(id->qp))
      return f().note("rdma_destroy_qp: the cm_id has no queue pair");
    delete id->qp;
    id->qp = nullptr;
    f().destroyed("qp");
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
    f().accepts.push_back({id, param ? bytes(param->private_data, param->private_data_len)
                                     : std::vector<std::byte>()});
    return 0;
  }

  static int reject(rdma_cm_id* id, const void* data, uint8_t len) {
    auto lock = f().lock();
    if (fails("rdma_reject")) return -1;
    if (!id_ok(id, "rdma_reject")) return -1;
    if (data != nullptr && len > reject_pad) {  // ib_send_cm_rej refuses it; nothing is sent
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
    if (param) f().last_conn_param = *param;
    f().connects.push_back({id, param ? bytes(param->private_data, param->private_data_len)
                                      : std::vector<std::byte>()});
    return 0;
  }

  static int disconnect(rdma_cm_id* id) {
    auto lock = f().lock();
    if (fails("rdma_disconnect")) return -1;
    if (!id_ok(id, "rdma_disconnect")) return -1;
    f().disconnects.push_back(id);
    return 0;
  }

  static ibv_context** get_devices(int* num_devices) {
    auto lock = f().lock();
    if (fails("rdma_get_devices")) {
      if (num_devices) *num_devices = 0;
      return nullptr;
    }
    auto* list = new ibv_context*[device_count + 1];
    for (int d = 0; d < device_count; ++d) list[d] = f().cm_contexts_[d];
    list[device_count] = nullptr;
    f().device_lists_.insert(list);
    f().created("device_list");
    if (num_devices) *num_devices = device_count;
    return list;
  }

  static void free_devices(ibv_context** list) {
    auto lock = f().lock();
    f().calls_.emplace_back("rdma_free_devices");
    if (!f().device_lists_.erase(list)) return f().note("rdma_free_devices: list not alive");
    f().destroyed("device_list");
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
    for (ibv_qp* qp : f().qps_)
      if (qp->pd == pd) {
        f().note("ibv_dealloc_pd: a queue pair still uses the pd");
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
    f().comp_channels_.insert(ch);
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
      f().note("ibv_destroy_comp_channel: a completion queue still uses the channel");
      return EBUSY;
    }
    f().comp_channels_.erase(ch);
    f().destroyed("comp_channel");
    delete ch;
    return failed ? err : 0;
  }

  static ibv_cq* create_cq(ibv_context* ctx, int cqe, void* cq_context, ibv_comp_channel* ch,
                           int vector) {
    auto lock = f().lock();
    if (fails("ibv_create_cq")) return nullptr;
    if (f().device_of_context(ctx) < 0 || cqe < 1 || vector != 0 ||
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
    f().cqs_.insert(cq);
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
    for (ibv_qp* qp : f().qps_)
      if (qp->send_cq == cq || qp->recv_cq == cq) {
        f().note("ibv_destroy_cq: a queue pair still uses the cq");
        return EBUSY;
      }
    if (cq->channel) --cq->channel->refcnt;
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
    return 0;
  }

  static int fcntl(int fd, int cmd, int arg) {
    auto lock = f().lock();
    if (fails("fcntl")) return -1;
    auto* ch = f().channel_by_fd(fd);
    if (ch == nullptr) {
      f().note("fcntl: not the fd of a live event channel");
      errno = EBADF;
      return -1;
    }
    if (cmd == F_GETFL) return O_RDWR | (ch->nonblocking ? O_NONBLOCK : 0);
    if (cmd == F_SETFL) {
      ch->nonblocking = (arg & O_NONBLOCK) != 0;
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
      if (f().channel_by_fd(fds[i].fd) == nullptr)
        f().note("poll: not the fd of a live event channel");
    auto count = [&] {
      int ready = 0;
      for (nfds_t i = 0; i < n; ++i) {
        fds[i].revents = 0;
        auto* ch = f().channel_by_fd(fds[i].fd);
        if (ch == nullptr) fds[i].revents = POLLNVAL;
        else if (!ch->queue.empty() && (fds[i].events & POLLIN)) fds[i].revents = POLLIN;
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
    Sentinel<&FakeProvider::Impl::getaddrinfo>::call,
    Sentinel<&FakeProvider::Impl::freeaddrinfo>::call,
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
    Sentinel<&FakeProvider::Impl::get_devices>::call,
    Sentinel<&FakeProvider::Impl::free_devices>::call,
    Sentinel<&FakeProvider::Impl::alloc_pd>::call,
    Sentinel<&FakeProvider::Impl::dealloc_pd>::call,
    Sentinel<&FakeProvider::Impl::create_comp_channel>::call,
    Sentinel<&FakeProvider::Impl::destroy_comp_channel>::call,
    Sentinel<&FakeProvider::Impl::create_cq>::call,
    Sentinel<&FakeProvider::Impl::destroy_cq>::call,
    Sentinel<&FakeProvider::Impl::req_notify_cq>::call,
    Sentinel<&FakeProvider::Impl::fcntl, Ok::non_negative>::call,
    Sentinel<&FakeProvider::Impl::poll, Ok::non_negative>::call,
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
  for (auto* x : qps_) delete x;
  for (auto* x : cqs_) delete x;
  for (auto* x : comp_channels_) delete x;
  for (auto* x : pds_) delete x;
  for (auto* x : device_lists_) delete[] x;
  for (auto* ai : addrinfos_) {
    delete reinterpret_cast<sockaddr_storage*>(ai->ai_src_addr);
    delete reinterpret_cast<sockaddr_storage*>(ai->ai_dst_addr);
    delete ai;
  }
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
  changed_.notify_all();
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
  sockaddr_storage local{}, remote{};
  // An IPv6 request has IPv6 addresses, without scope ids (the kernel's cma_save_ip6_info).
  set_sockaddr(remote, request.peer, request.peer_port);
  set_sockaddr(local, remote.ss_family == AF_INET6 ? device_addresses6[request.device]
                                                   : device_addresses[request.device],
               ids_[listener].port);
  std::memcpy(&child->route.addr.src_storage, &local, sizeof local);
  std::memcpy(&child->route.addr.dst_storage, &remote, sizeof remote);
  auto* ev = make_event(child, RDMA_CM_EVENT_CONNECT_REQUEST, request.private_data, connect_pad, 0);
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
  std::size_t pad_to = 0;
  if (pad && type == RDMA_CM_EVENT_ESTABLISHED) pad_to = accept_pad;
  if (pad && type == RDMA_CM_EVENT_REJECTED) pad_to = reject_pad;
  queue_event(ch, make_event(target, type, data, pad_to, status));
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

}  // namespace fake
