# SPDX-License-Identifier: Apache-2.0
# squall_add_header_tests(CXX_HEADERS h... [CUDA_HEADERS h...] [MPI_HEADERS h...])
#
# Every header must compile on its own: one generated translation unit per header, built as an
# object library (the CUB header-test idea). .hpp headers are compiled by the C++ compiler;
# .cuh headers by nvcc; MPI_HEADERS (they include <mpi.h>) by the C++ compiler against
# squall::mpi, where MPI is found. Where CUDA is enabled nvcc also compiles, one TU each, the
# .hpp headers with a CUDA branch of their own (__CUDACC__ or __CUDA_ARCH__) and the umbrella
# squall/squall.hpp, which includes every other .hpp but mpi.hpp: that is every .hpp under
# nvcc, and each alone under g++, without 50 more nvcc runs of about 5 s each (they were a
# quarter of the build's CPU time). A ctest checks that the list names every header under
# include/, so a new header cannot dodge the test.

function(squall_add_header_tests)
  cmake_parse_arguments(arg "" "" "CXX_HEADERS;CUDA_HEADERS;MPI_HEADERS" ${ARGN})
  set(cxx_sources "")
  set(cuda_sources "")
  foreach(header IN LISTS arg_CXX_HEADERS arg_CUDA_HEADERS)
    string(MAKE_C_IDENTIFIER "${header}" id)
    set(content "// generated: ${header} compiles on its own\n#include <${header}>\n")
    if(header IN_LIST arg_CXX_HEADERS)
      file(CONFIGURE OUTPUT "${CMAKE_CURRENT_BINARY_DIR}/headers/${id}.cpp" CONTENT "${content}")
      list(APPEND cxx_sources "${CMAKE_CURRENT_BINARY_DIR}/headers/${id}.cpp")
    endif()
    set(for_nvcc OFF)
    if(SQUALL_HAS_CUDA)
      if(header IN_LIST arg_CUDA_HEADERS OR header STREQUAL "squall/squall.hpp")
        set(for_nvcc ON)
      else()
        file(STRINGS "${PROJECT_SOURCE_DIR}/include/${header}" cuda_branch
             REGEX "__CUDACC__|__CUDA_ARCH__" LIMIT_COUNT 1)
        if(cuda_branch)
          set(for_nvcc ON)
        endif()
      endif()
    endif()
    if(for_nvcc)
      file(CONFIGURE OUTPUT "${CMAKE_CURRENT_BINARY_DIR}/headers/${id}.cu" CONTENT "${content}")
      list(APPEND cuda_sources "${CMAKE_CURRENT_BINARY_DIR}/headers/${id}.cu")
    endif()
  endforeach()
  set(mpi_sources "")
  foreach(header IN LISTS arg_MPI_HEADERS)
    string(MAKE_C_IDENTIFIER "${header}" id)
    file(CONFIGURE OUTPUT "${CMAKE_CURRENT_BINARY_DIR}/headers/${id}.cpp"
         CONTENT "// generated: ${header} compiles on its own\n#include <${header}>\n")
    list(APPEND mpi_sources "${CMAKE_CURRENT_BINARY_DIR}/headers/${id}.cpp")
  endforeach()
  if(SQUALL_HAS_MPI AND mpi_sources)
    add_library(squall_header_tests_mpi OBJECT ${mpi_sources})
    target_link_libraries(squall_header_tests_mpi PRIVATE squall::mpi)
    target_compile_options(squall_header_tests_mpi PRIVATE -O0 -g0)
  endif()
  add_library(squall_header_tests_cxx OBJECT ${cxx_sources})
  target_link_libraries(squall_header_tests_cxx PRIVATE squall::squall)
  # They check that a header compiles, not what it generates: no optimiser, no debug info.
  target_compile_options(squall_header_tests_cxx PRIVATE -O0 -g0)
  if(SQUALL_HAS_CUDA)
    add_library(squall_header_tests_cuda OBJECT ${cuda_sources})
    target_link_libraries(squall_header_tests_cuda PRIVATE squall::cuda)
    # One architecture is enough to check that a header parses and instantiates under nvcc.
    set_target_properties(squall_header_tests_cuda PROPERTIES CUDA_ARCHITECTURES 90)
    # No debug info; the host compiler's -O0 comes from tests/CMakeLists.txt, which takes nvcc's
    # -O out of its directory's CUDA flags (an -Xcompiler=-O0 here would be overridden).
    target_compile_options(squall_header_tests_cuda PRIVATE -Xcompiler=-g0)
  endif()
  set(listed ${arg_CXX_HEADERS} ${arg_CUDA_HEADERS} ${arg_MPI_HEADERS})
  add_test(NAME unit.header_list
           COMMAND "${CMAKE_COMMAND}" "-DINCLUDE_DIR=${PROJECT_SOURCE_DIR}/include"
                   "-DLISTED=${listed}" -P "${PROJECT_SOURCE_DIR}/cmake/check_header_list.cmake")
  set_tests_properties(unit.header_list PROPERTIES LABELS "unit;static")
endfunction()
