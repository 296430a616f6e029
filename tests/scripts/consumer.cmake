# Configures, builds and runs tests/consumer/project against tshard in one of three ways:
# find_package against the install prefix PREFIX, add_subdirectory, or FetchContent of the source.
# MODE install installs the build BUILD_DIR into PREFIX (the find_package modes' fixture).
function(run)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "failed (${rc}): ${ARGN}\n${out}\n${err}")
  endif()
  message("${out}")
endfunction()

if(MODE STREQUAL "install")
  # The prefix the find_package modes share, afresh (no header a past install left).
  file(REMOVE_RECURSE ${PREFIX})
  run(${CMAKE_COMMAND} --install ${BUILD_DIR} --prefix ${PREFIX})
  return()
endif()

file(REMOVE_RECURSE ${WORK_DIR})
set(extra -DTSHARD_CONSUMER_EXPECT_BACKEND=${EXPECT_BACKEND})
if(MODE STREQUAL "find_package_no_blas")
  # The opt-out: TSHARD_USE_BLAS=OFF at the consumer's configure gives Eigen's GEMM.
  set(extra -DTSHARD_USE_BLAS=OFF -DTSHARD_CONSUMER_EXPECT_BACKEND=eigen)
  set(MODE find_package)
elseif(MODE STREQUAL "find_package_kernels")
  # find_package(tshard COMPONENTS kernels) and the program on tshard::kernels.
  list(APPEND extra -DTSHARD_CONSUMER_KERNELS=ON)
  set(MODE find_package)
elseif(MODE STREQUAL "find_package_hdf5")
  # find_package(tshard COMPONENTS hdf5) and a program on tshard::hdf5.
  list(APPEND extra -DTSHARD_CONSUMER_HDF5=ON)
  set(MODE find_package)
  set(with_io TRUE)
elseif(MODE STREQUAL "find_package_tokenizer")
  # find_package(tshard COMPONENTS tokenizer) and a program on tshard::tokenizer.
  list(APPEND extra -DTSHARD_CONSUMER_TOKENIZER=ON)
  set(MODE find_package)
  set(with_tokenizer TRUE)
endif()
set(args ${extra} -S ${SOURCE_DIR}/tests/consumer/project -B ${WORK_DIR}/build -DTSHARD_CONSUMER_MODE=${MODE}
         -DTSHARD_SOURCE_DIR=${SOURCE_DIR} -DCMAKE_BUILD_TYPE=Release)
find_program(CCACHE ccache)
if(CCACHE)
  list(APPEND args -DCMAKE_CXX_COMPILER_LAUNCHER=${CCACHE})
endif()
if(MODE STREQUAL "find_package")
  list(APPEND args -DCMAKE_PREFIX_PATH=${PREFIX})  # installed by the test consumer.install
else()
  # Only the library itself: the consumer does not build tshard's tests or examples.
  list(APPEND args -DTSHARD_BUILD_TESTS=OFF -DTSHARD_BUILD_EXAMPLES=OFF)
endif()
run(${CMAKE_COMMAND} ${args})
run(${CMAKE_COMMAND} --build ${WORK_DIR}/build)
foreach(np 1 2 3 4 6)
  run(${MPIEXEC} -np ${np} --oversubscribe --allow-run-as-root --timeout 60 ${WORK_DIR}/build/consumer)
endforeach()
if(with_tokenizer)
  run(${WORK_DIR}/build/consumer_tokenizer)
endif()
if(with_io)
  foreach(np 1 3)
    run(${MPIEXEC} -np ${np} --oversubscribe --allow-run-as-root --timeout 60 ${WORK_DIR}/build/consumer_io)
  endforeach()
endif()
