// The one Catch2 main for the scheduler tests.
#define CATCH_CONFIG_MAIN
#include <catch2/catch.hpp>
