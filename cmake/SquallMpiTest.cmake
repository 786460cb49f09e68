# SPDX-License-Identifier: Apache-2.0
# squall_add_mpi_test(<name> <target> [RANKS n...] [LABELS l...] [ARGS a...] [TIMEOUT s]
#                     [ENVIRONMENT VAR=value...])
#
# Registers <target> (a target, or the path of an executable) once per rank count as <name>.np<n>, run under MPIEXEC_EXECUTABLE with
# labels "mpi;collective" plus LABELS. RANKS defaults to 1 2 3 4. With Open MPI the run adds
# --oversubscribe (more ranks than cores is normal on CI) and the run-as-root variables (CI
# runs as root). With MPICH, which busy-polls and collapses past the core count, rank counts
# above SQUALL_MPI_MAX_RANKS (default 2 for MPICH) are not registered.

if(NOT DEFINED SQUALL_MPI_FLAVOUR)
  execute_process(COMMAND "${MPIEXEC_EXECUTABLE}" --version
                  OUTPUT_VARIABLE squall_mpiexec_version ERROR_VARIABLE squall_mpiexec_version
                  TIMEOUT 30)
  if(squall_mpiexec_version MATCHES "Open MPI|OpenRTE")
    set(SQUALL_MPI_FLAVOUR "openmpi" CACHE INTERNAL "")
  elseif(squall_mpiexec_version MATCHES "HYDRA|MPICH")
    set(SQUALL_MPI_FLAVOUR "mpich" CACHE INTERNAL "")
  else()
    set(SQUALL_MPI_FLAVOUR "other" CACHE INTERNAL "")
  endif()
endif()
if(SQUALL_MPI_FLAVOUR STREQUAL "mpich")
  set(SQUALL_MPI_MAX_RANKS 2 CACHE STRING "Largest rank count registered for MPI tests")
else()
  set(SQUALL_MPI_MAX_RANKS 4 CACHE STRING "Largest rank count registered for MPI tests")
endif()
message(STATUS "squall MPI tests: ${SQUALL_MPI_FLAVOUR} (${MPIEXEC_EXECUTABLE}), up to ${SQUALL_MPI_MAX_RANKS} ranks")

function(squall_add_mpi_test name target)
  cmake_parse_arguments(arg "" "TIMEOUT" "RANKS;LABELS;ARGS;ENVIRONMENT" ${ARGN})
  if(NOT arg_RANKS)
    set(arg_RANKS 1 2 3 4)
  endif()
  if(NOT arg_TIMEOUT)
    set(arg_TIMEOUT 300)
  endif()
  set(flags "")
  set(environment "")
  if(SQUALL_MPI_FLAVOUR STREQUAL "openmpi")
    set(flags --oversubscribe)
    set(environment "OMPI_ALLOW_RUN_AS_ROOT=1;OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1;OMPI_MCA_rmaps_base_oversubscribe=1")
  endif()
  list(APPEND environment ${arg_ENVIRONMENT})
  if(TARGET ${target})
    set(executable "$<TARGET_FILE:${target}>")
  else()
    set(executable "${target}")
  endif()
  foreach(ranks IN LISTS arg_RANKS)
    if(ranks GREATER SQUALL_MPI_MAX_RANKS)
      continue()
    endif()
    add_test(NAME ${name}.np${ranks}
             COMMAND "${MPIEXEC_EXECUTABLE}" ${MPIEXEC_NUMPROC_FLAG} ${ranks} ${flags}
                     ${MPIEXEC_PREFLAGS} ${executable} ${MPIEXEC_POSTFLAGS} ${arg_ARGS})
    set_tests_properties(${name}.np${ranks} PROPERTIES
      LABELS "mpi;collective;${arg_LABELS}"
      ENVIRONMENT "${environment}"
      TIMEOUT ${arg_TIMEOUT}
      PROCESSORS ${ranks})
  endforeach()
endfunction()
