# troupe_headers_compile_alone(TARGET DIR PREFIX LIBRARY): every public header compiles on its own
# (STYLE.md): one generated translation unit per DIR/*.h that includes "PREFIX/<name>.h" and
# nothing else, built with `all` as an OBJECT library linked to LIBRARY for its include paths.
function(troupe_headers_compile_alone target dir prefix library)
  file(GLOB headers CONFIGURE_DEPENDS ${dir}/*.h)
  set(units)
  foreach(header ${headers})
    get_filename_component(name ${header} NAME_WE)
    set(unit ${CMAKE_CURRENT_BINARY_DIR}/${target}_${name}.cpp)
    file(CONFIGURE OUTPUT ${unit} CONTENT "#include \"${prefix}/${name}.h\"\n")
    list(APPEND units ${unit})
  endforeach()
  add_library(${target} OBJECT ${units})
  target_link_libraries(${target} PRIVATE ${library})
endfunction()
