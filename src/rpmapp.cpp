// librpmapp: rpmapp's compiled mode (meson -Dlibrary=...), built with
// RPMAPP_SEPARATE_COMPILATION defined like every program that links it.
#include <rpmapp/impl/src.hpp>
