# troupe_capnp(<target> <schema.capnp>...): compiles Cap'n Proto schemas into a static library
# <target>. Schemas may `import "/troupe.capnp"` to extend troupe's Actor interface.
set(TROUPE_PROTO_DIR ${CMAKE_SOURCE_DIR}/runtime/proto)

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
      COMMAND CapnProto::capnp_tool compile -I${TROUPE_PROTO_DIR} --src-prefix=${dir}
              -o$<TARGET_FILE:CapnProto::capnpc_cpp>:${outdir} ${abs}
      DEPENDS ${abs} ${TROUPE_PROTO_DIR}/troupe.capnp
      COMMENT "capnp ${name}")
    list(APPEND sources ${outdir}/${name}.c++)
  endforeach()
  add_library(${target} STATIC ${sources})
  target_include_directories(${target} PUBLIC ${outdir})
  target_link_libraries(${target} PUBLIC CapnProto::capnp-rpc)
  set_target_properties(${target} PROPERTIES POSITION_INDEPENDENT_CODE ON)
endfunction()
