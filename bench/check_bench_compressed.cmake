# SPDX-License-Identifier: Apache-2.0
# Runs squall-bench --compressor on 3 ranks: every compressor it knows on every topology, two
# sizes. Checks its exit code (non-zero when the ranks' results differ in any bit), one CSV row
# per (size, compressor, topology), and each row's rel_error (||result - exact|| / ||exact||
# against the exact sum in double, computed by squall-bench) against a bound that follows from
# the compressor, not from an earlier run:
# - none: float summation, 3 ranks: below 1e-6;
# - cast:bf16: 8 significant bits, rounded once per hop (at most 2 hops of 3 ranks' partial
#   sums, each within 2^-9 relative): below 3 x 2^-9 = 0.0059;
# - int8 (bucket 512, max |g| scale): each rank's error is at most half a step, max|g| / 254,
#   per element; for near-Gaussian inputs max|g| over 512 is under 4.5 sigma, so the error is
#   under sqrt(3) x 4.5 / 254 / sqrt(3) of the sum's norm: below 0.02;
# - topk:1 and randomk:1 (every element sent): the dense sum, below 1e-6;
# - qsgd:4 (bucket 512): QSGD's variance bound, E||Q(g) - g||^2 <= min(n / s^2, sqrt(n) / s)
#   ||g||^2 = 5.66 ||g||^2 per rank and bucket; the ranks' errors are independent and their
#   inputs too, so rel_error^2 is at most 5.66 in expectation: below sqrt(5.66) = 2.38,
#   plus 10% for one draw of 4096 or more elements: 2.6;
# - terngrad (bucket 512, scale m = max |g|): E(q - g)^2 = m |g| - g^2 per element, so
#   rel_error^2 <= m ||g||_1 / ||g||^2 - 1; for near-Gaussian inputs m < 4.5 sigma and
#   ||g||_1 = 0.8 n sigma: below sqrt(3.6 - 1) = 1.6, plus 10%: 1.8;
# - every other row: below 1.5 (they drop or distort most of the signal: topk 1% keeps the
#   1% largest per rank, so rel_error near 1 is their honest value).
cmake_policy(SET CMP0007 NEW)  # keep the CSV's empty fields as list elements
set(csv "${WORK_DIR}/bench_compressed.csv")
file(REMOVE "${csv}")
set(compressors "cast:bf16,cast:fp16,int8,sign,sign_vote,terngrad,qsgd:4,topk:0.01+ef,topk:1,topk_sampled:0.01,randomk:0.01,randomk:1,threshold:1.5,count_sketch,powersgd:2+ef")
execute_process(COMMAND "${BENCH}" -n 3 -b 16K -e 256K -f 16 --iters 2 --warmup 0
                        --compressor ${compressors} --csv "${csv}"
                RESULT_VARIABLE status OUTPUT_VARIABLE out ERROR_VARIABLE err TIMEOUT 600)
message("${out}${err}")
if(NOT status EQUAL 0)
  message(FATAL_ERROR "squall-bench --compressor exited with ${status}")
endif()
file(STRINGS "${csv}" lines)
list(LENGTH lines rows)
# (15 compressors + none) x 6 topologies x 2 sizes, plus the header
if(NOT rows EQUAL 193)
  message(FATAL_ERROR "CSV has ${rows} lines, want 193")
endif()
list(REMOVE_AT lines 0)
foreach(line IN LISTS lines)
  string(REPLACE "," ";" fields "${line}")
  list(GET fields 3 compressor)
  list(GET fields 11 wrong)
  list(GET fields 15 wire)
  list(GET fields 17 error)
  if(NOT wrong EQUAL 0)
    message(FATAL_ERROR "ranks differ: ${line}")
  endif()
  if(wire STREQUAL "" OR wire LESS_EQUAL 0)
    message(FATAL_ERROR "no wire bytes: ${line}")
  endif()
  if(compressor STREQUAL "none" OR compressor STREQUAL "topk:1" OR compressor STREQUAL "randomk:1")
    set(bound 0.000001)
  elseif(compressor STREQUAL "cast:bf16")
    set(bound 0.0059)
  elseif(compressor STREQUAL "int8")
    set(bound 0.02)
  elseif(compressor STREQUAL "qsgd:4")
    set(bound 2.6)
  elseif(compressor STREQUAL "terngrad")
    set(bound 1.8)
  else()
    set(bound 1.5)
  endif()
  # CMake compares decimals, not exponents: turn "3.5e-08" into "0.000000035" first
  if(error MATCHES "^([0-9])\\.?([0-9]*)e-0*([0-9]+)$")
    set(digits "${CMAKE_MATCH_1}${CMAKE_MATCH_2}")
    math(EXPR zeros "${CMAKE_MATCH_3} - 1")
    string(REPEAT "0" ${zeros} padding)
    set(error "0.${padding}${digits}")
  elseif(NOT error MATCHES "^[0-9.]+$")
    message(FATAL_ERROR "rel_error '${error}' is not a number: ${line}")
  endif()
  if(error GREATER bound)
    message(FATAL_ERROR "rel_error ${error} above ${bound} for ${compressor}: ${line}")
  endif()
endforeach()
