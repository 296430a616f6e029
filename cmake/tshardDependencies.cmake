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
  set(TSHARD_CBLAS_FOUND FALSE)
  if(TSHARD_CBLAS_INCLUDE_DIR AND TARGET BLAS::BLAS)
    get_target_property(_tshard_blas_includes BLAS::BLAS INTERFACE_INCLUDE_DIRECTORIES)
    if(NOT TSHARD_CBLAS_INCLUDE_DIR IN_LIST _tshard_blas_includes)
      set_property(TARGET BLAS::BLAS APPEND PROPERTY INTERFACE_INCLUDE_DIRECTORIES ${TSHARD_CBLAS_INCLUDE_DIR})
    endif()
    set(TSHARD_CBLAS_FOUND TRUE)
  endif()
endmacro()

# An imported target for a library found by its headers and its file (made once).
macro(tshard_import_library target include_dir library)
  if(NOT TARGET ${target})
    add_library(${target} INTERFACE IMPORTED)
    set_target_properties(${target} PROPERTIES INTERFACE_INCLUDE_DIRECTORIES "${include_dir}" INTERFACE_LINK_LIBRARIES "${library}")
  endif()
endmacro()

# Parallel HDF5 for io/hdf5.hpp (Debian: libhdf5-openmpi-dev; elsewhere HDF5_ROOT). Sets
# TSHARD_HDF5_FOUND and, where found, the imported target tshard_hdf5::hdf5. Found by its
# headers and library (FindHDF5 would need the C language enabled) and checked to be parallel.
macro(tshard_find_hdf5)
  set(TSHARD_HDF5_FOUND FALSE)
  find_path(TSHARD_HDF5_INCLUDE_DIR hdf5.h HINTS ${HDF5_ROOT} ENV HDF5_ROOT
            PATH_SUFFIXES include/hdf5/openmpi hdf5/openmpi include)
  find_library(TSHARD_HDF5_LIBRARY NAMES hdf5 HINTS ${HDF5_ROOT} ENV HDF5_ROOT PATH_SUFFIXES hdf5/openmpi lib)
  if(TSHARD_HDF5_INCLUDE_DIR AND TSHARD_HDF5_LIBRARY AND EXISTS "${TSHARD_HDF5_INCLUDE_DIR}/H5pubconf.h")
    file(STRINGS "${TSHARD_HDF5_INCLUDE_DIR}/H5pubconf.h" _tshard_hdf5_parallel REGEX "#define H5_HAVE_PARALLEL 1")
    if(_tshard_hdf5_parallel)
      tshard_import_library(tshard_hdf5::hdf5 "${TSHARD_HDF5_INCLUDE_DIR}" "${TSHARD_HDF5_LIBRARY}")
      set(TSHARD_HDF5_FOUND TRUE)
    endif()
  endif()
endmacro()

# PCRE2 (8-bit) for the Unicode patterns of train/tokenizer.hpp (Debian: libpcre2-dev; elsewhere
# PCRE2_ROOT). Sets TSHARD_PCRE2_FOUND and, where found, the imported target tshard_pcre2::pcre2.
macro(tshard_find_pcre2)
  set(TSHARD_PCRE2_FOUND FALSE)
  find_path(TSHARD_PCRE2_INCLUDE_DIR pcre2.h HINTS ${PCRE2_ROOT} ENV PCRE2_ROOT PATH_SUFFIXES include)
  find_library(TSHARD_PCRE2_LIBRARY NAMES pcre2-8 HINTS ${PCRE2_ROOT} ENV PCRE2_ROOT PATH_SUFFIXES lib)
  if(TSHARD_PCRE2_INCLUDE_DIR AND TSHARD_PCRE2_LIBRARY)
    tshard_import_library(tshard_pcre2::pcre2 "${TSHARD_PCRE2_INCLUDE_DIR}" "${TSHARD_PCRE2_LIBRARY}")
    set(TSHARD_PCRE2_FOUND TRUE)
  endif()
endmacro()

# tshard_precompile_headers(target): precompiles <tshard/tshard.hpp> (with Eigen, MPI and the
# standard headers it pulls in) for target. It saves the parse, about 2 s of a model file's 23 s
# at -O0 on a 2-core machine; at -O2 nothing measurable (loading the 290 MB header costs what the
# parse did): what an -O2 file costs is code generation of its instantiations, which
# tshard::kernels cuts instead.
function(tshard_precompile_headers target)
  target_precompile_headers(${target} PRIVATE <tshard/tshard.hpp>)
endfunction()

# tshard_add_kernels(SOURCE): tshard::kernels, a static library compiled in the consumer's build
# (its compiler, its flags, tshard::tshard's BLAS choice) from tshard's kernels.cpp: the
# descriptor-level kernels, compiled once instead of in every translation unit. A target that
# links it gets TSHARD_PRECOMPILED_KERNELS and compiles in ~0.3-0.4x the time (a model) with the same
# results. Built only where something links it. It is compiled with the directory's flags: a target
# with its own -march or Eigen settings links tshard::tshard (a mismatch fails to link, naming the
# settings); link it PRIVATE from executables (it is in no export set of yours).
function(tshard_add_kernels source)
  if(TARGET tshard_kernels)
    return()
  endif()
  add_library(tshard_kernels STATIC EXCLUDE_FROM_ALL "${source}")
  add_library(tshard::kernels ALIAS tshard_kernels)
  target_link_libraries(tshard_kernels PUBLIC tshard::tshard)
  target_compile_definitions(tshard_kernels INTERFACE TSHARD_PRECOMPILED_KERNELS=1)
  set_target_properties(tshard_kernels PROPERTIES POSITION_INDEPENDENT_CODE ON)
endfunction()

