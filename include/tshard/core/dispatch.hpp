// Hot kernels compiled once per instruction-set level in tshard::kernels and chosen at run time
// (cpu_capability.hpp says which level runs).
//
// A dispatched kernel is a plain function template whose body opens with TSHARD_DISPATCH, and
// whose instance list names it with TSHARD_DISPATCHED_KERNEL instead of TSHARD_KERNEL_INSTANCE:
//
//   template <class T>
//   void gelu_run(T* out, const T* x, Index n) {
//     TSHARD_DISPATCH((gelu_run<T>), out, x, n);
//     ...  // the body
//   }
//   #define TSHARD_INSTANCE(T) TSHARD_DISPATCHED_KERNEL(void, (gelu_run<T>), T*, const T*, Index)
//   TSHARD_FOR_EACH_FLOAT(TSHARD_INSTANCE)
//
// tshard::kernels compiles kernels.cpp for the program's own flags (the portable instances) and
// again, with TSHARD_KERNELS_ISA set, for each higher level it builds (-march=x86-64-v3, -v4).
// A per-ISA object keeps its code to itself: its symbols are made local when it is built, so no
// inline function of Eigen's or the standard library's compiled there for AVX-512 can stand in
// for the portable one elsewhere (the ODR hazard of mixing -march in one program). It registers
// each of its instances in the kernel's entry for its level before main. The portable instance's
// TSHARD_DISPATCH calls the entry of the level that runs where one is registered, else goes on
// with its own body. Header-only, it dispatches nothing; inside a per-ISA object it is nothing.
// Outside those objects it also opens the body as a sampled kernel (simulated_timing.hpp: the
// simulation build's timing mode; nothing elsewhere).
//
// A dispatched kernel takes pointers, sizes and plain structs; it never allocates or frees what
// its caller owns (Eigen aligns heap blocks to the vector width it was compiled for), and it keeps
// no state between calls (each level would keep its own).
#pragma once
#include "tshard/core/cpu_capability.hpp"
#include "tshard/core/kernel_instances.hpp"
#include "tshard/core/simulated_timing.hpp"

namespace tshard::detail {

// The entries of the kernel whose portable instance is Kernel, one per level (null: not built).
template <auto Kernel>
struct IsaEntries {
  static inline decltype(Kernel) entry[kCpuCapabilities] = {};
};

// The registered instance of the level that runs, or null (the portable body then runs).
template <auto Kernel>
decltype(Kernel) dispatched_entry() {
  return IsaEntries<Kernel>::entry[int(cpu_capability())];
}

// A per-ISA object's registration of its own instance of Kernel.
template <auto Kernel, int Level>
struct IsaRegistration {
  IsaRegistration() { IsaEntries<Kernel>::entry[Level] = Kernel; }
};

}  // namespace tshard::detail

#define TSHARD_DETAIL_CAT2(a, b) a##b
#define TSHARD_DETAIL_CAT(a, b) TSHARD_DETAIL_CAT2(a, b)

#if defined(TSHARD_KERNELS_ISA)
#define TSHARD_DISPATCH(kernel, ...)
#define TSHARD_DISPATCHED_KERNEL(Ret, Name, ...)                                                    \
  template Ret Name(__VA_ARGS__);                                                                  \
  static const ::tshard::detail::IsaRegistration<static_cast<Ret (*)(__VA_ARGS__)>(&Name), TSHARD_KERNELS_ISA> \
      TSHARD_DETAIL_CAT(tshard_isa_registration_, __COUNTER__);
#elif defined(TSHARD_KERNELS_INSTANTIATE) || defined(TSHARD_PRECOMPILED_KERNELS)
#define TSHARD_DISPATCH(kernel, ...)                                                     \
  TSHARD_SAMPLED_KERNEL(__VA_ARGS__);                                              \
  if (const auto tshard_isa_entry = ::tshard::detail::dispatched_entry<&kernel>()) \
  return tshard_isa_entry(__VA_ARGS__)
#define TSHARD_DISPATCHED_KERNEL(Ret, Name, ...) TSHARD_KERNEL_INSTANCE(Ret Name(__VA_ARGS__))
#else
#define TSHARD_DISPATCH(kernel, ...) TSHARD_SAMPLED_KERNEL(__VA_ARGS__)
#define TSHARD_DISPATCHED_KERNEL(Ret, Name, ...)
#endif
