// Layer normalisation over the last dim (which may be split: its mean and variance are partials
// resolved over one value per row), with its backward (Ba, Kiros, Hinton 2016).
#pragma once
#include <cmath>
#include <tuple>
#include <utility>

#include "tshard/ops/elementwise.hpp"
#include "tshard/ops/reduce.hpp"

namespace tshard::nn {
namespace detail {

// (x - mean) and 1 / sqrt(var + eps) along the last dim.
template <int Dim, class X, class T>
auto normalised(const X& x, T eps) {
  auto xc = x - mean<Dim>(x, keep_dims);
  auto rstd = tshard::map([eps](T v) { return T(1) / std::sqrt(v + eps); }, mean<Dim>(square(xc), keep_dims));
  return std::pair{std::move(xc), std::move(rstd)};
}

}  // namespace detail

// (x - mean) / sqrt(var + eps) * gamma + beta along Dim, the last dim; gamma and beta: [H].
template <int Dim, tshard::detail::FloatingTensor X, tshard::detail::FloatingTensor G, tshard::detail::FloatingTensor B>
auto layer_norm(const X& x, const G& gamma, const B& beta, typename X::Scalar eps) {
  static_assert(Dim == X::rank - 1, "tshard: layer_norm normalises the last dim (gamma and beta align with it)");
  static_assert(G::rank == 1 && B::rank == 1, "tshard: layer_norm's gamma and beta are rank-1 tensors [H]");
  tshard::detail::OperatorScope scope("layer_norm");
  auto [xc, rstd] = detail::normalised<Dim>(x, eps);
  return xc * rstd * gamma + beta;
}

// dx, dgamma, dbeta given x, gamma and dL/dn (the statistics are recomputed). dgamma and dbeta
// are sums over the rows: partial sums where the rows are split, resolved when used.
template <int Dim, tshard::detail::FloatingTensor X, tshard::detail::FloatingTensor G, tshard::detail::FloatingTensor DN>
auto layer_norm_backward(const X& x, const G& gamma, const DN& dn, typename X::Scalar eps) {
  static_assert(Dim == X::rank - 1, "tshard: layer_norm normalises the last dim (gamma and beta align with it)");
  static_assert(G::rank == 1, "tshard: layer_norm's gamma is a rank-1 tensor [H]");
  tshard::detail::OperatorScope scope("layer_norm_backward");
  auto [xc, rstd] = detail::normalised<Dim>(x, eps);
  auto xhat = xc * rstd;
  auto dgamma = sum_leading_dims(dn * xhat);
  auto dbeta = sum_leading_dims(dn);
  auto dxhat = dn * gamma;
  auto dx = rstd * (dxhat - mean<Dim>(dxhat, keep_dims) - xhat * mean<Dim>(dxhat * xhat, keep_dims));
  return std::tuple{std::move(dx), std::move(dgamma), std::move(dbeta)};
}

}  // namespace tshard::nn
