// The definitions of rpmapp/detail/handles.hpp: release logging, FirstError, destroy_cm_id.
#pragma once

#include <rpmapp/detail/handles.hpp>

#include <cerrno>

RPMAPP_BEGIN_NAMESPACE
namespace detail {

RPMAPP_DECL void log_errno_release(const Teardown& by, int rc, const char* call) noexcept {
  if (rc != 0) [[unlikely]] {
    const int e = errno;
    if (log_enabled(by.level)) log(by.level, by.where, provider_error(call, e));
  }
}

RPMAPP_DECL void log_value_release(const Teardown& by, int rc, const char* call) noexcept {
  if (rc != 0) [[unlikely]] {
    if (log_enabled(by.level)) log(by.level, by.where, provider_error(call, rc));
  }
}

RPMAPP_DECL void FirstError::note(const Error& e) noexcept {
  if (!error) {
    error = e;
    return;
  }
  log(less_severe(by.level), by.where, e);
}

RPMAPP_DECL void destroy_cm_id(const Provider& p, rdma_cm_id* id, const Teardown& by) noexcept {
  errno = 0;
  log_errno_release(by, p.destroy_id(id), "rdma_destroy_id");
}

}  // namespace detail
RPMAPP_END_NAMESPACE
