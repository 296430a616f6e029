// <mpi.h> without the MPI C++ bindings (Open MPI's and MPICH's `MPI::` classes, deprecated in
// MPI-2.2 and removed in MPI-3.0): tshard calls the C API only, and parsing the bindings costs
// every translation unit about a second. A program that includes <mpi.h> itself first keeps them.
#pragma once
#ifndef OMPI_SKIP_MPICXX
#define OMPI_SKIP_MPICXX 1
#endif
#ifndef MPICH_SKIP_MPICXX
#define MPICH_SKIP_MPICXX 1
#endif
#include <mpi.h>

// SimGrid's SMPI (smpicxx, the simulation build: docs/simulation.md) provides <mpi.h> itself.
// TSHARD_SIMULATE marks the code that differs there; the build defines it, and so does this header
// for a program compiled with smpicxx by hand.
#if defined(SMPI_H) && !defined(TSHARD_SIMULATE)
#define TSHARD_SIMULATE 1
#endif
#if defined(TSHARD_SIMULATE) && TSHARD_SIMULATE
#include "tshard/comm/simulated_rand.hpp"
#endif

// std::complex's datatypes: SMPI 3.32 declares MPI_CXX_FLOAT_COMPLEX under a name it never defines,
// so it takes the C ones, whose layout and arithmetic are the same.
#if defined(TSHARD_SIMULATE) && TSHARD_SIMULATE
#define TSHARD_MPI_FLOAT_COMPLEX MPI_C_FLOAT_COMPLEX
#define TSHARD_MPI_DOUBLE_COMPLEX MPI_C_DOUBLE_COMPLEX
#else
#define TSHARD_MPI_FLOAT_COMPLEX MPI_CXX_FLOAT_COMPLEX
#define TSHARD_MPI_DOUBLE_COMPLEX MPI_CXX_DOUBLE_COMPLEX
#endif
