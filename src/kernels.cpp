// tshard::kernels: the descriptor-level kernels (include/tshard/core/kernel_instances.hpp),
// compiled once for a program's build instead of in each of its translation units. Every kernel
// header lists its instances at its end; with TSHARD_KERNELS_INSTANTIATE they are definitions, and
// the non-template code of the headers (their -inl.hpp files) is defined here, once.
#define TSHARD_KERNELS_INSTANTIATE 1
#include <tshard/tshard.hpp>
#include <tshard/train/train.hpp>
