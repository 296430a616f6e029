// Dropout whose mask depends only on (seed, global index), so it is the same on every mesh and
// every micro-batching.
#pragma once
#include <cstdint>
#include <string>

#include "tshard/ad/custom_vjp.hpp"
#include "tshard/ops/elementwise.hpp"
#include "tshard/tensor/factories.hpp"

namespace tshard::nn {

// Inverted dropout: each element is kept with probability 1 - p and scaled by 1 / (1 - p).
// Whether element i is kept depends only on (seed, i), i its column-major global index, so
// every mesh and spec drops the same elements. dropout_backward applies the same mask.
// With a row frame, x holds rows [row_offset, row_offset + n) of a batch of rows_total rows
// (a micro-batch): i is the index in that whole batch, so micro-batching keeps the masks.
namespace detail {
template <class X>
auto dropout_values(const X& xin, double p, std::uint64_t seed, Eigen::Index row_offset, Eigen::Index rows_total) {
  using T = typename X::Scalar;
  tshard::detail::OperatorScope scope("dropout");
  const auto& x = tshard::detail::resolved(xin, "dropout");
  using Out = ShardedTensor<T, typename X::MeshT, typename X::SpecType>;
  Out out(x.mesh(), x.global_shape());
  auto shape = x.global_shape();
  if (row_offset < 0 || rows_total < row_offset + shape[0])
    throw ShapeError("tshard::nn::dropout: rows [" + std::to_string(row_offset) + ", " + std::to_string(row_offset + shape[0]) +
                     ") of " + x.describe() + " are not inside a batch of " + std::to_string(rows_total) + " rows");
  shape[0] = rows_total;
  const T* in = x.data();
  T* o = out.data();
  const T scale = T(1.0 / (1.0 - p));
  tshard::detail::for_each_local<X::rank>(tshard::detail::layout_of(x), [&](const auto& g, tshard::detail::Index lin) {
    std::uint64_t linear = 0, stride = 1;
    for (int d = 0; d < X::rank; ++d) {
      linear += std::uint64_t(g[d] + (d == 0 ? row_offset : 0)) * stride;
      stride *= std::uint64_t(shape[d]);
    }
    o[lin] = tshard::detail::random_value<double>(seed, linear) >= p ? in[lin] * scale : T(0);
  });
  return out;
}
}  // namespace detail

template <tshard::detail::FloatingTensor X>
auto dropout(const X& x, double p, std::uint64_t seed, Eigen::Index row_offset, Eigen::Index rows_total) {
  static_assert(X::rank >= 1, "tshard: dropout takes a tensor of rank 1 or more");
  if (!(p >= 0 && p < 1)) throw ShapeError("tshard::nn::dropout: the drop probability " + std::to_string(p) + " is not in [0, 1)");
  // Under a gradient, the same mask on the way back: dropout is its own VJP.
  return ad::custom_vjp([&](const auto& v) { return detail::dropout_values(v, p, seed, row_offset, rows_total); },
                        [=](const auto& dy, const auto&, const auto&) {
                          return detail::dropout_values(dy, p, seed, row_offset, rows_total);
                        },
                        x);
}

template <tshard::detail::FloatingTensor X>
auto dropout(const X& x, double p, std::uint64_t seed) {
  return dropout(x, p, seed, 0, x.global_shape()[0]);
}

template <tshard::detail::FloatingTensor DY>
auto dropout_backward(const DY& dy, double p, std::uint64_t seed) {
  return dropout(dy, p, seed);
}

}  // namespace tshard::nn
