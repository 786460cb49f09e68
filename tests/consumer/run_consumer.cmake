# SPDX-License-Identifier: Apache-2.0
# Run as a ctest: builds tests/consumer/project against squall in MODE and runs it.
#   find_package:      cmake --install the build tree to a prefix, then find_package(squall),
#                      built at -O3 (Release) with warnings as errors
#   add_subdirectory:  the source tree added as a subdirectory (tests and benches off by default)
#   fetchcontent:      FetchContent with a local SOURCE_DIR
cmake_minimum_required(VERSION 3.25)
file(REMOVE_RECURSE "${WORK_DIR}")
set(args "-DSQUALL_CONSUMER_MODE=${MODE}" "-DSQUALL_SOURCE_DIR=${SQUALL_SOURCE_DIR}"
         "-DCMAKE_CXX_COMPILER=${CXX_COMPILER}")
if(MODE STREQUAL "find_package")
  execute_process(COMMAND "${CMAKE_COMMAND}" --install "${SQUALL_BUILD_DIR}" --prefix "${WORK_DIR}/prefix"
                  RESULT_VARIABLE result OUTPUT_QUIET)
  if(NOT result EQUAL 0)
    message(FATAL_ERROR "cmake --install failed")
  endif()
  # A user's optimised build of the installed package: -O3, warnings as errors, squall's
  # headers not treated as system headers (their warnings would be hidden otherwise).
  list(APPEND args "-DCMAKE_PREFIX_PATH=${WORK_DIR}/prefix" -DCMAKE_BUILD_TYPE=Release
       "-DCMAKE_CXX_FLAGS=-Wall -Wextra -Wpedantic" -DCMAKE_COMPILE_WARNING_AS_ERROR=ON
       -DCMAKE_NO_SYSTEM_FROM_IMPORTED=ON)
else()
  list(APPEND args "-DSQUALL_WITH_CUDA=OFF")
endif()
function(run step)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE result OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT result EQUAL 0)
    message(FATAL_ERROR "${step} failed:\n${out}\n${err}")
  endif()
  message(STATUS "${step}: ok")
  set(last_output "${out}" PARENT_SCOPE)
endfunction()
run(configure "${CMAKE_COMMAND}" -S "${SQUALL_SOURCE_DIR}/tests/consumer/project" -B "${WORK_DIR}/build"
    -G "${GENERATOR}" ${args})
run(build "${CMAKE_COMMAND}" --build "${WORK_DIR}/build")
run(run "${WORK_DIR}/build/consumer")
message(STATUS "${last_output}")
