// librpmapp, compiled mode: Endpoint and its shared listeners.
// (Why one source per group: meson.build.)
#include <rpmapp/impl/detail_listener.ipp>
#include <rpmapp/impl/endpoint.ipp>
