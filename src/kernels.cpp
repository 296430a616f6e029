// tshard::kernels: the descriptor-level kernels (include/tshard/core/kernel_instances.hpp),
// compiled once for a program's build instead of in each of its translation units. Every kernel
// header lists its instances at its end; with TSHARD_KERNELS_INSTANTIATE they are definitions, and
// the non-template code of the headers (their -inl.hpp files) is defined here, once.
// Compiled again with TSHARD_KERNELS_ISA (1: x86-64-v3, 2: x86-64-v4), it is one per-ISA object
// of the hot kernels alone (include/tshard/core/dispatch.hpp).
#define TSHARD_KERNELS_INSTANTIATE 1
#include <tshard/tshard.hpp>
#include <tshard/train/train.hpp>

#if defined(TSHARD_KERNELS_ISA)
static_assert(int(tshard::compiled_cpu_capability()) == TSHARD_KERNELS_ISA,
              "tshard: a per-ISA object of tshard::kernels must be compiled for its level's -march");
// The object's anchor, which the portable object references (core/cpu_capability-inl.hpp).
#if TSHARD_KERNELS_ISA == 1
extern "C" const int tshard_kernels_isa_avx2 = 1;
#elif TSHARD_KERNELS_ISA == 2
extern "C" const int tshard_kernels_isa_avx512 = 1;
#endif
#endif
