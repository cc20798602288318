// Posting work requests: the checks every operation makes before it posts (bounds and
// usage of the local and the remote region), and the posts themselves. Nothing here
// allocates, formats or locks on success; an Error is built only on failure.
#pragma once

#include <rpmapp/detail/address.hpp>
#include <rpmapp/detail/errors.hpp>
#include <rpmapp/detail/provider.hpp>
#include <rpmapp/error.hpp>
#include <rpmapp/mr.hpp>
#include <rpmapp/op_flags.hpp>

#include <arpa/inet.h>

#include <cstdint>

RPMAPP_BEGIN_NAMESPACE

namespace detail {

struct MrAccess {
  static const ibv_mr* get(const MrLocal& mr) noexcept { return mr.mr_.get(); }
  static MrUsage usage(const MrLocal& mr) noexcept { return mr.usage_; }
};

inline const char* usage_name(MrUsage bit) noexcept {
  switch (bit) {
    case MrUsage::read_src: return "read_src";
    case MrUsage::read_dst: return "read_dst";
    case MrUsage::write_src: return "write_src";
    case MrUsage::write_dst: return "write_dst";
    case MrUsage::flush_visibility: return "flush_visibility";
    case MrUsage::flush_persistent: return "flush_persistent";
    case MrUsage::send: return "send";
    case MrUsage::recv: return "recv";
  }
  return "?";
}

/// Why local_sge refuses [offset, offset + len) of `mr` (its checks in the same order).
/// Out of line and cold: the success path of every operation stays small and inlined.
[[gnu::cold, gnu::noinline]] inline Error local_sge_error(const char* call, const MrLocal& mr,
                                                         std::size_t offset, std::size_t len,
                                                         MrUsage need, const ibv_pd* pd) noexcept {
  const ibv_mr* raw = MrAccess::get(mr);
  if (raw == nullptr)
    return Error(errc::inval, 0, call, "the local region is empty (moved from or deregistered)");
  if (raw->pd != pd) return Error(errc::inval, 0, call, "the local region is registered on another Peer");
  if (!in_bounds(offset, len, raw->length))
    return invalid(call, "local range [{}, +{}) is not within the {}-byte region", offset, len, raw->length);
  if (len > 0xffffffffu) return invalid(call, "length {} is over the 4 GiB a work request carries", len);
  return invalid(call, "the local region is not registered for {}", usage_name(need));
}

/// The scatter/gather entry for [offset, offset + len) of `mr`, registered on `pd` for `need`.
/// Errors: inval (empty region, another protection domain, out of bounds, over 4 GiB,
/// usage missing).
inline expected<ibv_sge> local_sge(const char* call, const MrLocal& mr, std::size_t offset,
                                   std::size_t len, MrUsage need, const ibv_pd* pd) noexcept {
  const ibv_mr* raw = MrAccess::get(mr);
  if (raw == nullptr || raw->pd != pd || !in_bounds(offset, len, raw->length) ||
      len > 0xffffffffu || !has(MrAccess::usage(mr), need)) [[unlikely]]
    return fail(local_sge_error(call, mr, offset, len, need, pd));
  ibv_sge sge;
  sge.addr = reinterpret_cast<std::uintptr_t>(raw->addr) + offset;
  sge.length = static_cast<std::uint32_t>(len);
  sge.lkey = raw->lkey;
  return sge;
}

/// Why check_remote refuses [offset, offset + len) of `mr` (its checks in the same order).
[[gnu::cold, gnu::noinline]] inline Error remote_error(const char* call, const MrRemote& mr,
                                                      std::size_t offset, std::size_t len,
                                                      MrUsage need) noexcept {
  if (!mr) return Error(errc::inval, 0, call, "the remote region is empty");
  if (!in_bounds(offset, len, mr.size()))
    return invalid(call, "remote range [{}, +{}) is not within the peer's {}-byte region", offset,
                   len, mr.size());
  if (len > 0xffffffffu) return invalid(call, "length {} is over the 4 GiB a work request carries", len);
  return invalid(call, "the peer did not register the remote region for {}", usage_name(need));
}

/// Checks [offset, offset + len) of the peer's region and the usage `need`.
/// Errors: inval (empty region, out of bounds, usage missing).
inline expected<void> check_remote(const char* call, const MrRemote& mr, std::size_t offset,
                                   std::size_t len, MrUsage need) noexcept {
  if (!mr || !in_bounds(offset, len, mr.size()) || len > 0xffffffffu || !has(mr.usage(), need))
      [[unlikely]]
    return fail(remote_error(call, mr, offset, len, need));
  return {};
}

inline expected<void> check_completion_flag(const char* call, Completion when) noexcept {
  if (when != Completion::always && when != Completion::on_error) [[unlikely]]
    return fail(invalid(call, "completion flag {} is neither on_error nor always", static_cast<int>(when)));
  return {};
}

inline unsigned signaled(Completion when) noexcept {
  return when == Completion::always ? static_cast<unsigned>(IBV_SEND_SIGNALED) : 0u;
}

/// An operation with immediate data on an iWARP device, which has none (siw's provider
/// refuses the opcode with EINVAL).
[[gnu::cold, gnu::noinline]] inline Error no_immediate_data(const char* call, const ibv_context* device) noexcept {
  return make_error(errc::nosupp, 0, call, "{} is an iWARP device, and iWARP has no immediate data",
                    device_name(device));
}

[[gnu::cold, gnu::noinline]] inline Error not_established_yet(const char* call, const ibv_context* device) noexcept {
  return make_error(errc::again, 0, call,
                    "{} is an iWARP device: the accepting side may post sends, writes and reads only once it "
                    "saw ConnEvent::established (before it they can reach the client ahead of the MPA reply "
                    "and end the connection)",
                    device_name(device));
}

/// The failure of the public function `call` in the post `post_call`.
[[gnu::cold, gnu::noinline]] inline Error post_error(const char* call, const char* post_call, int rc) noexcept {
  rc = verbs_errno(rc);
  // ENOMEM from a post means the queue is full, not that memory ran out.
  Error e = rc == ENOMEM ? Error(errc::provider, rc, post_call,
                                 "the queue is full (more work requests in flight than its size)")
                         : Error(errc::provider, rc, post_call);
  return e.name_operation(call);
}

/// Posts one send-queue work request with one (or no) scatter/gather entry.
inline expected<void> post_send(const char* call, ibv_qp* qp, ibv_send_wr& wr) noexcept {
  ibv_send_wr* bad = nullptr;
  if (int rc = provider().post_send(qp, &wr, &bad); rc != 0) [[unlikely]]
    return fail(post_error(call, "ibv_post_send", rc));
  return {};
}

/// A receive work request of one scatter/gather entry; for a length of 0 of none (as
/// librpma posts it), except on iWARP: siw's provider refuses a receive without an entry
/// (EINVAL), so there it has one of length 0.
inline ibv_recv_wr recv_wr(ibv_sge& sge, std::uint64_t context, bool iwarp) noexcept {
  ibv_recv_wr wr{};
  wr.wr_id = context;
  wr.num_sge = sge.length != 0 ? 1 : 0;
  if (iwarp) wr.num_sge = 1;
  wr.sg_list = wr.num_sge != 0 ? &sge : nullptr;
  return wr;
}

inline expected<void> post_recv(const char* call, ibv_qp* qp, ibv_sge sge, std::uint64_t context,
                                bool iwarp) noexcept {
  ibv_recv_wr wr = recv_wr(sge, context, iwarp);
  ibv_recv_wr* bad = nullptr;
  if (int rc = provider().post_recv(qp, &wr, &bad); rc != 0) [[unlikely]]
    return fail(post_error(call, "ibv_post_recv", rc));
  return {};
}

inline expected<void> post_srq_recv(const char* call, ibv_srq* srq, ibv_sge sge,
                                    std::uint64_t context, bool iwarp) noexcept {
  ibv_recv_wr wr = recv_wr(sge, context, iwarp);
  ibv_recv_wr* bad = nullptr;
  if (int rc = provider().post_srq_recv(srq, &wr, &bad); rc != 0) [[unlikely]]
    return fail(post_error(call, "ibv_post_srq_recv", rc));
  return {};
}

/// A receive of [offset, offset + len) of `dst` (registered for recv).
inline expected<ibv_sge> recv_sge(const char* call, const MrLocal& dst, std::size_t offset,
                                  std::size_t len, const ibv_pd* pd) noexcept {
  return local_sge(call, dst, offset, len, MrUsage::recv, pd);
}

/// A send-queue work request of one (or, for a length of 0, no) scatter/gather entry.
inline ibv_send_wr send_wr(ibv_wr_opcode opcode, ibv_sge& sge, Completion when,
                           std::uint64_t context) noexcept {
  ibv_send_wr wr{};
  wr.wr_id = context;
  wr.opcode = opcode;
  wr.sg_list = sge.length != 0 ? &sge : nullptr;
  wr.num_sge = sge.length != 0 ? 1 : 0;
  wr.send_flags = signaled(when);
  return wr;
}

/// An RDMA work request (read / write / write with immediate) to the peer's `remote`.
inline ibv_send_wr rdma_wr(ibv_wr_opcode opcode, ibv_sge& sge, const MrRemote& remote,
                           std::size_t remote_offset, Completion when, std::uint64_t context) noexcept {
  ibv_send_wr wr = send_wr(opcode, sge, when, context);
  wr.wr.rdma.remote_addr = remote.address() + remote_offset;
  wr.wr.rdma.rkey = remote.rkey();
  return wr;
}

/// librpma puts immediate data on the wire in network order (htonl); so do we, so that
/// a librpma peer reads the same value.
inline std::uint32_t imm_to_wire(std::uint32_t imm) noexcept { return htonl(imm); }

}  // namespace detail

RPMAPP_END_NAMESPACE
