// The local reduction kernel: op over some dims of a block's valid part (padding never read).
// Shared by the reductions and by einsum's pre-sum of indices that one operand holds alone.
#pragma once
#include <algorithm>
#include <array>
#include <cmath>
#include <limits>
#include <type_traits>

#include <Eigen/Core>

#include "tshard/comm/datatype.hpp"
#include "tshard/core/dispatch.hpp"
#include "tshard/core/shard.hpp"

namespace tshard::detail {

template <class T>
T reduce_identity(ReduceOp op) {
  if (op == ReduceOp::Sum) return T(0);
  if constexpr (std::numeric_limits<T>::has_infinity)
    return op == ReduceOp::Max ? -std::numeric_limits<T>::infinity() : std::numeric_limits<T>::infinity();
  else
    return op == ReduceOp::Max ? std::numeric_limits<T>::lowest() : std::numeric_limits<T>::max();
}

template <class T>
T combine(ReduceOp op, T acc, T v) {
  if (op == ReduceOp::Sum) return acc + v;
  if constexpr (!is_complex_v<T>) {
    if constexpr (std::is_floating_point_v<T>)
      if (std::isnan(v) || std::isnan(acc)) return std::numeric_limits<T>::quiet_NaN();  // NaN wins, as numpy
    return op == ReduceOp::Max ? (v > acc ? v : acc) : (v < acc ? v : acc);
  }
  return acc;
}

// out (padded extents `op`, the kept dims) = op over the reduced dims of the valid part of in,
// accumulated in A (T's own type, or float for bfloat16).
template <class T, class A>
void reduce_into(ReduceOp op, const T* in, const ShardLayout& l, const std::array<bool, kMaxRank>& reduced, A* out,
                 const Extents& op_ext, int out_rank) {
  const Index out_n = volume(op_ext, out_rank);
  std::fill(out, out + out_n, reduce_identity<A>(op));
  if (l.valid_size() == 0) return;
  // Strides of the output over the input's dims (0 along reduced dims).
  Extents ostride{}, istride{};
  Index s = 1, t = 1, k = 0;
  for (int d = 0; d < l.rank; ++d) {
    istride[d] = t;
    t *= l.padded[d];
    if (!reduced[d]) {
      ostride[d] = s;
      s *= op_ext[k++];
    }
  }
  // The run: dim 0, and where dim 0 is kept, every leading kept dim that the block and out hold
  // whole ([B, T, D] summed over D adds runs of B T). Each output element still takes its terms
  // in the same order.
  int first = 1;
  if (!reduced[0])
    while (first < l.rank && !reduced[first] && l.valid[first - 1] == l.padded[first - 1] &&
           l.valid[first - 1] == op_ext[first - 1])
      ++first;
  const Index run = volume(l.valid, first);
  for_each_index(l.valid, first, l.rank, [&](const Extents& i) {
    const Index ib = offset_of(i, istride, first, l.rank), ob = offset_of(i, ostride, first, l.rank);
    const T* src = in + ib;
    if (reduced[0] && op == ReduceOp::Sum) {  // vectorised, with Eigen's blocked (more accurate) summation
      if constexpr (std::is_same_v<T, A>)
        out[ob] += Eigen::Map<const Eigen::Array<T, Eigen::Dynamic, 1>>(src, run).sum();
      else
        out[ob] += Eigen::Map<const Eigen::Array<T, Eigen::Dynamic, 1>>(src, run).template cast<A>().sum();
    } else if (reduced[0]) {
      A acc = out[ob];
      for (Index x = 0; x < run; ++x) acc = combine(op, acc, A(src[x]));
      out[ob] = acc;
    } else if (op == ReduceOp::Sum) {
      A* dst = out + ob;
      for (Index x = 0; x < run; ++x) dst[x] += A(src[x]);
    } else {
      A* dst = out + ob;
      for (Index x = 0; x < run; ++x) dst[x] = combine(op, dst[x], A(src[x]));
    }
  });
}

// Dispatched for float and double (core/dispatch.hpp).
template <class T>
void reduce_kernel(ReduceOp op, const T* in, const ShardLayout& l, const std::array<bool, kMaxRank>& reduced, T* out,
                   const Extents& op_ext, int out_rank) {
  TSHARD_DISPATCH((reduce_kernel<T>), op, in, l, reduced, out, op_ext, out_rank);
  if constexpr (std::is_same_v<T, accumulator_t<T>>) {
    reduce_into<T, T>(op, in, l, reduced, out, op_ext, out_rank);
  } else {  // bfloat16: sums in float, rounded once
    const Index out_n = volume(op_ext, out_rank);
    std::vector<accumulator_t<T>> acc(static_cast<std::size_t>(out_n));
    reduce_into<T, accumulator_t<T>>(op, in, l, reduced, acc.data(), op_ext, out_rank);
    for (Index i = 0; i < out_n; ++i) out[i] = T(acc[static_cast<std::size_t>(i)]);
  }
}

}  // namespace tshard::detail

// Compiled once where the program links tshard::kernels, and per instruction-set level.
namespace tshard::detail {
#define TSHARD_INSTANCE(T) TSHARD_DISPATCHED_KERNEL(void, (reduce_kernel<T>), ReduceOp, const T*, const ShardLayout&, \
    const std::array<bool, kMaxRank>&, T*, const Extents&, int)
TSHARD_FOR_EACH_FLOAT(TSHARD_INSTANCE)
#undef TSHARD_INSTANCE
}  // namespace tshard::detail
