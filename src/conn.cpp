// librpmapp, compiled mode: ConnReq, Conn, their rdma_cm events (also on a SharedEventChannel), Cq, SharedCq and Srq.
// (Why one source per group: meson.build.)
#include <rpmapp/impl/conn.ipp>
#include <rpmapp/impl/conn_id.ipp>
#include <rpmapp/impl/conn_req.ipp>
#include <rpmapp/impl/cq.ipp>
#include <rpmapp/impl/detail_cm_event.ipp>
#include <rpmapp/impl/detail_completion_routes.ipp>
#include <rpmapp/impl/detail_connection.ipp>
#include <rpmapp/impl/detail_event_routes.ipp>
#include <rpmapp/impl/shared_cq.ipp>
#include <rpmapp/impl/shared_event_channel.ipp>
#include <rpmapp/impl/srq.ipp>
