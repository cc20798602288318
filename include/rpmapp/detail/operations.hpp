// The data-path operations of a connection (Conn's, and ConnReq::recv), on its core.
#pragma once

#include <rpmapp/detail/connection.hpp>
#include <rpmapp/detail/data_path.hpp>

#include <span>

RPMAPP_BEGIN_NAMESPACE
namespace detail {

inline ibv_qp* qp_of(const ConnectionCore& core) noexcept { return core.id->qp; }

/// again on an accepting side on iWARP before its ESTABLISHED event (ConnectionCore::
/// before_established); receives are not checked (they wait for the peer).
inline expected<void> await_established(const char* call, const ConnectionCore& core) noexcept {
  if (core.before_established.load(std::memory_order_acquire)) [[unlikely]]
    return fail(not_established_yet(call, core.peer->context));
  return {};
}

inline expected<void> read(const char* call, ConnectionCore& core, const MrLocal& dst,
                           std::size_t dst_offset, const MrRemote& src, std::size_t src_offset,
                           std::size_t len, Completion when, std::uint64_t context) noexcept {
  if (auto ok = check_completion_flag(call, when); !ok) [[unlikely]]
    return ok;
  if (auto ok = await_established(call, core); !ok) [[unlikely]]
    return ok;
  auto sge = local_sge(call, dst, dst_offset, len, MrUsage::read_dst, core.peer->pd.get());
  if (!sge) [[unlikely]]
    return fail(sge.error());
  if (auto ok = check_remote(call, src, src_offset, len, MrUsage::read_src); !ok) [[unlikely]]
    return ok;
  ibv_send_wr wr = rdma_wr(IBV_WR_RDMA_READ, *sge, src, src_offset, when, context);
  return post_send(call, qp_of(core), wr);
}

inline expected<void> write(const char* call, ConnectionCore& core, const MrRemote& dst,
                            std::size_t dst_offset, const MrLocal& src, std::size_t src_offset,
                            std::size_t len, Completion when, std::uint64_t context,
                            ibv_wr_opcode opcode, std::uint32_t imm) noexcept {
  if (auto ok = check_completion_flag(call, when); !ok) [[unlikely]]
    return ok;
  if (auto ok = await_established(call, core); !ok) [[unlikely]]
    return ok;
  if (opcode == IBV_WR_RDMA_WRITE_WITH_IMM && core.peer->iwarp) [[unlikely]]
    return fail(no_immediate_data(call, core.peer->context));
  auto sge = local_sge(call, src, src_offset, len, MrUsage::write_src, core.peer->pd.get());
  if (!sge) [[unlikely]]
    return fail(sge.error());
  if (auto ok = check_remote(call, dst, dst_offset, len, MrUsage::write_dst); !ok) [[unlikely]]
    return ok;
  ibv_send_wr wr = rdma_wr(opcode, *sge, dst, dst_offset, when, context);
  if (opcode == IBV_WR_RDMA_WRITE_WITH_IMM) wr.imm_data = imm_to_wire(imm);
  return post_send(call, qp_of(core), wr);
}

inline expected<void> atomic_write(const char* call, ConnectionCore& core, const MrRemote& dst,
                                   std::size_t dst_offset, std::span<const std::byte, 8> value,
                                   Completion when, std::uint64_t context) noexcept {
  if (auto ok = check_completion_flag(call, when); !ok) [[unlikely]]
    return ok;
  if (auto ok = await_established(call, core); !ok) [[unlikely]]
    return ok;
  if (auto ok = check_remote(call, dst, dst_offset, 8, MrUsage::write_dst); !ok) [[unlikely]]
    return ok;
  // The address, not the offset: a peer's region may start anywhere, and an unaligned
  // target fails the native operation at the responder and may tear the emulated one.
  const std::uint64_t remote = dst.address() + dst_offset;
  if (remote % 8 != 0) [[unlikely]]
    return fail(invalid(call, "remote address 0x{:x} (the region's 0x{:x} + offset {}) is not 8-byte aligned",
                        remote, dst.address(), dst_offset));
  if (core.peer->native_atomic_write) {
    const int rc = provider().post_atomic_write(qp_of(core), context, signaled(when), dst.rkey(),
                                                remote, value.data());
    if (rc != 0) [[unlikely]]
      return fail(post_error(call, "ibv_wr_complete", rc));
    return {};
  }
  // librpma 1.2's emulation: an 8-byte inline RDMA WRITE, fenced so that it waits for
  // any read in flight (e.g. an emulated flush) before it executes.
  if (core.max_inline_data < 8) [[unlikely]]
    return fail(Error(errc::nosupp, 0, call,
                      "emulated atomic write needs max_inline_data of at least 8 (the device has no native one)"));
  ibv_sge sge;
  sge.addr = reinterpret_cast<std::uintptr_t>(value.data());
  sge.length = 8;
  sge.lkey = 0;  // inline: not looked at
  ibv_send_wr wr = rdma_wr(IBV_WR_RDMA_WRITE, sge, dst, dst_offset, when, context);
  wr.send_flags |= IBV_SEND_INLINE | IBV_SEND_FENCE;
  return post_send(call, qp_of(core), wr);
}

inline expected<void> flush(const char* call, ConnectionCore& core, const MrRemote& dst,
                            std::size_t dst_offset, std::size_t len, FlushType type,
                            Completion when, std::uint64_t context) noexcept {
  if (auto ok = check_completion_flag(call, when); !ok) [[unlikely]]
    return ok;
  if (auto ok = await_established(call, core); !ok) [[unlikely]]
    return ok;
  if (type != FlushType::persistent && type != FlushType::visibility) [[unlikely]]
    return fail(invalid(call, "flush type {} is neither persistent nor visibility", static_cast<int>(type)));
  if (!dst) [[unlikely]]
    return fail(Error(errc::inval, 0, call, "the remote region is empty"));
  if (!in_bounds(dst_offset, len, dst.size())) [[unlikely]]
    return fail(invalid(call, "remote range [{}, +{}) is not within the peer's {}-byte region",
                        dst_offset, len, dst.size()));
  if (type == FlushType::persistent && !core.direct_write_to_pmem) [[unlikely]]
    return fail(Error(errc::nosupp, 0, call,
                      "the peer did not declare direct write to persistent memory "
                      "(apply its PeerConfig with Conn::apply_remote_peer_config)"));
  const MrUsage need = type == FlushType::persistent ? MrUsage::flush_persistent : MrUsage::flush_visibility;
  if (!has(dst.usage(), need)) [[unlikely]]
    return fail(make_error(errc::nosupp, 0, call, "the peer did not register the remote region for {}",
                           usage_name(need)));
  if (core.peer->native_flush) {  // librpma 1.3's: RDMA FLUSH of the range
    const std::uint8_t native_type = type == FlushType::persistent ? native_flush_abi::type_persistent
                                                                   : native_flush_abi::type_global;
    const int rc = provider().post_flush(qp_of(core), context, signaled(when), dst.rkey(),
                                         dst.address() + dst_offset, len, native_type,
                                         native_flush_abi::level_range);
    if (rc != 0) [[unlikely]]
      return fail(post_error(call, "ibv_wr_complete", rc));
    return {};
  }
  // librpma's emulation (APM): an RDMA READ after the writes makes them visible (and, with
  // direct write to PMem, persistent) before it completes. It reads up to 8 bytes at the
  // flushed offset into the Peer's flush buffer (never past the region's end).
  const std::uint64_t left = dst.size() - dst_offset;
  ibv_sge sge;
  sge.addr = reinterpret_cast<std::uintptr_t>(core.peer->flush_mr->addr);
  sge.length = static_cast<std::uint32_t>(left < PeerState::flush_read_size ? left : PeerState::flush_read_size);
  sge.lkey = core.peer->flush_mr->lkey;
  ibv_send_wr wr = rdma_wr(IBV_WR_RDMA_READ, sge, dst, dst_offset, when, context);
  return post_send(call, qp_of(core), wr);
}

inline expected<void> send(const char* call, ConnectionCore& core, const MrLocal& src,
                           std::size_t offset, std::size_t len, Completion when,
                           std::uint64_t context, ibv_wr_opcode opcode, std::uint32_t imm) noexcept {
  if (auto ok = check_completion_flag(call, when); !ok) [[unlikely]]
    return ok;
  if (auto ok = await_established(call, core); !ok) [[unlikely]]
    return ok;
  if (opcode == IBV_WR_SEND_WITH_IMM && core.peer->iwarp) [[unlikely]]
    return fail(no_immediate_data(call, core.peer->context));
  auto sge = local_sge(call, src, offset, len, MrUsage::send, core.peer->pd.get());
  if (!sge) [[unlikely]]
    return fail(sge.error());
  ibv_send_wr wr = send_wr(opcode, *sge, when, context);
  if (opcode == IBV_WR_SEND_WITH_IMM) wr.imm_data = imm_to_wire(imm);
  return post_send(call, qp_of(core), wr);
}

inline expected<void> recv(const char* call, ConnectionCore& core, const MrLocal& dst,
                           std::size_t offset, std::size_t len, std::uint64_t context) noexcept {
  if (core.srq) [[unlikely]]
    return fail(Error(errc::inval, 0, call,
                      "the connection receives through a shared receive queue: post with Srq::recv"));
  auto sge = recv_sge(call, dst, offset, len, core.peer->pd.get());
  if (!sge) [[unlikely]]
    return fail(sge.error());
  return post_recv(call, qp_of(core), *sge, context, core.peer->iwarp);
}

}  // namespace detail
RPMAPP_END_NAMESPACE
