# Tests of troupe_net (runtime/net.cmake). Included by tests/runtime/CMakeLists.txt.
troupe_capnp(troupe_net_test_capnp ${CMAKE_CURRENT_LIST_DIR}/echo_test.capnp)
add_executable(coalescing_stream_test ${CMAKE_CURRENT_LIST_DIR}/coalescing_stream_test.cpp
  ${CMAKE_CURRENT_LIST_DIR}/message_stream_test.cpp ${CMAKE_CURRENT_LIST_DIR}/tls_stream_test.cpp
  ${CMAKE_CURRENT_LIST_DIR}/lending_test.cpp)
# The transport's private headers, which these tests test (runtime/net.cmake).
target_include_directories(coalescing_stream_test PRIVATE ${PROJECT_SOURCE_DIR}/runtime/src/net)
target_link_libraries(coalescing_stream_test PRIVATE troupe_net troupe_net_test_capnp troupe_catch_main
                      Catch2::Catch2)
catch_discover_tests(coalescing_stream_test TEST_PREFIX "net:" EXTRA_ARGS -w NoTests)
