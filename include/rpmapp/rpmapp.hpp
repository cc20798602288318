// rpmapp: RDMA connection management in C++20, librpma style. The umbrella header.
#pragma once

#include <rpmapp/config.hpp>
#include <rpmapp/conn.hpp>
#include <rpmapp/conn_req.hpp>
#include <rpmapp/endpoint.hpp>
#include <rpmapp/error.hpp>
#include <rpmapp/expected.hpp>
#include <rpmapp/peer.hpp>
#include <rpmapp/private_data.hpp>
#include <rpmapp/version.hpp>
