# The packages tshard's headers need, found the same way in the build tree and in consumers.
include(CMakeFindDependencyMacro)

# Inside tshardConfig.cmake: a missing package makes find_package(tshard) fail cleanly.
macro(tshard_find_dependencies)
  find_dependency(MPI COMPONENTS CXX)
  find_dependency(Boost 1.74 COMPONENTS mpi serialization)
  find_dependency(Eigen3 3.4 NO_MODULE)
endmacro()

# CBLAS for local products, as the imported target tshard_blas::cblas (its cblas.h, its library, and
# TSHARD_BLAS_BLIS or TSHARD_BLAS_OPENBLAS where it is one of those). TSHARD_BLAS chooses:
#   auto (the default): BLIS where it is found (Debian: libblis-dev), else OpenBLAS (libopenblas-dev),
#                       else any BLAS with cblas.h;
#   blis, openblas:     that one, or no CBLAS.
# BLIS first: it picks its kernels from the CPU's features, and tshard sets them from its own
# reading of the CPU where they matter (ops/gemm.hpp); Debian 12's OpenBLAS 0.3.21 picks them by
# model, and on a model it does not know runs its Prescott (SSE3) or Haswell kernels: sgemm 20
# GFLOP/s against BLIS's 122 on one core of a Xeon it does not know; where it knows the model the
# two tie within 5 % on most shapes (docs/performance.md).
# Sets TSHARD_CBLAS_FOUND and TSHARD_BLAS_VENDOR (BLIS, OpenBLAS or CBLAS).
macro(tshard_find_blas)
  set(TSHARD_BLAS "auto" CACHE STRING "The CBLAS of local products: auto (BLIS, else OpenBLAS, else any), blis or openblas")
  set_property(CACHE TSHARD_BLAS PROPERTY STRINGS auto blis openblas)
  if(NOT TARGET tshard_blas::cblas)
    if(TSHARD_BLAS MATCHES "^(auto|blis)$")
      # Debian installs each threading variant's blis.h and cblas.h in a folder of its own and points
      # <blis.h> at the chosen one.
      find_path(TSHARD_BLIS_HEADER_DIR blis.h PATH_SUFFIXES blis)
      find_library(TSHARD_BLIS_LIBRARY NAMES blis)
      if(TSHARD_BLIS_HEADER_DIR AND TSHARD_BLIS_LIBRARY)
        get_filename_component(_tshard_blis_h "${TSHARD_BLIS_HEADER_DIR}/blis.h" REALPATH)
        get_filename_component(_tshard_blis_dir "${_tshard_blis_h}" DIRECTORY)
        if(EXISTS "${_tshard_blis_dir}/cblas.h")
          add_library(tshard_blas::cblas INTERFACE IMPORTED)
          set_target_properties(tshard_blas::cblas PROPERTIES INTERFACE_INCLUDE_DIRECTORIES "${_tshard_blis_dir}"
                                INTERFACE_LINK_LIBRARIES "${TSHARD_BLIS_LIBRARY}"
                                INTERFACE_COMPILE_DEFINITIONS TSHARD_BLAS_BLIS=1)
          set(TSHARD_BLAS_VENDOR BLIS)
        endif()
      endif()
    endif()
    if(NOT TARGET tshard_blas::cblas AND TSHARD_BLAS MATCHES "^(auto|openblas)$")
      if(NOT TARGET BLAS::BLAS)
        set(BLA_VENDOR OpenBLAS)
        find_package(BLAS QUIET)
        if(NOT BLAS_FOUND AND TSHARD_BLAS STREQUAL "auto")
          unset(BLA_VENDOR)
          find_package(BLAS QUIET)
        endif()
      endif()
      find_path(TSHARD_CBLAS_INCLUDE_DIR cblas.h PATH_SUFFIXES openblas)
      if(TSHARD_CBLAS_INCLUDE_DIR AND TARGET BLAS::BLAS)
        add_library(tshard_blas::cblas INTERFACE IMPORTED)
        set_target_properties(tshard_blas::cblas PROPERTIES INTERFACE_INCLUDE_DIRECTORIES "${TSHARD_CBLAS_INCLUDE_DIR}"
                              INTERFACE_LINK_LIBRARIES BLAS::BLAS)
        set(TSHARD_BLAS_VENDOR CBLAS)
        if(EXISTS "${TSHARD_CBLAS_INCLUDE_DIR}/openblas_config.h")
          set_property(TARGET tshard_blas::cblas PROPERTY INTERFACE_COMPILE_DEFINITIONS TSHARD_BLAS_OPENBLAS=1)
          set(TSHARD_BLAS_VENDOR OpenBLAS)
        endif()
      endif()
    endif()
  endif()
  set(TSHARD_CBLAS_FOUND FALSE)
  if(TARGET tshard_blas::cblas)
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
# links it gets TSHARD_PRECOMPILED_KERNELS and compiles in ~0.65x the time (a model) with the same
# results. Built only where something links it. It is compiled with the directory's flags: a target
# with its own -march or Eigen settings links tshard::tshard (a mismatch fails to link, naming the
# settings); link it PRIVATE from executables (it is in no export set of yours).
# On x86-64 its hot kernels are also compiled for x86-64-v3 (AVX2 + FMA) and x86-64-v4 (AVX-512)
# and chosen at run time from the CPU (tshard/core/dispatch.hpp; TSHARD_KERNELS_DISPATCH=OFF: the
# directory's flags alone).
function(tshard_add_kernels source)
  if(TARGET tshard_kernels)
    return()
  endif()
  add_library(tshard_kernels STATIC EXCLUDE_FROM_ALL "${source}")
  add_library(tshard::kernels ALIAS tshard_kernels)
  target_link_libraries(tshard_kernels PUBLIC tshard::tshard)
  target_compile_definitions(tshard_kernels INTERFACE TSHARD_PRECOMPILED_KERNELS=1)
  set_target_properties(tshard_kernels PROPERTIES POSITION_INDEPENDENT_CODE ON)
  tshard_dispatch_supported(_tshard_dispatch)
  if(_tshard_dispatch)
    tshard_add_kernel_level(avx2 1 x86-64-v3 "${source}")
    tshard_add_kernel_level(avx512 2 x86-64-v4 "${source}")
  endif()
endfunction()

# Whether tshard::kernels can hold per-ISA objects here: x86-64, GCC or Clang, and binutils' ld
# (a relocatable link that makes COMDAT groups plain sections) and objcopy. Sets VAR.
function(tshard_dispatch_supported var)
  set(TSHARD_KERNELS_DISPATCH ON CACHE BOOL "tshard::kernels: hot kernels for AVX2 and AVX-512 too, chosen at run time")
  set(ok FALSE)
  if(TSHARD_KERNELS_DISPATCH AND CMAKE_SYSTEM_PROCESSOR MATCHES "^(x86_64|AMD64|amd64)$" AND
     CMAKE_CXX_COMPILER_ID MATCHES "^(GNU|Clang)$" AND CMAKE_LINKER AND CMAKE_OBJCOPY)
    include(CheckCXXCompilerFlag)
    check_cxx_compiler_flag(-march=x86-64-v4 TSHARD_HAS_MARCH_X86_64_V4)
    execute_process(COMMAND ${CMAKE_LINKER} --help OUTPUT_VARIABLE help ERROR_QUIET RESULT_VARIABLE rc)
    if(TSHARD_HAS_MARCH_X86_64_V4 AND rc EQUAL 0 AND help MATCHES "force-group-allocation")
      set(ok TRUE)
    endif()
  endif()
  if(NOT ok AND NOT DEFINED CACHE{TSHARD_DISPATCH_REPORTED})
    set(TSHARD_DISPATCH_REPORTED ON CACHE INTERNAL "")
    message(STATUS "tshard: tshard::kernels without per-ISA kernels (not x86-64 with GCC or Clang and binutils, "
                   "or TSHARD_KERNELS_DISPATCH=OFF): the build's flags decide")
  endif()
  set(${var} ${ok} PARENT_SCOPE)
endfunction()

# One level of tshard::kernels: SOURCE compiled for -march=MARCH with TSHARD_KERNELS_ISA=INDEX (only
# the dispatched kernels are instantiated; GCC's unique symbols made weak), linked relocatably into
# one object whose symbols are all made local but its anchor tshard_kernels_isa_NAME and the
# kernels' entries (IsaEntries), and archived into tshard_kernels, whose portable object references
# the anchor (TSHARD_KERNELS_WITH_NAME).
function(tshard_add_kernel_level name index march source)
  set(raw tshard_kernels_${name}_objects)
  add_library(${raw} OBJECT EXCLUDE_FROM_ALL "${source}")
  target_link_libraries(${raw} PRIVATE tshard::tshard)
  target_compile_definitions(${raw} PRIVATE TSHARD_KERNELS_ISA=${index})
  target_compile_options(${raw} PRIVATE -march=${march} -fno-lto $<$<CXX_COMPILER_ID:GNU>:-fno-gnu-unique>)
  set_target_properties(${raw} PROPERTIES POSITION_INDEPENDENT_CODE ON)
  set(object ${CMAKE_CURRENT_BINARY_DIR}/tshard_kernels_${name}.o)
  add_custom_command(OUTPUT ${object}
    COMMAND ${CMAKE_LINKER} -r --force-group-allocation -o ${object}.relocatable $<TARGET_OBJECTS:${raw}>
    COMMAND ${CMAKE_OBJCOPY} --wildcard --keep-global-symbol=tshard_kernels_isa_${name}
            "--keep-global-symbol=*IsaEntries*" ${object}.relocatable ${object}
    DEPENDS ${raw} $<TARGET_OBJECTS:${raw}>
    COMMENT "tshard::kernels for ${march}: its symbols made local"
    COMMAND_EXPAND_LISTS VERBATIM)
  set_source_files_properties(${object} PROPERTIES EXTERNAL_OBJECT TRUE GENERATED TRUE)
  target_sources(tshard_kernels PRIVATE ${object})
  string(TOUPPER ${name} upper)
  target_compile_definitions(tshard_kernels PRIVATE TSHARD_KERNELS_WITH_${upper}=1)
endfunction()

