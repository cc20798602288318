// Definitions of rpmapp/mr.hpp: registration, descriptors and deregistration of memory regions.
#pragma once

#include <rpmapp/mr.hpp>

#include <algorithm>
#include <cerrno>

RPMAPP_BEGIN_NAMESPACE

namespace detail {
RPMAPP_DECL void put_le(std::byte* out, std::uint64_t value, int bytes) noexcept {
  for (int i = 0; i < bytes; ++i) out[i] = static_cast<std::byte>(value >> (8 * i));
}

RPMAPP_DECL std::uint64_t get_le(const std::byte* in, int bytes) noexcept {
  std::uint64_t value = 0;
  for (int i = 0; i < bytes; ++i) value |= std::uint64_t(std::to_integer<std::uint8_t>(in[i])) << (8 * i);
  return value;
}

RPMAPP_DECL MrDescriptor
encode_descriptor(std::uint64_t addr, std::uint64_t len, std::uint32_t rkey,
                                           MrUsage usage) noexcept {
  MrDescriptor d{};
  put_le(d.data(), addr, 8);
  put_le(d.data() + 8, len, 8);
  put_le(d.data() + 16, rkey, 4);
  d[20] = static_cast<std::byte>(to_underlying(usage));
  return d;
}

RPMAPP_DECL expected<std::size_t> copy_descriptor(const char* call, const MrDescriptor& d,
                                                  std::span<std::byte> out) noexcept {
  if (out.size() < mr_descriptor_size)
    return fail(invalid(call, "buffer of {} bytes is too small for the {}-byte descriptor", out.size(),
                        mr_descriptor_size));
  std::copy(d.begin(), d.end(), out.begin());
  return mr_descriptor_size;
}
}  // namespace detail

RPMAPP_DECL expected<MrLocal> MrLocal::reg(const Peer& peer, void* ptr, std::size_t size,
                                           MrUsage usage,
                                           MrScope scope) noexcept {
  constexpr const char* call = "MrLocal::reg";
  if (!peer) return detail::fail(detail::moved_from(call));
  if (ptr == nullptr) return detail::fail(detail::invalid(call, "the memory pointer is null"));
  if (size == 0) return detail::fail(detail::invalid(call, "the size is 0"));
  if (to_underlying(usage) == 0)
    return detail::fail(detail::invalid(call, "the usage is empty (no MrUsage bit set)"));
  const detail::PeerState& state = *peer.state();
  if (scope != MrScope::peer && scope != MrScope::grants && scope != MrScope::grants_by_registration)
    return detail::fail(detail::invalid(call, "scope {} is no MrScope", static_cast<int>(scope)));
  const bool for_grants = scope != MrScope::peer;
  const bool by_windows = scope == MrScope::grants && state.memory_windows;
  if (for_grants && state.iwarp && has(usage, MrUsage::read_dst))
    return detail::fail(detail::invalid(
        call, "on iWARP a read_dst region must be remotely writable: register it with MrScope::peer"));
  return detail::no_throw(call, [&]() -> expected<MrLocal> {
    std::unique_ptr<detail::GrantRegistry> grants;
    if (for_grants) grants = std::make_unique<detail::GrantRegistry>();
    auto mr = for_grants ? detail::register_memory(state, ptr, size, usage,
                                                   by_windows ? detail::Rights::for_windows
                                                              : detail::Rights::local_only)
                         : detail::register_memory(state, ptr, size, usage);
    if (!mr) return detail::fail(mr.error());
    return MrLocal(peer.state(), std::move(*mr), usage, scope, by_windows, std::move(grants));
  });
}

RPMAPP_DECL MrLocal& MrLocal::operator=(MrLocal&& other) noexcept {
  if (this != &other) {
    dereg_logged("MrLocal::operator=");
    peer_ = std::move(other.peer_);
    mr_ = std::move(other.mr_);
    usage_ = other.usage_;
    scope_ = other.scope_;
    by_windows_ = other.by_windows_;
    grants_ = std::move(other.grants_);
  }
  return *this;
}

RPMAPP_DECL expected<void> MrLocal::dereg() && noexcept {
  constexpr const char* call = "MrLocal::dereg";
  if (!mr_) return detail::fail(detail::moved_from(call));
  auto released = release({call, LogLevel::notice});
  detail::name_in(released, call);
  return released;
}

RPMAPP_DECL expected<MrDescriptor> MrLocal::descriptor() const noexcept {
  constexpr const char* call = "MrLocal::descriptor";
  if (!mr_) return detail::fail(detail::moved_from(call));
  if (grants_) return detail::fail(grants_only(call));
  return detail::encode_descriptor(reinterpret_cast<std::uintptr_t>(mr_->addr), mr_->length,
                                   mr_->rkey, usage_);
}

RPMAPP_DECL expected<std::size_t>
MrLocal::write_descriptor(std::span<std::byte> out) const noexcept {
  constexpr const char* call = "MrLocal::write_descriptor";
  if (!mr_) return detail::fail(detail::moved_from(call));
  if (grants_) return detail::fail(grants_only(call));
  return detail::copy_descriptor(call, *descriptor(), out);
}

RPMAPP_DECL expected<GrantMode> MrLocal::grant_mode() const noexcept {
  constexpr const char* call = "MrLocal::grant_mode";
  if (!mr_) return detail::fail(detail::moved_from(call));
  if (!grants_) return detail::fail(detail::invalid(call, "the region is registered with MrScope::peer: it has no grants"));
  return by_windows_ ? GrantMode::windows : GrantMode::registrations;
}

RPMAPP_DECL expected<void> MrLocal::advise(std::size_t offset, std::size_t len,
                                           ibv_advise_mr_advice advice,
                                           std::uint32_t flags) const noexcept {
  constexpr const char* call = "MrLocal::advise";
  if (!mr_) return detail::fail(detail::moved_from(call));
  if (len == 0 || len > 0xffffffffu || !detail::in_bounds(offset, len, mr_->length))
    return detail::fail(detail::invalid(call, "range [{}, +{}) is not within the {}-byte region",
                                        offset, len, mr_->length));
  ibv_sge sge{};
  sge.addr = reinterpret_cast<std::uintptr_t>(mr_->addr) + offset;
  sge.length = static_cast<std::uint32_t>(len);
  sge.lkey = mr_->lkey;
  const int rc = detail::provider().advise_mr(mr_->pd, advice, flags, &sge, 1);
  if (rc == 0) return {};
  if (rc == EOPNOTSUPP || rc == ENOTSUP)
    return detail::fail(
        Error(errc::nosupp, rc, "ibv_advise_mr", "the device does not support this advice").name_operation(call));
  if (rc == EINVAL || rc == EFAULT)
    return detail::fail(Error(errc::inval, rc, "ibv_advise_mr").name_operation(call));
  return detail::fail(detail::provider_error_in(call, "ibv_advise_mr", rc));
}

RPMAPP_DECL expected<void> MrLocal::release(detail::Teardown by) noexcept {
  detail::FirstError first{by};
  if (grants_) grants_->revoke_all(first);
  grants_.reset();
  if (mr_) {
    const detail::Provider& p = mr_.get_deleter().provider();
    first.value_call(p.dereg_mr(mr_.release()), "ibv_dereg_mr");
  }
  peer_.reset();
  return first.result();
}

RPMAPP_DECL void MrLocal::dereg_logged(const char* where) noexcept {
  if (!mr_) return;
  if (auto released = release({where, LogLevel::warning}); !released) [[unlikely]]
    detail::log(LogLevel::warning, where, released.error());
}

RPMAPP_DECL expected<MrRemote>
MrRemote::from_descriptor(std::span<const std::byte> descriptor) noexcept {
  constexpr const char* call = "MrRemote::from_descriptor";
  if (descriptor.size() != mr_descriptor_size)
    return detail::fail(detail::invalid(call, "a descriptor is {} bytes, not {}", descriptor.size(),
                                        mr_descriptor_size));
  const std::uint64_t addr = detail::get_le(descriptor.data(), 8);
  const std::uint64_t len = detail::get_le(descriptor.data() + 8, 8);
  const auto rkey = static_cast<std::uint32_t>(detail::get_le(descriptor.data() + 16, 4));
  const auto usage = std::to_integer<std::uint8_t>(descriptor[20]);
  constexpr std::uint8_t known = 0xff;  // every bit of the byte is an MrUsage
  if (usage == 0 || (usage & ~known) != 0)
    return detail::fail(detail::invalid(call, "usage 0x{:02x} is not a set of MrUsage bits", usage));
  if (len == 0) return detail::fail(detail::invalid(call, "the region's length is 0"));
  if (addr + len < addr)
    return detail::fail(detail::invalid(call, "address 0x{:x} + length {} overflows", addr, len));
  return MrRemote(addr, len, rkey, static_cast<MrUsage>(usage));
}

RPMAPP_DECL expected<std::size_t> MrLocal::write_descriptor(std::span<char> out) const noexcept {
  return write_descriptor(std::as_writable_bytes(out));
}

RPMAPP_DECL expected<MrScope> MrLocal::scope() const noexcept {
  if (!mr_) return detail::fail(detail::moved_from("MrLocal::scope"));
  return scope_;
}

RPMAPP_END_NAMESPACE
