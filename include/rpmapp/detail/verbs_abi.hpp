// ibverbs names that some supported rdma-core releases lack, by their ABI values (kernel
// uapi and libibverbs enums), so that a build on any rdma-core can use and test for them.
#pragma once

#include <rpmapp/version.hpp>

#include <cstdint>

RPMAPP_BEGIN_NAMESPACE
namespace detail {

/// IB_UVERBS_DEVICE_ATOMIC_WRITE in device_cap_flags_ex (rdma-core 44 has no name for it
/// in <infiniband/verbs.h>).
inline constexpr std::uint64_t device_atomic_write_flag = 1ull << 40;

/// rdma-core 44's native atomic write, by the ABI values of its names, so that a build on
/// an older rdma-core (39: Ubuntu 22.04) compiles and reports it emulated.
namespace native_atomic_write_abi {
inline constexpr std::uint64_t qp_ex_with_atomic_write = 1ull << 12;  // IBV_QP_EX_WITH_ATOMIC_WRITE
inline constexpr int wr_atomic_write = 15;                             // IBV_WR_ATOMIC_WRITE
inline constexpr int wc_atomic_write = 9;                              // IBV_WC_ATOMIC_WRITE
}  // namespace native_atomic_write_abi

/// rdma-core 45's native RDMA FLUSH, by the ABI values of its names, so that a build on any
/// rdma-core can test for it (rdma-core 44, Debian 12's, names none of them).
namespace native_flush_abi {
inline constexpr std::uint64_t device_flush_global = 1ull << 38;      // IB_UVERBS_DEVICE_FLUSH_GLOBAL
inline constexpr std::uint64_t device_flush_persistent = 1ull << 39;  // IB_UVERBS_DEVICE_FLUSH_PERSISTENT
inline constexpr int access_flush_global = 1 << 8;                    // IBV_ACCESS_FLUSH_GLOBAL
inline constexpr int access_flush_persistent = 1 << 9;                // IBV_ACCESS_FLUSH_PERSISTENT
inline constexpr std::uint64_t qp_ex_with_flush = 1ull << 11;         // IBV_QP_EX_WITH_FLUSH
inline constexpr int wr_flush = 14;                                   // IBV_WR_FLUSH
inline constexpr int wc_flush = 8;                                    // IBV_WC_FLUSH
inline constexpr std::uint8_t type_global = 1u << 0;                  // IBV_FLUSH_GLOBAL
inline constexpr std::uint8_t type_persistent = 1u << 1;              // IBV_FLUSH_PERSISTENT
inline constexpr std::uint8_t level_range = 0;                        // IBV_FLUSH_RANGE
}  // namespace native_flush_abi

}  // namespace detail
RPMAPP_END_NAMESPACE
