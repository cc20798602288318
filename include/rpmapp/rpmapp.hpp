// rpmapp: RDMA connection management in C++20, librpma style. The umbrella header.
#pragma once

#include <rpmapp/common_data.hpp>
#include <rpmapp/config.hpp>
#include <rpmapp/conn.hpp>
#include <rpmapp/conn_id.hpp>
#include <rpmapp/conn_req.hpp>
#include <rpmapp/cq.hpp>
#include <rpmapp/endpoint.hpp>
#include <rpmapp/error.hpp>
#include <rpmapp/event_loop.hpp>
#include <rpmapp/expected.hpp>
#include <rpmapp/grant.hpp>
#include <rpmapp/log.hpp>
#include <rpmapp/mr.hpp>
#include <rpmapp/mr_usage.hpp>
#include <rpmapp/op_flags.hpp>
#include <rpmapp/peer.hpp>
#include <rpmapp/peer_config.hpp>
#include <rpmapp/private_data.hpp>
#include <rpmapp/shared_cq.hpp>
#include <rpmapp/shared_event_channel.hpp>
#include <rpmapp/srq.hpp>
#include <rpmapp/task.hpp>
#include <rpmapp/version.hpp>
