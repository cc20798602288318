// The one Catch2 v2 main shared by the unit and integration test executables.
#define CATCH_CONFIG_MAIN
#include <catch2/catch.hpp>
