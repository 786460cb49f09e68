# SPDX-License-Identifier: Apache-2.0
# Run as a ctest: g++ -O3 must report the reduce_into loop of kernels/host/reduce.hpp as
# vectorized for every (type, op) below, on the portable x86-64 baseline (no -march),
# the 16-bit types included (their conversions are branch-free for this reason).
# int64 min/max is absent on purpose: SSE2 has no 64-bit compare (pcmpgtq is SSE4.2), so that
# loop is scalar on the baseline; docs/design.md records it.
cmake_minimum_required(VERSION 3.25)
file(STRINGS "${INCLUDE_DIR}/squall/kernels/host/reduce.hpp" lines)
# The loop that does the work: reduce_into_loop for 32/64-bit types; for the 16-bit types,
# which go through float blocks, combine_floats.
set(number 0)
set(loop_line "")
set(float_line "")
foreach(line IN LISTS lines)
  math(EXPR number "${number} + 1")
  if(line MATCHES "dst\\[i\\] = combine<T>\\(op, dst\\[i\\], src\\[i\\]\\)")
    set(loop_line ${number})
  elseif(line MATCHES "a\\[i\\] = op\\(a\\[i\\], b\\[i\\]\\)")
    set(float_line ${number})
  endif()
endforeach()
if(NOT loop_line OR NOT float_line)
  message(FATAL_ERROR "the reduce loops were not found in reduce.hpp")
endif()
set(failed "")
foreach(type IN ITEMS float double std::int32_t std::int64_t squall::float16 squall::bfloat16)
  foreach(op IN ITEMS sum_op min_op max_op)
    if(type STREQUAL "std::int64_t" AND NOT op STREQUAL "sum_op")
      continue()
    endif()
    execute_process(COMMAND "${COMPILER}" -std=c++20 -O3 -fopt-info-vec-optimized
                            "-DSQUALL_PROBE_TYPE=${type}" "-DSQUALL_PROBE_OP=${op}"
                            "-I${INCLUDE_DIR}" -c "${SOURCE}" -o /dev/null
                    RESULT_VARIABLE result OUTPUT_VARIABLE out ERROR_VARIABLE err)
    if(NOT result EQUAL 0)
      message(FATAL_ERROR "probe for ${type} ${op} did not compile:\n${err}")
    endif()
    set(line ${loop_line})
    if(type MATCHES "float16")
      set(line ${float_line})
    endif()
    if("${out}${err}" MATCHES "reduce.hpp:${line}:[0-9]+: optimized: loop vectorized")
      message(STATUS "vectorized: reduce_into<${type}, ${op}>")
    else()
      list(APPEND failed "${type}/${op}")
    endif()
  endforeach()
endforeach()
if(failed)
  message(FATAL_ERROR "not vectorized: ${failed}")
endif()
