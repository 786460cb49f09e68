# SPDX-License-Identifier: Apache-2.0
# squall_add_compile_fail_test(<name> <source> <regex> [ERRORS n])
#
# A ctest that compiles <source> (syntax only) with the project's C++ compiler and passes if
# the compile fails, the output matches <regex>, and (with ERRORS) the number of "error:" lines
# is exactly n: a wrong policy must give one readable error, not a page of template noise.

function(squall_add_compile_fail_test name source regex)
  cmake_parse_arguments(arg "" "ERRORS" "" ${ARGN})
  add_test(NAME compile_fail.${name}
           COMMAND "${CMAKE_COMMAND}"
                   "-DCOMPILER=${CMAKE_CXX_COMPILER}"
                   "-DINCLUDE_DIR=${PROJECT_SOURCE_DIR}/include"
                   "-DSOURCE=${CMAKE_CURRENT_SOURCE_DIR}/${source}"
                   "-DREGEX=${regex}"
                   "-DERRORS=${arg_ERRORS}"
                   -P "${PROJECT_SOURCE_DIR}/cmake/check_compile_fail.cmake")
  set_tests_properties(compile_fail.${name} PROPERTIES LABELS "unit;compile_fail;static")
endfunction()
