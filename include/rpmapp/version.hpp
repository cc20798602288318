// rpmapp: version and the versioned inline namespace.
#pragma once

#define RPMAPP_VERSION_MAJOR 0
#define RPMAPP_VERSION_MINOR 1
#define RPMAPP_VERSION_PATCH 0
#define RPMAPP_VERSION_STRING "0.1.0"

// The expected back end (std or tl) is part of the ABI namespace, so that two translation
// units that chose differently fail to link instead of silently violating the ODR.
#include <version>
#if !defined(RPMAPP_USE_TL_EXPECTED) && !defined(RPMAPP_USE_STD_EXPECTED)
#  if defined(__cpp_lib_expected) && __cpp_lib_expected >= 202202L
#    define RPMAPP_USE_STD_EXPECTED 1
#  else
#    define RPMAPP_USE_TL_EXPECTED 1
#  endif
#endif

// Compiled mode (RPMAPP_SEPARATE_COMPILATION): the definitions under rpmapp/impl/ are
// compiled once, into librpmapp or by one source of the program that includes
// <rpmapp/impl/src.hpp>, instead of inline in every includer. The mode is part of the ABI
// namespace too: a header-only translation unit and a compiled-mode one that pass rpmapp
// types to each other fail to link.
#if defined(RPMAPP_SEPARATE_COMPILATION)
#  define RPMAPP_DECL
#  define RPMAPP_DETAIL_ABI_MODE _lib
#else
#  define RPMAPP_DECL inline
#  define RPMAPP_DETAIL_ABI_MODE
#endif
#if defined(RPMAPP_USE_STD_EXPECTED)
#  define RPMAPP_DETAIL_ABI_BACKEND std
#else
#  define RPMAPP_DETAIL_ABI_BACKEND tl
#endif

// The ABI version is part of the namespace as well: major.minor while the major is 0, as in
// librpmapp's soname (patch releases keep the ABI). Two rpmapp versions in one program fail
// to link. The namespace is v<major>_<minor>_<back end>[_lib], e.g. rpmapp::v0_1_tl.
#define RPMAPP_DETAIL_ABI_PASTE(major, minor, backend, mode) v##major##_##minor##_##backend##mode
#define RPMAPP_DETAIL_ABI_NAME(major, minor, backend, mode) \
  RPMAPP_DETAIL_ABI_PASTE(major, minor, backend, mode)
#define RPMAPP_ABI_NAMESPACE                                                         \
  RPMAPP_DETAIL_ABI_NAME(RPMAPP_VERSION_MAJOR, RPMAPP_VERSION_MINOR, RPMAPP_DETAIL_ABI_BACKEND, \
                         RPMAPP_DETAIL_ABI_MODE)

#define RPMAPP_BEGIN_NAMESPACE namespace rpmapp { inline namespace RPMAPP_ABI_NAMESPACE {
#define RPMAPP_END_NAMESPACE } }
