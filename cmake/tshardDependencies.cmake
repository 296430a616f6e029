# The packages tshard's headers need, found the same way in the build tree and in consumers.
include(CMakeFindDependencyMacro)

# Inside tshardConfig.cmake: a missing package makes find_package(tshard) fail cleanly.
macro(tshard_find_dependencies)
  find_dependency(MPI COMPONENTS CXX)
  find_dependency(Boost 1.74 COMPONENTS mpi serialization)
  find_dependency(Eigen3 3.4 NO_MODULE)
endmacro()

# CBLAS for local products: Debian's OpenBLAS provides both BLAS and the cblas.h interface.
macro(tshard_find_blas)
  if(NOT TARGET BLAS::BLAS)
    set(BLA_VENDOR OpenBLAS)
    find_package(BLAS QUIET)
    if(NOT BLAS_FOUND)
      unset(BLA_VENDOR)
      find_package(BLAS QUIET)
    endif()
  endif()
  find_path(TSHARD_CBLAS_INCLUDE_DIR cblas.h PATH_SUFFIXES openblas)
  if(TSHARD_CBLAS_INCLUDE_DIR AND TARGET BLAS::BLAS)
    set_property(TARGET BLAS::BLAS APPEND PROPERTY INTERFACE_INCLUDE_DIRECTORIES ${TSHARD_CBLAS_INCLUDE_DIR})
  endif()
endmacro()
