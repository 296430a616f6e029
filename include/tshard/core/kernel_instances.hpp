// Compiled once: the descriptor-level kernels.
//
// What runs on descriptors (redistribute<T>, einsum_run<T>, the collectives, the attention
// blocks, the optimiser's update) is a template on the element type only. Header-only, every
// translation unit that uses one compiles it again: about half of a model's object code. A
// program that links tshard::kernels (a static library its own build compiles from
// tshard/kernels.cpp, with its compiler and flags) gets TSHARD_PRECOMPILED_KERNELS: each kernel
// header then declares its instances `extern template`, and the translation unit neither
// instantiates nor optimises them (a model compiles in ~0.6x the time). kernels.cpp defines
// TSHARD_KERNELS_INSTANTIATE and includes the headers: the same lines are the definitions.
//
// A header lists its kernels at its end, after the definitions:
//
//   #define TSHARD_INSTANCE(T) TSHARD_KERNEL_INSTANCE(void redistribute<T>(MeshState&, ..., T*))
//   TSHARD_FOR_EACH_ELEMENT(TSHARD_INSTANCE)
//   #undef TSHARD_INSTANCE
//
// An element type outside the list is instantiated where it is used, as without the library.
#pragma once
#include <Eigen/Core>
#include <cstdint>

#if defined(TSHARD_KERNELS_INSTANTIATE)
#define TSHARD_KERNEL_INSTANCE(...) template __VA_ARGS__;
#elif defined(TSHARD_PRECOMPILED_KERNELS)
#define TSHARD_KERNEL_INSTANCE(...) extern template __VA_ARGS__;
#else
#define TSHARD_KERNEL_INSTANCE(...)
#endif

// Floating types a model computes in.
#define TSHARD_FOR_EACH_FLOAT(X) X(float) X(double)
// What gradients and their sums hold (bfloat16 under --bf16).
#define TSHARD_FOR_EACH_REAL(X) X(float) X(double) X(Eigen::bfloat16)
// What host collectives sum: the reals and the integers.
#define TSHARD_FOR_EACH_NUMBER(X) X(float) X(double) X(Eigen::bfloat16) X(int) X(std::int64_t)
// What data movement carries: values, masks and token ids too.
#define TSHARD_FOR_EACH_ELEMENT(X) X(float) X(double) X(Eigen::bfloat16) X(int) X(bool) X(std::int64_t)
