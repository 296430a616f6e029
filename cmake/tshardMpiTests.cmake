# tshard_add_mpi_test(NAME target [RANKS 1 2 ...] [ARGS ...] [ENV VAR=value ...]): one ctest per rank
# count, run under mpirun as the machines here need it (root, oversubscribed, bounded in time so a
# hang fails fast instead of waiting for ctest's default 1500 s), with ENV added to the environment.
if(TSHARD_SIMULATE)
  set(TSHARD_TEST_RANKS 1 4 CACHE STRING "Rank counts every MPI test runs at")
else()
  set(TSHARD_TEST_RANKS 1 2 3 4 6 CACHE STRING "Rank counts every MPI test runs at")
endif()
set(TSHARD_TEST_TIMEOUT 120 CACHE STRING "Seconds before an MPI test is ended")

set(TSHARD_MPI_ENV
    OPENBLAS_NUM_THREADS=1
    OMP_NUM_THREADS=1
    OMPI_ALLOW_RUN_AS_ROOT=1
    OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
    OMPI_MCA_rmaps_base_oversubscribe=1
    OMPI_MCA_btl_vader_single_copy_mechanism=none)

function(tshard_mpi_command out np)
  if(TSHARD_SIMULATE)
    # The simulation build runs its ranks on a simulated 16-core node (16 nodes of them past 16).
    set(${out} bash ${PROJECT_SOURCE_DIR}/scripts/simulate.sh --platform xeon-cluster -np ${np} PARENT_SCOPE)
    return()
  endif()
  math(EXPR _limit "${TSHARD_TEST_TIMEOUT} - 10")
  set(${out} ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} ${np} --oversubscribe --allow-run-as-root
      --timeout ${_limit} ${MPIEXEC_PREFLAGS} PARENT_SCOPE)
endfunction()

function(tshard_add_mpi_test name target)
  cmake_parse_arguments(T "" "" "RANKS;ARGS;ENV" ${ARGN})
  if(NOT T_RANKS)
    set(T_RANKS ${TSHARD_TEST_RANKS})
  endif()
  foreach(np IN LISTS T_RANKS)
    tshard_mpi_command(cmd ${np})
    add_test(NAME ${name}.np${np} COMMAND ${cmd} $<TARGET_FILE:${target}> ${T_ARGS} ${MPIEXEC_POSTFLAGS})
    # PROCESSORS: an oversubscribed run busy-polls, so it shares no core with another test
    # (6 ranks beside one compile took 95-100 s here instead of 4.5 s). ctest caps it at -j.
    set_tests_properties(${name}.np${np} PROPERTIES TIMEOUT ${TSHARD_TEST_TIMEOUT} RESOURCE_LOCK mpi PROCESSORS ${np}
                                                     ENVIRONMENT "${TSHARD_MPI_ENV};${T_ENV}")
  endforeach()
endfunction()
