// The one Catch2 main shared by the unit and integration test executables (v2 or v3).
#if RPMAPP_CATCH2_MAJOR >= 3
#include <catch2/catch_session.hpp>

int main(int argc, char* argv[]) { return Catch::Session().run(argc, argv); }
#else
#define CATCH_CONFIG_MAIN
#include "catch2_compat.hpp"
#endif
