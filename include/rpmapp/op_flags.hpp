// rpmapp::Completion and rpmapp::FlushType: the options of a connection's operations.
#pragma once

#include <rpmapp/version.hpp>

RPMAPP_BEGIN_NAMESPACE

/// When an operation produces a work completion (librpma's RPMA_F_COMPLETION_*; same values).
enum class Completion : int {
  on_error = 1,  ///< only when it fails (an unsignaled work request)
  always = 3,    ///< always (IBV_SEND_SIGNALED)
};

/// What kind of flush (librpma's enum rpma_flush_type).
enum class FlushType {
  persistent,  ///< to the peer's persistence domain (needs its direct_write_to_pmem)
  visibility,  ///< to global visibility
};

RPMAPP_END_NAMESPACE
