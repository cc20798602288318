// librpmapp, compiled mode: EventLoop, its handlers and awaiters.
// (Why one source per group: meson.build.)
#include <rpmapp/impl/detail_background_connect.ipp>
#include <rpmapp/impl/detail_handler_waiters.ipp>
#include <rpmapp/impl/detail_loop_awaiters.ipp>
#include <rpmapp/impl/detail_loop_core.ipp>
#include <rpmapp/impl/event_loop.ipp>
