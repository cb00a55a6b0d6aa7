# troupe_capnp(<target> [FILES] <schema.capnp>...): compiles Cap'n Proto schemas into a static
# library <target> whose headers (<schema>.capnp.h) are on its include path. Schemas may
# `import "/troupe.capnp"` to extend troupe's Actor interface: troupe.capnp is on the import path
# and <target> links troupe::proto, the generated troupe.capnp.h.
#
# Used in troupe's own tree (included by the top-level CMakeLists.txt) and by apps built against
# an installed troupe (included by troupeConfig.cmake): the folder holding troupe.capnp is the
# TROUPE_PROTO_DIR property of troupe::proto in both, so the function works in any folder.

# Debian's CapnProto CMake package points its tool targets at /usr/lib/bin; find the tools on PATH.
find_program(TROUPE_CAPNP capnp REQUIRED)
find_program(TROUPE_CAPNPC_CXX capnpc-c++ REQUIRED)

function(troupe_capnp target)
  set(schemas ${ARGN})
  list(REMOVE_ITEM schemas FILES)
  if(NOT schemas)
    message(FATAL_ERROR "troupe_capnp(${target}): no schema given; "
                        "usage: troupe_capnp(<target> FILES <schema.capnp>...)")
  endif()
  if(target STREQUAL "troupe_proto")
    set(protoDir ${CMAKE_CURRENT_SOURCE_DIR}/proto)  # troupe.capnp itself, in runtime/
  else()
    get_target_property(protoDir troupe::proto TROUPE_PROTO_DIR)
  endif()
  set(outdir ${CMAKE_CURRENT_BINARY_DIR}/capnp)
  file(MAKE_DIRECTORY ${outdir})
  set(sources)
  foreach(schema ${schemas})
    get_filename_component(abs ${schema} ABSOLUTE)
    get_filename_component(dir ${abs} DIRECTORY)
    get_filename_component(name ${abs} NAME)
    add_custom_command(
      OUTPUT ${outdir}/${name}.c++ ${outdir}/${name}.h
      COMMAND ${TROUPE_CAPNP} compile -I${protoDir} --src-prefix=${dir}
              -o${TROUPE_CAPNPC_CXX}:${outdir} ${abs}
      DEPENDS ${abs} ${protoDir}/troupe.capnp
      COMMENT "capnp ${name}")
    list(APPEND sources ${outdir}/${name}.c++)
  endforeach()
  add_library(${target} STATIC ${sources})
  target_include_directories(${target} PUBLIC $<BUILD_INTERFACE:${outdir}>)
  target_link_libraries(${target} PUBLIC CapnProto::capnp-rpc)
  if(NOT target STREQUAL "troupe_proto")
    target_link_libraries(${target} PUBLIC troupe::proto)  # for `import "/troupe.capnp"`
  endif()
  set_target_properties(${target} PROPERTIES POSITION_INDEPENDENT_CODE ON)
endfunction()
