// rpmapp's compiled mode: the definitions of every header, to be compiled once.
//
// A program that includes rpmapp in many files defines RPMAPP_SEPARATE_COMPILATION for all
// of them (the compiler's -D, not a #define in one file) and includes this header in
// exactly one of its sources; or it links librpmapp (meson -Dlibrary=static|shared|both,
// pkg-config rpmapp-compiled), which is that source compiled. Without the macro every header is
// self-contained (header-only mode, the default) and this header must not be included.
#pragma once

#if !defined(RPMAPP_SEPARATE_COMPILATION)
#  error "rpmapp/impl/src.hpp is for compiled mode: define RPMAPP_SEPARATE_COMPILATION in every translation unit"
#endif

#include <rpmapp/rpmapp.hpp>

// one line per header with definitions under impl/ (sorted)
#include <rpmapp/impl/common_data.ipp>
#include <rpmapp/impl/conn.ipp>
#include <rpmapp/impl/conn_id.ipp>
#include <rpmapp/impl/conn_req.ipp>
#include <rpmapp/impl/cq.ipp>
#include <rpmapp/impl/detail_address.ipp>
#include <rpmapp/impl/detail_background_connect.ipp>
#include <rpmapp/impl/detail_cm_event.ipp>
#include <rpmapp/impl/detail_completion_routes.ipp>
#include <rpmapp/impl/detail_connection.ipp>
#include <rpmapp/impl/detail_device_context.ipp>
#include <rpmapp/impl/detail_errors.ipp>
#include <rpmapp/impl/detail_event_routes.ipp>
#include <rpmapp/impl/detail_format.ipp>
#include <rpmapp/impl/detail_grants.ipp>
#include <rpmapp/impl/detail_handler_waiters.ipp>
#include <rpmapp/impl/detail_handles.ipp>
#include <rpmapp/impl/detail_listener.ipp>
#include <rpmapp/impl/detail_loop_awaiters.ipp>
#include <rpmapp/impl/detail_loop_core.ipp>
#include <rpmapp/impl/endpoint.ipp>
#include <rpmapp/impl/error.ipp>
#include <rpmapp/impl/event_loop.ipp>
#include <rpmapp/impl/grant.ipp>
#include <rpmapp/impl/log.ipp>
#include <rpmapp/impl/mr.ipp>
#include <rpmapp/impl/peer.ipp>
#include <rpmapp/impl/peer_config.ipp>
#include <rpmapp/impl/shared_cq.ipp>
#include <rpmapp/impl/shared_event_channel.ipp>
#include <rpmapp/impl/srq.ipp>
