# `cmake --install <build> --prefix P`: what an app outside troupe's tree builds and runs against.
#
#   P/include/troupe/*.h, troupe/sched/*.h   the public headers (and nothing private)
#   P/include/troupe.capnp, troupe.capnp.h   troupe's schema, for `import "/troupe.capnp"`
#   P/lib/libtroupe_*.a                      the runtime and what it links
#   P/bin/troupe                             `troupe sim`, `troupe env`
#   P/lib/cmake/troupe/                      find_package(troupe): troupe::runtime, troupe_capnp(),
#                                            troupe::dataset and troupe::images (the data plane:
#                                            troupe/dataset/*.h, troupe/images/*.h)
#
# Included by the top-level CMakeLists.txt when TROUPE_INSTALL is on (the default at top level).
include(CMakePackageConfigHelpers)
set(TROUPE_CMAKE_DIR ${CMAKE_INSTALL_LIBDIR}/cmake/troupe)

install(DIRECTORY ${PROJECT_SOURCE_DIR}/runtime/include/troupe
        DESTINATION ${CMAKE_INSTALL_INCLUDEDIR} FILES_MATCHING PATTERN "*.h")
install(DIRECTORY ${PROJECT_SOURCE_DIR}/scheduler/include/troupe
        DESTINATION ${CMAKE_INSTALL_INCLUDEDIR} FILES_MATCHING PATTERN "*.h")
# The data plane, where the build has it (actors/ comes with the apps or the tests).
set(_troupe_data_plane)
if(TARGET troupe_dataset AND TARGET troupe_images)
  set(_troupe_data_plane troupe_dataset troupe_images)
  install(DIRECTORY ${PROJECT_SOURCE_DIR}/actors/dataset/include/troupe
                    ${PROJECT_SOURCE_DIR}/actors/images/include/troupe
          DESTINATION ${CMAKE_INSTALL_INCLUDEDIR} FILES_MATCHING PATTERN "*.h")
endif()
install(FILES ${PROJECT_SOURCE_DIR}/runtime/proto/troupe.capnp
              ${PROJECT_BINARY_DIR}/runtime/capnp/troupe.capnp.h
        DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})

install(TARGETS troupe_runtime troupe_proto troupe_scheduler troupe_net troupe
                ${_troupe_data_plane}
        EXPORT troupeTargets
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
        LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
        RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
install(EXPORT troupeTargets NAMESPACE troupe:: DESTINATION ${TROUPE_CMAKE_DIR})

configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/troupeConfig.cmake.in
                              ${PROJECT_BINARY_DIR}/troupeConfig.cmake
                              INSTALL_DESTINATION ${TROUPE_CMAKE_DIR})
# 0.x: a minor version may break the API, so only the same minor version is compatible.
write_basic_package_version_file(${PROJECT_BINARY_DIR}/troupeConfigVersion.cmake
                                 COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/troupeConfig.cmake
              ${PROJECT_BINARY_DIR}/troupeConfigVersion.cmake
              ${PROJECT_SOURCE_DIR}/cmake/TroupeCapnp.cmake
        DESTINATION ${TROUPE_CMAKE_DIR})
