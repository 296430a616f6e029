// Activations with their backward: relu, gelu (tanh form, as GPT-2 and Megatron use it), and
// dropout whose mask depends only on (seed, global index), so it is the same on every mesh.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>

#include "tshard/ad/custom_vjp.hpp"
#include "tshard/ops/elementwise.hpp"
#include "tshard/tensor/factories.hpp"

namespace tshard::nn {
namespace detail {

// gelu and its slope over runs of n elements, vectorised through Eigen's arrays (its float tanh
// is a vectorised rational approximation; glibc's scalar tanhf took ~10% of a transformer
// step). Blocks of 256 keep tanh's values in registers and cache between the two uses.
template <class T>
void gelu_run(T* out, const T* x, tshard::detail::Index n) {
  using A = Eigen::Array<T, Eigen::Dynamic, 1>;
  const T c = T(0.7978845608028654);
  Eigen::Map<const A> xv(x, n);
  Eigen::Map<A>(out, n) = T(0.5) * xv * (T(1) + (c * (xv + T(0.044715) * xv.cube())).tanh());
}

template <class T>
void gelu_backward_run(T* out, const T* x, const T* g, tshard::detail::Index n) {
  using A = Eigen::Array<T, Eigen::Dynamic, 1>;
  const T c = T(0.7978845608028654);
  Eigen::Array<T, 256, 1> t;
  for (tshard::detail::Index at = 0; at < n; at += 256) {
    const tshard::detail::Index m = std::min<tshard::detail::Index>(256, n - at);
    Eigen::Map<const A> xv(x + at, m), gv(g + at, m);
    auto tv = t.head(m);
    tv = (c * (xv + T(0.044715) * xv.cube())).tanh();
    Eigen::Map<A>(out + at, m) =
        gv * (T(0.5) * (T(1) + tv) + T(0.5) * xv * (T(1) - tv.square()) * c * (T(1) + T(3 * 0.044715) * xv.square()));
  }
}

}  // namespace detail

// dL/dx of relu at x, given dL/dy: dy where x > 0, else 0 (one pass).
template <tshard::detail::RealTensor X, tshard::detail::RealTensor DY>
auto relu_backward(const X& x, const DY& dy) {
  using T = typename X::Scalar;
  tshard::detail::refuse_tracked("nn::relu_backward", tshard::detail::kNoSecondOrder, x, dy);
  return tshard::map([](T v, T g) { return v > T(0) ? g : T(0); }, x, dy);
}

template <tshard::detail::FloatingTensor X, tshard::detail::FloatingTensor DG>
auto gelu_backward(const X& x, const DG& dg);

// 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))); under a gradient, one node whose rule is
// gelu_backward.
template <tshard::detail::FloatingTensor X>
auto gelu(const X& x) {
  using T = typename X::Scalar;
  static_assert(!is_complex_v<T>, "tshard: gelu takes real values");
  tshard::detail::OperatorScope scope("gelu");
  return ad::custom_vjp(
      [](const auto& v) {
        return tshard::detail::map_runs<T>([](T* o, const T* in, tshard::detail::Index n) { detail::gelu_run(o, in, n); },
                                           v);
      },
      [](const auto& dg, const auto&, const auto& v) { return gelu_backward(v, dg); }, x);
}

template <tshard::detail::FloatingTensor X, tshard::detail::FloatingTensor DG>
auto gelu_backward(const X& x, const DG& dg) {
  using T = typename X::Scalar;
  static_assert(!is_complex_v<T>, "tshard: gelu takes real values");
  static_assert(std::is_same_v<T, typename DG::Scalar>, "tshard: gelu_backward's gradient has x's element type");
  tshard::detail::OperatorScope scope("gelu_backward");
  tshard::detail::refuse_tracked("nn::gelu_backward", tshard::detail::kNoSecondOrder, x, dg);
  return tshard::detail::map_runs<T>(
      [](T* o, const T* v, const T* g, tshard::detail::Index n) { detail::gelu_backward_run(o, v, g, n); }, x, dg);
}

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
