// Activations with their backward: relu, gelu (tanh form, as GPT-2 and Megatron use it), and the
// elementwise activations of ops/ (relu, sigmoid, tanh, exp) reachable from ts::nn as well.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>

#include "tshard/core/dispatch.hpp"
#include "tshard/core/kernel_instances.hpp"
#include "tshard/ad/custom_vjp.hpp"
#include "tshard/ops/elementwise.hpp"
#include "tshard/tensor/factories.hpp"

namespace tshard::nn {
namespace detail {

// gelu and its slope over runs of n elements, vectorised through Eigen's arrays (its float tanh
// is a vectorised rational approximation; glibc's scalar tanhf took ~10% of a transformer
// step). Blocks of 256 keep tanh's values in registers and cache between the two uses.
// Dispatched (core/dispatch.hpp).
template <class T>
void gelu_run(T* out, const T* x, tshard::detail::Index n) {
  TSHARD_DISPATCH((gelu_run<T>), out, x, n);
  using A = Eigen::Array<T, Eigen::Dynamic, 1>;
  const T c = T(0.7978845608028654);
  Eigen::Map<const A> xv(x, n);
  Eigen::Map<A>(out, n) = T(0.5) * xv * (T(1) + (c * (xv + T(0.044715) * xv.cube())).tanh());
}

template <class T>
void gelu_backward_run(T* out, const T* x, const T* g, tshard::detail::Index n) {
  TSHARD_DISPATCH((gelu_backward_run<T>), out, x, g, n);
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

}  // namespace tshard::nn

// Compiled once where the program links tshard::kernels (core/kernel_instances.hpp), and per
// instruction-set level (core/dispatch.hpp).
namespace tshard::nn::detail {
#define TSHARD_INSTANCE(T) TSHARD_DISPATCHED_KERNEL(void, (gelu_run<T>), T*, const T*, tshard::detail::Index)
TSHARD_FOR_EACH_FLOAT(TSHARD_INSTANCE)
#undef TSHARD_INSTANCE
#define TSHARD_INSTANCE(T) TSHARD_DISPATCHED_KERNEL(void, (gelu_backward_run<T>), T*, const T*, const T*, \
    tshard::detail::Index)
TSHARD_FOR_EACH_FLOAT(TSHARD_INSTANCE)
#undef TSHARD_INSTANCE
}  // namespace tshard::nn::detail
