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
#  if defined(RPMAPP_USE_STD_EXPECTED)
#    define RPMAPP_ABI_NAMESPACE v0_std_lib
#  else
#    define RPMAPP_ABI_NAMESPACE v0_tl_lib
#  endif
#else
#  define RPMAPP_DECL inline
#  if defined(RPMAPP_USE_STD_EXPECTED)
#    define RPMAPP_ABI_NAMESPACE v0_std
#  else
#    define RPMAPP_ABI_NAMESPACE v0_tl
#  endif
#endif

#define RPMAPP_BEGIN_NAMESPACE namespace rpmapp { inline namespace RPMAPP_ABI_NAMESPACE {
#define RPMAPP_END_NAMESPACE } }
