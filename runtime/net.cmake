# troupe_net: transport helpers under Cap'n Proto RPC (the coalescing stream, TCP_NODELAY, the
# message stream whose large buffers troupe::Received keeps).
# Included by runtime/CMakeLists.txt.
add_library(troupe_net STATIC ${CMAKE_CURRENT_LIST_DIR}/src/coalescing_stream.cpp
  ${CMAKE_CURRENT_LIST_DIR}/src/message_stream.cpp)
target_include_directories(troupe_net PUBLIC $<BUILD_INTERFACE:${CMAKE_CURRENT_LIST_DIR}/src>
  $<BUILD_INTERFACE:${CMAKE_CURRENT_LIST_DIR}/include>)
target_link_libraries(troupe_net PUBLIC CapnProto::kj-async CapnProto::capnp)
# Installed only as what troupe_runtime links (troupe::Received lives in it); its header stays
# private.
set_target_properties(troupe_net PROPERTIES POSITION_INDEPENDENT_CODE ON EXPORT_NAME net)
