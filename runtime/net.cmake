# troupe_net (src/net): the transport under Cap'n Proto RPC. TLS 1.3 on OpenSSL (secure.h), the
# coalescing stream (TCP_NODELAY, one write per event-loop turn), the message stream whose large
# buffers troupe::Received keeps, and the lending network that holds what troupe::SendBuffer lends
# until it is written; troupe/transport.h is the face of the TLS and the coalescing stream that the
# RPC and stream benches measure (transport.cpp). Included by runtime/CMakeLists.txt.
add_library(troupe_net STATIC ${CMAKE_CURRENT_LIST_DIR}/src/net/coalescing_stream.cpp
  ${CMAKE_CURRENT_LIST_DIR}/src/net/message_stream.cpp ${CMAKE_CURRENT_LIST_DIR}/src/net/secure.cpp
  ${CMAKE_CURRENT_LIST_DIR}/src/net/tls_records.cpp ${CMAKE_CURRENT_LIST_DIR}/src/net/tls_stream.cpp
  ${CMAKE_CURRENT_LIST_DIR}/src/net/crypto_threads.cpp ${CMAKE_CURRENT_LIST_DIR}/src/net/lending.cpp
  ${CMAKE_CURRENT_LIST_DIR}/src/net/transport.cpp)
# Each of the three TLS files has its own check() and fail() (unity builds, CMakeLists.txt).
set_source_files_properties(${CMAKE_CURRENT_LIST_DIR}/src/net/tls_records.cpp
  ${CMAKE_CURRENT_LIST_DIR}/src/net/tls_stream.cpp PROPERTIES SKIP_UNITY_BUILD_INCLUSION ON)
# Its own folder is private: the runtime's parts reach it as a FOLDER (runtime/CMakeLists.txt), its
# tests name it themselves (tests/runtime/net.cmake), and the benches include troupe/transport.h.
target_include_directories(troupe_net PUBLIC $<BUILD_INTERFACE:${CMAKE_CURRENT_LIST_DIR}/include>
  PRIVATE ${CMAKE_CURRENT_LIST_DIR}/src/net)
target_link_libraries(troupe_net PUBLIC CapnProto::kj-async CapnProto::capnp CapnProto::capnp-rpc
  PRIVATE OpenSSL::SSL OpenSSL::Crypto)
# Installed only as what troupe_runtime links (troupe::Received, SendBuffer and troupe/transport.h
# live in it); its headers stay private.
set_target_properties(troupe_net PROPERTIES POSITION_INDEPENDENT_CODE ON EXPORT_NAME net)
