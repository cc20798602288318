// librpmapp, compiled mode: errors, their messages and the log hook.
// (Why one source per group: meson.build.)
#include <rpmapp/impl/error.ipp>
#include <rpmapp/impl/detail_errors.ipp>
#include <rpmapp/impl/detail_format.ipp>
#include <rpmapp/impl/log.ipp>
