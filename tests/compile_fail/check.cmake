# Runs one compile-failure case (CMakeLists.txt here): the snippet written right must build, the
# snippet as written must not, and the compiler's first error must match FIRST_ERROR.
execute_process(COMMAND ${CMAKE_COMMAND} --build ${BUILD_DIR} --target compile_right_${NAME}
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "compile_right_${NAME} (the snippet written right) did not build:\n${out}")
endif()
execute_process(COMMAND ${CMAKE_COMMAND} --build ${BUILD_DIR} --target compile_fail_${NAME}
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
if(rc EQUAL 0)
  message(FATAL_ERROR "compile_fail_${NAME} built: the mistake it holds was not refused")
endif()
string(REGEX MATCH "[^\n]*error:[^\n]*" first "${out}")
if(NOT first)
  message(FATAL_ERROR "compile_fail_${NAME} failed without a compiler error:\n${out}")
endif()
if(NOT first MATCHES "${FIRST_ERROR}")
  message(FATAL_ERROR "compile_fail_${NAME}: the first error is not troupe's\n"
                      "  expected: ${FIRST_ERROR}\n  first error: ${first}\n\n${out}")
endif()
message(STATUS "compile_fail_${NAME}: refused, first error: ${first}")
