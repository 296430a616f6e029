// Compiled once: the descriptor-level kernels.
//
// What runs on descriptors (redistribute<T>, einsum_run<T>, the collectives, the attention
// blocks, the gradient rules, the optimiser's update) is a template on the element type only. Header-only, every
// translation unit that uses one compiles it again: about half of a model's object code. A
// program that links tshard::kernels (a static library its own build compiles from
// tshard/kernels.cpp, with its compiler and flags) gets TSHARD_PRECOMPILED_KERNELS: each kernel
// header then declares its instances `extern template`, and the translation unit neither
// instantiates nor optimises them (a model compiles in ~0.3-0.4x the time). kernels.cpp defines
// TSHARD_KERNELS_INSTANTIATE and includes the headers: the same lines are the definitions.
//
// A header lists its kernels at its end, after the definitions:
//
//   #define TSHARD_INSTANCE(T) TSHARD_KERNEL_INSTANCE(void redistribute<T>(MeshState&, ..., T*))
//   TSHARD_FOR_EACH_ELEMENT(TSHARD_INSTANCE)
//   #undef TSHARD_INSTANCE
//
// An element type outside the list is instantiated where it is used, as without the library.
//
// Code that is no template at all (file formats, the reshard planner, flags, configurations, the
// module tree's bookkeeping) is split as {fmt} splits format.h and format-inl.h: a header declares,
// its `-inl.hpp` defines with TSHARD_FUNC and is included at the header's end where
// TSHARD_HEADER_BODIES is 1. Header-only, TSHARD_FUNC is `inline`; in kernels.cpp it is nothing (one
// definition, in tshard::kernels); a program on tshard::kernels neither parses nor compiles them.
//
// The hot kernels among them are also compiled once per instruction-set level and chosen at run
// time (core/dispatch.hpp): kernels.cpp again with TSHARD_KERNELS_ISA set, where only those
// kernels are instantiated.
#pragma once
#include <cstdint>

#if defined(TSHARD_KERNELS_ISA)
#define TSHARD_FUNC inline
#define TSHARD_HEADER_BODIES 0
#elif defined(TSHARD_KERNELS_INSTANTIATE)
#define TSHARD_FUNC
#define TSHARD_HEADER_BODIES 1
#elif defined(TSHARD_PRECOMPILED_KERNELS)
#define TSHARD_FUNC inline
#define TSHARD_HEADER_BODIES 0
#else
#define TSHARD_FUNC inline
#define TSHARD_HEADER_BODIES 1
#endif

#if defined(TSHARD_KERNELS_ISA)
#define TSHARD_KERNEL_INSTANCE(...)
#elif defined(TSHARD_KERNELS_INSTANTIATE)
#define TSHARD_KERNEL_INSTANCE(...) template __VA_ARGS__;
#elif defined(TSHARD_PRECOMPILED_KERNELS)
#define TSHARD_KERNEL_INSTANCE(...) extern template __VA_ARGS__;
#else
#define TSHARD_KERNEL_INSTANCE(...)
#endif

#if (defined(TSHARD_KERNELS_INSTANTIATE) || defined(TSHARD_PRECOMPILED_KERNELS)) && !defined(TSHARD_KERNELS_ISA)
#include <Eigen/Core>  // (bfloat16 in the lists, the settings below; header-only, core/ needs no Eigen)

// A program and its tshard::kernels must agree on what shapes the kernels' code and data: Eigen's
// alignment (the vector width: SSE 16, AVX 32, AVX-512 64), FMA and the BLAS choice. Each side names
// a symbol after its own settings, so a program compiled otherwise than its kernels (a target's own
// -march, TSHARD_USE_BLAS on one side only) fails to link, with an undefined
// `tshard_kernels_compiled_with_align32_fma_cblas` (its own settings), instead of mixing kernels.
#define TSHARD_KERNELS_CAT2(a, b) a##b
#define TSHARD_KERNELS_CAT(a, b) TSHARD_KERNELS_CAT2(a, b)
#if defined(EIGEN_VECTORIZE_FMA)
#define TSHARD_KERNELS_FMA _fma
#else
#define TSHARD_KERNELS_FMA _no_fma
#endif
#if defined(TSHARD_USE_BLAS) && TSHARD_USE_BLAS
#define TSHARD_KERNELS_GEMM _cblas
#else
#define TSHARD_KERNELS_GEMM _eigen_gemm
#endif
#define TSHARD_KERNELS_SETTINGS                                                                        \
  TSHARD_KERNELS_CAT(                                                                                  \
      TSHARD_KERNELS_CAT(TSHARD_KERNELS_CAT(tshard_kernels_compiled_with_align, EIGEN_MAX_ALIGN_BYTES), \
                         TSHARD_KERNELS_FMA),                                                          \
      TSHARD_KERNELS_GEMM)
#if defined(TSHARD_KERNELS_INSTANTIATE)
extern "C" const int TSHARD_KERNELS_SETTINGS = 1;
#else
extern "C" const int TSHARD_KERNELS_SETTINGS;
namespace {
[[gnu::used]] const int* const tshard_kernels_settings_check = &TSHARD_KERNELS_SETTINGS;
}  // namespace
#endif
#endif

// Floating types a model computes in.
#define TSHARD_FOR_EACH_FLOAT(X) X(float) X(double)
// What gradients and their sums hold (bfloat16 under --bf16).
#define TSHARD_FOR_EACH_REAL(X) X(float) X(double) X(Eigen::bfloat16)
// What host collectives sum: the reals and the integers.
#define TSHARD_FOR_EACH_NUMBER(X) X(float) X(double) X(Eigen::bfloat16) X(int) X(std::int64_t)
// What data movement carries: values, masks and token ids too.
#define TSHARD_FOR_EACH_ELEMENT(X) X(float) X(double) X(Eigen::bfloat16) X(int) X(bool) X(std::int64_t)
