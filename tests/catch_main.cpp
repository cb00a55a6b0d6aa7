// The one Catch2 main of every test binary (target troupe_catch_main): the slowest translation unit
// in the tree, so it is compiled once.
#define CATCH_CONFIG_MAIN
#include <catch2/catch.hpp>
