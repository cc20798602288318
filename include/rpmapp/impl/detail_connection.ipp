// The definitions of rpmapp/detail/connection.hpp: making and releasing a connection's resources.
#pragma once

#include <rpmapp/detail/connection.hpp>

#include <algorithm>
#include <cerrno>

RPMAPP_BEGIN_NAMESPACE
namespace detail {

RPMAPP_DECL ConnectionCore::~ConnectionCore() {
  if (auto closed = close_core(*this, teardown); !closed) [[unlikely]]
    log(teardown.level, teardown.where, closed.error());
}

RPMAPP_DECL ibv_cq* ConnectionCore::receive_cq() const noexcept {
  if (rcq) return rcq.get();
  if (srq && srq->rcq) return srq->rcq.get();
  return nullptr;
}

RPMAPP_DECL ibv_comp_channel* ConnectionCore::receive_channel() const noexcept {
  if (rcq) return rcq_channel ? rcq_channel.get() : comp_channel.get();
  if (srq && srq->rcq) return srq->channel.get();
  return nullptr;
}

RPMAPP_DECL void release_cq(const ConnectionCore& core, ibv_cq* cq, std::uint32_t size,
                            bool qp_survived, FirstError& first) noexcept {
  const Provider& p = *core.seam;
  if (reuses_cqs(core) && !qp_survived) {
    ibv_wc left[16];
    int n = 0;
    while ((n = p.poll_cq(cq, 16, left)) > 0) {
    }
    if (n >= 0 && core.peer->keep_spare_cq(cq, size, core.config.completion_vector)) return;
  }
  first.value_call(p.destroy_cq(cq), "ibv_destroy_cq");
}

RPMAPP_DECL void retire_routes(const ConnectionCore& core, bool qp_survived, FirstError& first) noexcept {
  const Provider& p = *core.seam;
  if (core.shared_cq)
    if (auto retired = core.shared_cq->routes.retire(p, core.shared_cq->cq.get(), core.qp_num, qp_survived); !retired)
      first.note(retired.error());
  if (core.srq && core.srq->rcq)
    if (auto retired = core.srq->routes.retire(p, core.srq->rcq.get(), core.qp_num, qp_survived); !retired)
      first.note(retired.error());
}

RPMAPP_DECL expected<void> close_core(ConnectionCore& core, Teardown by) noexcept {
  core.watchers.notify();
  const Provider& p = *core.seam;
  FirstError first{by};
  // the windows first: each holds the queue pair it is bound to (rxe's ibv_destroy_qp
  // would wait for them)
  core.grants.revoke_all(first);
  bool qp_survived = false;
  if (core.qp) {
    const int destroyed = p.destroy_qp(core.qp.release());
    qp_survived = destroyed != 0;
    first.value_call(destroyed, "ibv_destroy_qp");
  }
  if (core.qp_num != 0) retire_routes(core, qp_survived, first);
  if (core.rcq) release_cq(core, core.rcq.release(), core.config.rcq_size, qp_survived, first);
  if (core.cq) release_cq(core, core.cq.release(), core.config.cq_size, qp_survived, first);
  if (core.rcq_channel)
    first.value_call(p.destroy_comp_channel(core.rcq_channel.release()),
                     "ibv_destroy_comp_channel");
  if (core.comp_channel)
    first.value_call(p.destroy_comp_channel(core.comp_channel.release()),
                     "ibv_destroy_comp_channel");
  bool channel_empty = true;  // no cm_id left on it: it may be reused
  // Off the shared channel first: rdma_destroy_id waits for the id's events to be acknowledged.
  if (core.events) core.events->retire(core.id.get(), core.inbox, first);
  if (core.id) {
    errno = 0;
    if (core.reject_unanswered)
      first.errno_call(p.reject(core.id.get(), nullptr, 0), "rdma_reject");
    errno = 0;
    const int destroyed = p.destroy_id(core.id.release());
    channel_empty = destroyed == 0;
    first.errno_call(destroyed, "rdma_destroy_id");
  }
  if (core.channel) {
    rdma_event_channel* channel = core.channel.release();
    if (!channel_empty || !reuses_channels(core) || !core.peer->keep_spare_channel(channel))
      p.destroy_event_channel(channel);
  }
  core.srq.reset();
  core.shared_cq.reset();
  core.events.reset();
  core.peer.reset();
  return first.result();
}

RPMAPP_DECL expected<void> check_config(const char* call, const ConnConfig& cfg) noexcept {
  if (cfg.cq_size == 0 || cfg.sq_size == 0 || cfg.rq_size == 0)
    return fail(invalid(call, "cq_size, sq_size and rq_size must be at least 1"));
  if (cfg.cq_size > 0x7fffffffu || cfg.rcq_size > 0x7fffffffu)
    return fail(invalid(call, "cq_size and rcq_size must fit in an int"));
  if (cfg.retry_count > 7 || cfg.rnr_retry_count > 7)
    return fail(invalid(call, "retry_count and rnr_retry_count must be in 0..7"));
  if (cfg.timeout.count() <= 0 || cfg.timeout.count() > 0x7fffffff)
    return fail(invalid(call, "timeout must be positive and fit in an int of ms"));
  if (cfg.max_sge == 0) return fail(invalid(call, "max_sge must be at least 1"));
  if (cfg.completion_vector < 0) return fail(invalid(call, "completion_vector must not be negative"));
  if (cfg.srq != nullptr && !*cfg.srq)
    return fail(invalid(call, "srq points at an empty Srq (moved from or closed)"));
  if (cfg.shared_completion_channel && !cfg.completion_channel)
    return fail(invalid(call, "shared_completion_channel needs a completion channel "
                              "(completion_channel is false)"));
  if (cfg.own_protection_domain && cfg.srq != nullptr)
    return fail(invalid(call, "a shared receive queue is on its Peer's protection domain: a "
                              "connection with its own (own_protection_domain) cannot use one"));
  if (cfg.shared_event_channel != nullptr) {
    if (!*cfg.shared_event_channel)
      return fail(invalid(call, "shared_event_channel points at an empty SharedEventChannel (moved from or closed)"));
    if (cfg.reuse_event_channel)
      return fail(invalid(call, "a connection on a shared event channel (shared_event_channel) has no channel of "
                                "its own to reuse: reuse_event_channel must be false"));
  }
  if (cfg.shared_cq != nullptr) {
    if (!*cfg.shared_cq) return fail(invalid(call, "shared_cq points at an empty SharedCq (moved from or closed)"));
    if (cfg.rcq_size > 0 || cfg.shared_completion_channel || cfg.reuse_completion_queues)
      return fail(invalid(call, "a connection on a shared CQ (shared_cq) has no CQ of its own: rcq_size must "
                                "be 0, shared_completion_channel and reuse_completion_queues false"));
    return {};  // completion_channel does not apply
  }
  if (cfg.reuse_completion_queues && cfg.completion_channel)
    return fail(invalid(call, "reuse_completion_queues needs CQs without a completion channel "
                              "(set completion_channel to false)"));
  return {};
}

RPMAPP_DECL expected<void> attach_shared_queues(const char* call, ConnectionCore& core, const ConnConfig& cfg,
                                                const SharedQueues& shared) noexcept {
  if (shared.srq) {
    if (shared.srq->peer->pd.get() != core.peer->pd.get())
      return fail(invalid(call, "the shared receive queue belongs to another Peer than the connection's"));
    if (cfg.shared_completion_channel && shared.srq->rcq)
      return fail(invalid(call, "a shared completion channel cannot carry the receive completions of a "
                                "shared receive queue with its own CQ (as librpma)"));
  }
  core.srq = shared.srq;
  core.shared_cq = shared.cq;
  core.events = shared.events;
  return {};
}

RPMAPP_DECL expected<int> event_fd(const char* call, const ConnectionCore& core) noexcept {
  if (core.events)
    return fail(invalid(call, "the connection is on a shared event channel (shared_event_channel), whose fd "
                              "carries other connections' events too: poll SharedEventChannel::fd()"));
  return core.channel->fd;
}

RPMAPP_DECL expected<void> open_event_channel(ConnectionCore& core) noexcept {
  if (core.events) return {};
  if (reuses_channels(core)) {
    if (rdma_event_channel* spare = core.peer->take_spare_channel()) {
      core.channel.reset(spare);
      return {};
    }
  }
  errno = 0;
  core.channel.reset(provider().create_event_channel());
  if (!core.channel) return fail(provider_error("rdma_create_event_channel", errno));
  auto made = make_nonblocking(core.channel.get());
  if (!made) core.channel.reset();  // never kept as a spare: a blocking read would hang
  return made;
}

RPMAPP_DECL expected<void> open_cq(ConnectionCore& core, OwnedCompletionQueue& out, std::uint32_t size,
                                   ibv_comp_channel* channel) noexcept {
  if (reuses_cqs(core)) {
    if (ibv_cq* spare = core.peer->take_spare_cq(size, core.config.completion_vector)) {
      out.reset(spare);
      return {};
    }
  }
  CompletionQueue made;
  auto ok = make_cq(made, core.id->verbs, size, channel, core.config.completion_vector);
  if (ok) out.reset(made.release());
  return ok;
}

RPMAPP_DECL expected<void> check_private_data(const char* call, std::span<const std::byte> data,
                                              const PeerState& peer, PrivateDataUse use) noexcept {
  const PrivateDataLimits limits = private_data_limits(peer.iwarp);
  const auto [limit, what] = use == PrivateDataUse::connect  ? std::pair{limits.connect, "connect"}
                            : use == PrivateDataUse::accept ? std::pair{limits.accept, "accept"}
                                                            : std::pair{limits.reject, "reject"};
  if (data.size() > limit) [[unlikely]] {
    return fail(invalid(call, "{} private data is {} bytes, more than the {} that {} ({}) allows", what, data.size(),
                        limit, device_name(peer.context), peer.iwarp ? "iWARP" : "InfiniBand/RoCE, RDMA_PS_TCP"));
  }
  return {};
}

RPMAPP_DECL expected<void> check_device_limits(const ConnConfig& cfg, const PeerState& peer, bool srq,
                                               bool shared_cq) noexcept {
  // What the provider would refuse with a bare EINVAL (rxe and siw check the same limits).
  struct Size {
    const char* name;
    std::uint32_t value, limit;
    bool applies;
    const char* what;
  };
  const Size sizes[] = {
      {"sq_size", cfg.sq_size, peer.max_queue_wr, true, "work requests per queue (max_qp_wr)"},
      {"rq_size", cfg.rq_size, peer.max_queue_wr, !srq, "work requests per queue (max_qp_wr)"},
      {"max_sge", cfg.max_sge, peer.max_sge, true, "scatter/gather entries per work request (max_sge)"},
      {"cq_size", cfg.cq_size, peer.max_cqe, !shared_cq, "entries per completion queue (max_cqe)"},
      {"rcq_size", cfg.rcq_size, peer.max_cqe, true, "entries per completion queue (max_cqe)"},
  };
  for (const Size& size : sizes)
    if (size.applies && size.value > size.limit) [[unlikely]]
      return fail(invalid("ConnConfig", "{} {} is more than the {} {} that {} allows", size.name, size.value,
                          size.limit, size.what, device_name(peer.context)));
  return {};
}

RPMAPP_DECL expected<void> create_queues(ConnectionCore& core, const ConnConfig& cfg) noexcept {
  ibv_context* verbs = core.id->verbs;
  if (cfg.completion_vector > 0 && cfg.completion_vector >= verbs->num_comp_vectors)
    return fail(invalid("ConnConfig", "completion_vector {} is not below the device's {} vectors",
                        cfg.completion_vector, verbs->num_comp_vectors));
  if (auto ok = check_device_limits(cfg, *core.peer, core.srq != nullptr, core.shared_cq != nullptr); !ok) return ok;
  // into the core's handles, which keep no provider of their own
  auto open_comp_channel = [verbs](OwnedCompChannel& out) -> expected<void> {
    CompChannel made;
    auto ok = make_comp_channel(made, verbs);
    if (ok) out.reset(made.release());
    return ok;
  };
  ibv_cq* send_cq = nullptr;
  if (core.shared_cq) {
    if (core.shared_cq->peer->context != verbs)
      return fail(context_mismatch("ConnConfig", "the shared CQ (shared_cq) is on", core.shared_cq->peer->context,
                                   verbs));
    send_cq = core.shared_cq->cq.get();
  } else {
    if (cfg.completion_channel)
      if (auto ok = open_comp_channel(core.comp_channel); !ok) return ok;
    if (auto ok = open_cq(core, core.cq, cfg.cq_size, core.comp_channel.get()); !ok) return ok;
    send_cq = core.cq.get();
  }
  const bool srq_has_cq = core.srq && core.srq->rcq;
  if (cfg.rcq_size > 0 && !srq_has_cq) {
    ibv_comp_channel* channel = core.comp_channel.get();
    if (cfg.completion_channel && !cfg.shared_completion_channel) {
      if (auto ok = open_comp_channel(core.rcq_channel); !ok) return ok;
      channel = core.rcq_channel.get();
    }
    if (auto ok = open_cq(core, core.rcq, cfg.rcq_size, channel); !ok) return ok;
  }
  ibv_qp_init_attr_ex attr{};
  attr.send_cq = send_cq;
  ibv_cq* receive = core.receive_cq();
  attr.recv_cq = receive != nullptr ? receive : send_cq;
  attr.srq = core.srq ? core.srq->srq.get() : nullptr;
  attr.cap.max_send_wr = cfg.sq_size;
  attr.cap.max_recv_wr = core.srq ? 0 : cfg.rq_size;
  attr.cap.max_send_sge = cfg.max_sge;
  attr.cap.max_recv_sge = cfg.max_sge;
  attr.cap.max_inline_data = cfg.max_inline_data;
  attr.qp_type = IBV_QPT_RC;
  attr.sq_sig_all = 0;
  const Provider& p = provider();
  // EINVAL: the device refused a size. Say which were asked: its inline limit is in none
  // of its attributes (siw takes 80), so a config cannot be checked before the call.
  const auto refused = [&cfg, &attr, iwarp = core.peer->iwarp](const char* call) {
    const int e = errno;
    if (e != EINVAL) return provider_error(call, e);
    return make_error(errc::provider, e, call,
                      "the device refused the queue pair: sq_size {}, rq_size {}, max_sge {}, "
                      "max_inline_data {}{}",
                      cfg.sq_size, attr.cap.max_recv_wr, cfg.max_sge, cfg.max_inline_data,
                      iwarp ? " (siw takes at most 80 bytes inline)" : "");
  };
  errno = 0;
  if (core.peer->native_atomic_write || core.peer->native_flush) {
    // librpma's way: the extended QP with native atomic writes and flushes; the rest still
    // posts through ibv_post_send.
    attr.comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS;
    attr.pd = core.peer->pd.get();
    const std::uint64_t none = 0;
    attr.send_ops_flags =
        (core.peer->native_atomic_write ? native_atomic_write_abi::qp_ex_with_atomic_write : none) |
        (core.peer->native_flush ? native_flush_abi::qp_ex_with_flush : none);
    if (p.create_qp_ex(core.id.get(), &attr) != 0) {
      // EOPNOTSUPP: the kernel offers the native operations, the userspace provider that
      // runs does not (a program built on rdma-core 44 or newer, run on an older one)
      if (errno == EOPNOTSUPP)
        return fail(make_error(errc::provider, EOPNOTSUPP, "rdma_create_qp_ex",
                               "the device reports native{}{} but its libibverbs provider does "
                               "not take them: this program was built on a newer rdma-core "
                               "than the one it runs on",
                               core.peer->native_atomic_write ? " atomic write" : "",
                               core.peer->native_flush ? " flush" : ""));
      return fail(refused("rdma_create_qp_ex"));
    }
  } else {
    ibv_qp_init_attr plain{};
    plain.send_cq = attr.send_cq;
    plain.recv_cq = attr.recv_cq;
    plain.srq = attr.srq;
    plain.cap = attr.cap;
    plain.qp_type = attr.qp_type;
    plain.sq_sig_all = attr.sq_sig_all;
    if (p.create_qp(core.id.get(), core.peer->pd.get(), &plain) != 0)
      return fail(refused("rdma_create_qp"));
    attr.cap = plain.cap;
  }
  core.qp.reset(core.id.get());
  core.qp_num = core.id->qp->qp_num;
  core.max_inline_data = attr.cap.max_inline_data;
  // Routed before anything can complete: the queue pair is not connected yet.
  if (core.shared_cq)
    if (auto ok = core.shared_cq->routes.add(p, send_cq, core.qp_num, core.path); !ok) return ok;
  if (srq_has_cq)
    if (auto ok = core.srq->routes.add(p, core.srq->rcq.get(), core.qp_num, core.path); !ok)
      return ok;
  return {};
}

RPMAPP_DECL rdma_conn_param conn_param(std::span<const std::byte> private_data,
                                       const ConnSettings& settings) noexcept {
  rdma_conn_param param{};
  param.private_data = private_data.empty() ? nullptr : private_data.data();
  param.private_data_len = static_cast<std::uint8_t>(private_data.size());
  param.responder_resources = RDMA_MAX_RESP_RES;
  param.initiator_depth = RDMA_MAX_INIT_DEPTH;
  param.flow_control = 1;
  param.retry_count = settings.retry_count;
  param.rnr_retry_count = settings.rnr_retry_count;
  return param;
}

RPMAPP_DECL void ReceivedPrivateData::store(const rdma_cm_event& event) {
  const auto* data = static_cast<const std::byte*>(event.param.conn.private_data);
  const std::uint8_t size = data != nullptr ? event.param.conn.private_data_len : 0;
  ReceivedPrivateData made;
  if (std::all_of(data, data + size, [](std::byte b) { return b == std::byte{0}; })) {
    made.bits_ = (std::uintptr_t{size} << 1) | 1;
  } else {
    auto* copy = new std::byte[1 + std::size_t{size}];
    copy[0] = std::byte{size};
    std::copy(data, data + size, copy + 1);
    made.bits_ = reinterpret_cast<std::uintptr_t>(copy);
  }
  swap(made);
}

RPMAPP_DECL expected<std::size_t> copy_out(const char* call, std::span<const std::byte> from,
                                           std::span<std::byte> to) noexcept {
  if (to.size() < from.size())
    return fail(invalid(call, "buffer of {} bytes is too small for {} bytes", to.size(),
                        from.size()));
  std::copy(from.begin(), from.end(), to.begin());
  return from.size();
}

}  // namespace detail
RPMAPP_END_NAMESPACE
