// What a connection request and a connection own: the cm_id with its own event channel,
// the completion channel, the completion queues and the queue pair.
#pragma once

#include <rpmapp/config.hpp>
#include <rpmapp/detail/cm_event.hpp>
#include <rpmapp/detail/errors.hpp>
#include <rpmapp/detail/handles.hpp>
#include <rpmapp/peer.hpp>
#include <rpmapp/private_data.hpp>

#include <cstddef>
#include <memory>
#include <span>
#include <string>
#include <vector>

RPMAPP_BEGIN_NAMESPACE
namespace detail {

/// Member order is teardown order, reversed: the queue pair goes first, then the CQs and
/// their channel, then the cm_id (rejected first if it is an unanswered request), then its
/// event channel, and the protection domain (Peer) last.
struct ConnectionCore {
  const Provider* seam = current_provider;  // the provider that makes and releases it
  std::shared_ptr<PeerState> peer;
  EventChannel channel;
  CmId id;
  CompChannel comp_channel;
  CompletionQueue cq;
  CompletionQueue rcq;
  QueuePairOf qp;
  std::vector<std::byte> private_data;
  std::string device;
  ConnConfig config;
};

/// Remembers the first failure of a teardown sequence that goes on regardless.
struct FirstError {
  bool failed = false;
  Error error;
  /// For calls returning -1 and setting errno (librdmacm).
  void errno_call(int rc, const char* call) noexcept {
    if (rc != 0) note(provider_error(call, errno));
  }
  /// For calls returning an errno value (libibverbs).
  void value_call(int rc, const char* call) noexcept {
    if (rc != 0) note(provider_error(call, rc));
  }
  void note(const Error& e) noexcept {
    if (!failed) {
      failed = true;
      error = e;
    }
  }
  expected<void> result() const noexcept {
    if (failed) return fail(error);
    return {};
  }
};

/// Releases everything `core` owns, in teardown order, reporting the first failure.
inline expected<void> close_core(ConnectionCore& core) noexcept {
  const Provider& p = *core.seam;
  FirstError first;
  if (core.qp) p.destroy_qp(core.qp.release());
  if (core.rcq) first.value_call(p.destroy_cq(core.rcq.release()), "ibv_destroy_cq");
  if (core.cq) first.value_call(p.destroy_cq(core.cq.release()), "ibv_destroy_cq");
  if (core.comp_channel)
    first.value_call(p.destroy_comp_channel(core.comp_channel.release()),
                     "ibv_destroy_comp_channel");
  if (core.id) {
    errno = 0;
    if (core.id.get_deleter().reject_first)
      first.errno_call(p.reject(core.id.get(), nullptr, 0), "rdma_reject");
    errno = 0;
    first.errno_call(p.destroy_id(core.id.release()), "rdma_destroy_id");
  }
  if (core.channel) p.destroy_event_channel(core.channel.release());
  core.peer.reset();
  return first.result();
}

inline expected<void> check_config(const char* call, const ConnConfig& cfg) noexcept {
  if (cfg.cq_size == 0 || cfg.sq_size == 0 || cfg.rq_size == 0)
    return fail(invalid(call, "cq_size, sq_size and rq_size must be at least 1"));
  if (cfg.cq_size > 0x7fffffffu || cfg.rcq_size > 0x7fffffffu)
    return fail(invalid(call, "cq_size and rcq_size must fit in an int"));
  if (cfg.retry_count > 7 || cfg.rnr_retry_count > 7)
    return fail(invalid(call, "retry_count and rnr_retry_count must be in 0..7"));
  if (cfg.timeout.count() <= 0 || cfg.timeout.count() > 0x7fffffff)
    return fail(invalid(call, "timeout must be positive and fit in an int of ms"));
  return {};
}

inline expected<void> check_private_data(const char* call, std::span<const std::byte> data,
                                         std::size_t limit, const char* what) noexcept {
  if (data.size() > limit)
    return fail(invalid(call, "{} private data is {} bytes, more than the {} RDMA_PS_TCP allows",
                        what, data.size(), limit));
  return {};
}

/// Creates the completion channel, CQ(s) and queue pair of `core->id` on `core->peer`.
inline expected<void> create_queues(ConnectionCore& core, const ConnConfig& cfg) noexcept {
  const Provider& p = provider();
  ibv_context* verbs = core.id->verbs;
  errno = 0;
  core.comp_channel.reset(p.create_comp_channel(verbs));
  if (!core.comp_channel) return fail(provider_error("ibv_create_comp_channel", errno));
  errno = 0;
  core.cq.reset(p.create_cq(verbs, static_cast<int>(cfg.cq_size), nullptr,
                            core.comp_channel.get(), 0));
  if (!core.cq) return fail(provider_error("ibv_create_cq", errno));
  if (int rc = p.req_notify_cq(core.cq.get(), 0); rc != 0)
    return fail(provider_error("ibv_req_notify_cq", rc));
  if (cfg.rcq_size > 0) {
    errno = 0;
    core.rcq.reset(p.create_cq(verbs, static_cast<int>(cfg.rcq_size), nullptr,
                               core.comp_channel.get(), 0));
    if (!core.rcq) return fail(provider_error("ibv_create_cq", errno));
    if (int rc = p.req_notify_cq(core.rcq.get(), 0); rc != 0)
      return fail(provider_error("ibv_req_notify_cq", rc));
  }
  ibv_qp_init_attr attr{};
  attr.send_cq = core.cq.get();
  attr.recv_cq = core.rcq ? core.rcq.get() : core.cq.get();
  attr.cap.max_send_wr = cfg.sq_size;
  attr.cap.max_recv_wr = cfg.rq_size;
  attr.cap.max_send_sge = 1;
  attr.cap.max_recv_sge = 1;
  attr.cap.max_inline_data = 8;
  attr.qp_type = IBV_QPT_RC;
  attr.sq_sig_all = 0;
  errno = 0;
  if (p.create_qp(core.id.get(), core.peer->pd.get(), &attr) != 0)
    return fail(provider_error("rdma_create_qp", errno));
  core.qp.reset(core.id.get());
  return {};
}

inline rdma_conn_param conn_param(std::span<const std::byte> private_data,
                                  const ConnConfig& cfg) noexcept {
  rdma_conn_param param{};
  param.private_data = private_data.empty() ? nullptr : private_data.data();
  param.private_data_len = static_cast<std::uint8_t>(private_data.size());
  param.responder_resources = RDMA_MAX_RESP_RES;
  param.initiator_depth = RDMA_MAX_INIT_DEPTH;
  param.flow_control = 1;
  param.retry_count = cfg.retry_count;
  param.rnr_retry_count = cfg.rnr_retry_count;
  return param;
}

/// Copies the private data an event carries (rdma_cm pads it to the protocol's size).
inline void store_private_data(std::vector<std::byte>& out, const rdma_cm_event& event) {
  const auto* data = static_cast<const std::byte*>(event.param.conn.private_data);
  if (data == nullptr) {
    out.clear();
    return;
  }
  out.assign(data, data + event.param.conn.private_data_len);
}

/// Copies `from` into the caller's buffer; nothing is written on failure.
inline expected<std::size_t> copy_out(const char* call, std::span<const std::byte> from,
                                      std::span<std::byte> to) noexcept {
  if (to.size() < from.size())
    return fail(invalid(call, "buffer of {} bytes is too small for {} bytes", to.size(),
                        from.size()));
  std::copy(from.begin(), from.end(), to.begin());
  return from.size();
}

}  // namespace detail
RPMAPP_END_NAMESPACE
