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
