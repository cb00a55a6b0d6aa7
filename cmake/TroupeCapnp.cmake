# troupe_capnp(<target> <schema.capnp>...): compiles Cap'n Proto schemas into a static library
# <target>. Schemas may `import "/troupe.capnp"` to extend troupe's Actor interface.
set(TROUPE_PROTO_DIR ${CMAKE_SOURCE_DIR}/runtime/proto)
# Debian's CapnProto CMake package points its tool targets at /usr/lib/bin; find the tools on PATH.
find_program(TROUPE_CAPNP capnp REQUIRED)
find_program(TROUPE_CAPNPC_CXX capnpc-c++ REQUIRED)

function(troupe_capnp target)
  set(outdir ${CMAKE_CURRENT_BINARY_DIR}/capnp)
  file(MAKE_DIRECTORY ${outdir})
  set(sources)
  foreach(schema ${ARGN})
    get_filename_component(abs ${schema} ABSOLUTE)
    get_filename_component(dir ${abs} DIRECTORY)
    get_filename_component(name ${abs} NAME)
    add_custom_command(
      OUTPUT ${outdir}/${name}.c++ ${outdir}/${name}.h
      COMMAND ${TROUPE_CAPNP} compile -I${TROUPE_PROTO_DIR} --src-prefix=${dir}
              -o${TROUPE_CAPNPC_CXX}:${outdir} ${abs}
      DEPENDS ${abs} ${TROUPE_PROTO_DIR}/troupe.capnp
      COMMENT "capnp ${name}")
    list(APPEND sources ${outdir}/${name}.c++)
  endforeach()
  add_library(${target} STATIC ${sources})
  target_include_directories(${target} PUBLIC ${outdir})
  target_link_libraries(${target} PUBLIC CapnProto::capnp-rpc)
  if(NOT target STREQUAL "troupe_proto")
    target_link_libraries(${target} PUBLIC troupe_proto)  # for `import "/troupe.capnp"`
  endif()
  set_target_properties(${target} PROPERTIES POSITION_INDEPENDENT_CODE ON)
endfunction()
