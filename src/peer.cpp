// librpmapp, compiled mode: Peer, its device and addresses, memory registration and grants.
// (Why one source per group: meson.build.)
#include <rpmapp/impl/common_data.ipp>
#include <rpmapp/impl/detail_address.ipp>
#include <rpmapp/impl/detail_device_context.ipp>
#include <rpmapp/impl/detail_grants.ipp>
#include <rpmapp/impl/detail_handles.ipp>
#include <rpmapp/impl/grant.ipp>
#include <rpmapp/impl/mr.ipp>
#include <rpmapp/impl/peer.ipp>
#include <rpmapp/impl/peer_config.ipp>
