# Configures, builds and runs tests/consumer/project against tshard in one of three ways:
# find_package against an install prefix, add_subdirectory, or FetchContent of the source.
function(run)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "failed (${rc}): ${ARGN}\n${out}\n${err}")
  endif()
  message("${out}")
endfunction()

file(REMOVE_RECURSE ${WORK_DIR})
set(args -S ${SOURCE_DIR}/tests/consumer/project -B ${WORK_DIR}/build -DTSHARD_CONSUMER_MODE=${MODE}
         -DTSHARD_SOURCE_DIR=${SOURCE_DIR} -DCMAKE_BUILD_TYPE=Release)
find_program(CCACHE ccache)
if(CCACHE)
  list(APPEND args -DCMAKE_CXX_COMPILER_LAUNCHER=${CCACHE})
endif()
if(MODE STREQUAL "find_package")
  run(${CMAKE_COMMAND} --install ${BUILD_DIR} --prefix ${WORK_DIR}/prefix)
  list(APPEND args -DCMAKE_PREFIX_PATH=${WORK_DIR}/prefix)
else()
  # Only the library itself: the consumer does not build tshard's tests or examples.
  list(APPEND args -DTSHARD_BUILD_TESTS=OFF -DTSHARD_BUILD_EXAMPLES=OFF)
endif()
run(${CMAKE_COMMAND} ${args})
run(${CMAKE_COMMAND} --build ${WORK_DIR}/build)
foreach(np 1 2 3 4 6)
  run(${MPIEXEC} -np ${np} --oversubscribe --allow-run-as-root --timeout 60 ${WORK_DIR}/build/consumer)
endforeach()
