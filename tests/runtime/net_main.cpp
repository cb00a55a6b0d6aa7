// Catch2 entry point for the troupe_net tests.
#define CATCH_CONFIG_MAIN
#include <catch2/catch.hpp>
