// Layer normalisation over the last dim (which may be split: its mean and variance are partials
// resolved over one value per row), with its backward (Ba, Kiros, Hinton 2016).
#pragma once
#include <cmath>
#include <tuple>
#include <utility>

#include "tshard/nn/module.hpp"
#include "tshard/ops/elementwise.hpp"
#include "tshard/tensor/factories.hpp"
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

// A layer normalisation over the last dim with gamma (ones) and beta (zeros) of spec
// ParamSpec, rank 1 (replicated by default; S<"model"> where the hidden dim is split).
template <class T, class M, class ParamSpec = Spec<R>>
class LayerNorm : public Module {
  static_assert(tshard::detail::is_spec<ParamSpec>::value && ParamSpec::rank == 1,
                "tshard: LayerNorm's parameter spec is a rank-1 tshard::Spec<...> for gamma and beta [H]");
  static_assert(std::is_floating_point_v<T>, "tshard: LayerNorm's element type is float or double");

 public:
  using Param = ShardedTensor<T, M, ParamSpec>;

  LayerNorm(const M& mesh, Eigen::Index features, T eps = T(1e-5))
      : mesh_(mesh),
        gamma_(from_function<T, ParamSpec>(mesh, {features}, [](const auto&) { return T(1); })),
        beta_(zeros<T, ParamSpec>(mesh, {features})),
        gamma_grad_(zeros<T, ParamSpec>(mesh, {features})),
        beta_grad_(zeros<T, ParamSpec>(mesh, {features})),
        eps_(eps) {}

  Param& gamma() { return gamma_; }
  Param& beta() { return beta_; }
  Param& gamma_grad() { return gamma_grad_; }
  Param& beta_grad() { return beta_grad_; }

  template <class F>
  void for_each_parameter(F&& f) {
    f(gamma_, gamma_grad_);
    f(beta_, beta_grad_);
  }

  // x of any rank normalised over its last dim; x is kept (shared) for backward.
  template <tshard::detail::FloatingTensor X>
  auto forward(const X& x_in) {
    tshard::detail::OperatorScope scope("layer_norm");
    auto in_use = use();
    const auto& x = tshard::detail::resolved(x_in, "layer_norm");
    saved_.save(x);
    return layer_norm<X::rank - 1>(x, gamma_, beta_, eps_);
  }

  // dL/dx for dL/dy of the last forward; adds into gamma_grad() and beta_grad().
  template <tshard::detail::FloatingTensor DY>
  auto backward(const DY& dy_in) {
    tshard::detail::OperatorScope scope("layer_norm_backward");
    auto in_use = use();
    const auto& dy = tshard::detail::resolved(dy_in, "layer_norm_backward");
    const auto x = saved_.template as<typename DY::SpecType>(mesh_, "LayerNorm::backward");
    auto [dx, dgamma, dbeta] = layer_norm_backward<DY::rank - 1>(x, gamma_, dy, eps_);
    detail::accumulate_gradient(gamma_grad_, dgamma, deferred_, "layer_norm_backward");
    detail::accumulate_gradient(beta_grad_, dbeta, deferred_, "layer_norm_backward");
    gradients_ready();
    return std::move(dx);
  }

  void zero_grad() {
    detail::zero_fill(gamma_grad_);
    detail::zero_fill(beta_grad_);
  }

 private:
  M mesh_;
  Param gamma_, beta_, gamma_grad_, beta_grad_;
  T eps_;
  detail::SavedActivation<T, M> saved_;
};

}  // namespace tshard::nn
