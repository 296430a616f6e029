// Batch normalisation (Ioffe and Szegedy 2015) of a tensor split anywhere: statistics over every
// dim but Dim, summed across every mesh axis that splits those dims, so a batch split over
// "data" and an image split over space normalise with the statistics of the whole global batch
// (the cross-replica batch norm of the MLPerf TPU work). Written with tshard's differentiable
// operators: the sums are sharded reductions whose partials are resolved once, and the gradient
// is derived. BatchNorm (nn/layers/batch_norm.hpp) is the module: gamma, beta, and running
// statistics for evaluation.
#pragma once
#include <cmath>
#include <string>
#include <utility>

#include "tshard/ad/ad.hpp"
#include "tshard/ops/elementwise.hpp"
#include "tshard/ops/reduce.hpp"
#include "tshard/ops/shape.hpp"

namespace tshard::nn {
namespace detail {

// Spec<D, R, ..., R> with N replicated dims after D.
template <class SpecT, int N>
struct with_trailing_r;
template <class... D>
struct with_trailing_r<Spec<D...>, 0> {
  using type = Spec<D...>;
};
template <class... D, int N>
  requires(N > 0)
struct with_trailing_r<Spec<D...>, N> {
  using type = typename with_trailing_r<Spec<D..., R>, N - 1>::type;
};

// The mean over every dim but Dim, kept at extent 1 for broadcasting back.
template <int Dim, class X, int... I>
auto mean_all_but(const X& x, std::integer_sequence<int, I...>) {
  return tshard::mean<(I < Dim ? I : I + 1)...>(x, keep_dims);
}

// gamma [C] as [C, 1, ..., 1]: it then broadcasts along dims Dim.. of x (numpy aligns the last).
template <int Trailing, class G>
auto per_channel(const G& g) {
  using Out = typename with_trailing_r<typename G::SpecType, Trailing>::type;
  Eigen::Index shape[Trailing + 1];
  shape[0] = g.global_shape()[0];
  for (int d = 1; d <= Trailing; ++d) shape[d] = 1;
  return tshard::reshape<Out>(g, shape);
}

}  // namespace detail

// (x - mean) / sqrt(var + eps) * gamma + beta with mean and (biased) var over every dim of x but
// Dim, gamma and beta [x's extent along Dim]: training-mode batch norm, as PyTorch's.
template <int Dim, tshard::detail::FloatingTensor X, tshard::detail::FloatingTensor G, tshard::detail::FloatingTensor B>
auto batch_norm(const X& x, const G& gamma, const B& beta, typename X::Scalar eps) {
  static_assert(Dim >= 0 && Dim < X::rank && X::rank >= 2, "tshard: batch_norm's Dim is a dim of x (channels: 1 for NCHW)");
  static_assert(G::rank == 1 && B::rank == 1, "tshard: batch_norm's gamma and beta are rank-1 tensors [C]");
  tshard::detail::OperatorScope scope("batch_norm");
  const auto c = tshard::detail::extents_of(x)[Dim];
  if (tshard::detail::extents_of(gamma)[0] != c || tshard::detail::extents_of(beta)[0] != c)
    throw ShapeError("tshard::nn::batch_norm: gamma " + gamma.describe() + " and beta " + beta.describe() +
                     " must have x's extent along dim " + std::to_string(Dim) + ": x is " + x.describe());
  constexpr int Trailing = X::rank - 1 - Dim;
  auto centred = x - detail::mean_all_but<Dim>(x, std::make_integer_sequence<int, X::rank - 1>{});
  auto var = detail::mean_all_but<Dim>(centred * centred, std::make_integer_sequence<int, X::rank - 1>{});
  return centred / tshard::sqrt(var + eps) * detail::per_channel<Trailing>(gamma) + detail::per_channel<Trailing>(beta);
}

}  // namespace tshard::nn
