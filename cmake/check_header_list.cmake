# SPDX-License-Identifier: Apache-2.0
# Run as a ctest: fails if a header under INCLUDE_DIR is missing from LISTED (the explicit
# header list in tests/CMakeLists.txt), or LISTED names a header that does not exist. Globbing
# here, at test time, is how the explicit list is kept honest; sources are never globbed.
cmake_minimum_required(VERSION 3.25)
file(GLOB_RECURSE found RELATIVE "${INCLUDE_DIR}" "${INCLUDE_DIR}/*.hpp" "${INCLUDE_DIR}/*.cuh")
set(missing "")
foreach(header IN LISTS found)
  if(NOT header IN_LIST LISTED)
    list(APPEND missing "${header}")
  endif()
endforeach()
set(stale "")
foreach(header IN LISTS LISTED)
  if(NOT header IN_LIST found)
    list(APPEND stale "${header}")
  endif()
endforeach()
list(LENGTH found count)
if(missing OR stale)
  message(FATAL_ERROR "header list out of date: not listed: [${missing}]; listed but absent: [${stale}]")
endif()
message(STATUS "all ${count} headers are listed for the header tests")
