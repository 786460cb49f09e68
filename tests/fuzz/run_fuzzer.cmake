# SPDX-License-Identifier: Apache-2.0
# Run as a ctest (label fuzz): builds one libFuzzer target of fuzz/ with clang++ and runs it
# for SECONDS seconds on a seed corpus it writes itself (valid payloads, from the target's
# LLVMFuzzerInitialize). Fails if the fuzzer reports a crash, a sanitizer error, a leak, a
# timeout or an out-of-memory; the reproducing inputs stay in WORK_DIR and are named below.
# Variables: CLANG (clang++), SOURCE (fuzz/<family>.fuzz.cpp), INCLUDE_DIR (squall's include/),
# EXTRA_INCLUDE_DIR (Random123's, may be empty), WORK_DIR, SECONDS.
cmake_minimum_required(VERSION 3.25)
foreach(var IN ITEMS CLANG SOURCE INCLUDE_DIR WORK_DIR SECONDS)
  if(NOT DEFINED ${var} OR "${${var}}" STREQUAL "")
    message(FATAL_ERROR "run_fuzzer.cmake needs -D${var}=...")
  endif()
endforeach()
get_filename_component(family "${SOURCE}" NAME_WE)  # cast.fuzz.cpp -> cast
set(binary "${WORK_DIR}/${family}_fuzzer")
set(corpus "${WORK_DIR}/corpus")
file(MAKE_DIRECTORY "${WORK_DIR}" "${corpus}")

set(includes "-I${INCLUDE_DIR}")
# Random123's directory, unless it is a system one (naming /usr/include breaks #include_next).
if(EXTRA_INCLUDE_DIR AND NOT EXTRA_INCLUDE_DIR MATCHES "^/usr(/local)?/include/?$")
  list(APPEND includes "-isystem" "${EXTRA_INCLUDE_DIR}")
endif()
execute_process(
  COMMAND "${CLANG}" -std=c++20 -O1 -gline-tables-only -fno-omit-frame-pointer
          -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=all
          ${includes} "${SOURCE}" -o "${binary}"
  RESULT_VARIABLE result OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(NOT result EQUAL 0)
  message(FATAL_ERROR "${family}: clang++ failed:\n${out}${err}")
endif()

# Artifacts from earlier runs are kept; only the new ones are reported.
file(GLOB before "${WORK_DIR}/crash-*" "${WORK_DIR}/leak-*" "${WORK_DIR}/timeout-*"
     "${WORK_DIR}/oom-*" "${WORK_DIR}/slow-unit-*")
set(ENV{SQUALL_FUZZ_SEED_DIR} "${corpus}")
execute_process(
  COMMAND "${binary}" "-max_total_time=${SECONDS}" -rss_limit_mb=2048 -timeout=10
          -print_final_stats=1 "-artifact_prefix=${WORK_DIR}/" "${corpus}"
  WORKING_DIRECTORY "${WORK_DIR}"
  RESULT_VARIABLE result OUTPUT_VARIABLE out ERROR_VARIABLE err)
file(WRITE "${WORK_DIR}/last-run.log" "${out}${err}")
file(GLOB after "${WORK_DIR}/crash-*" "${WORK_DIR}/leak-*" "${WORK_DIR}/timeout-*"
     "${WORK_DIR}/oom-*" "${WORK_DIR}/slow-unit-*")
set(found ${after})
if(before)
  list(REMOVE_ITEM found ${before})
endif()

# The fuzzer's summary: the last coverage line and its final stats.
string(REGEX MATCHALL "#[0-9]+[^\n]*(INITED|DONE)[^\n]*" progress "${err}")
string(REGEX MATCHALL "stat::[a-z_]+:[^\n]*" stats "${err}")
foreach(line IN LISTS progress stats)
  message(STATUS "${family}: ${line}")
endforeach()
if(NOT result EQUAL 0 OR found)
  string(LENGTH "${err}" length)
  set(tail "${err}")
  if(length GREATER 12000)
    math(EXPR start "${length} - 12000")
    string(SUBSTRING "${err}" ${start} -1 tail)
  endif()
  list(JOIN found "\n  " names)
  message(FATAL_ERROR
          "${family}: the fuzzer failed (exit ${result}); reproduce with\n"
          "  ${binary} <input>\ninputs:\n  ${names}\nlog: ${WORK_DIR}/last-run.log\n${tail}")
endif()
