// LayerNorm: layer normalisation over the last dim as a module, gamma and beta its parameters.
#pragma once
#include "tshard/nn/functional/layer_norm.hpp"
#include "tshard/nn/init.hpp"
#include "tshard/nn/module.hpp"
#include "tshard/tensor/factories.hpp"

namespace tshard::nn {

// A layer normalisation over the last dim with gamma (ones) and beta (zeros) of spec
// ParamSpec, rank 1 (replicated by default; S<"model"> where the hidden dim is split).
template <class T, class M, class ParamSpec = Spec<R>>
class LayerNorm : public Module {
  static_assert(tshard::detail::is_spec<ParamSpec>::value && ParamSpec::rank == 1,
                "tshard: LayerNorm's parameter spec is a rank-1 tshard::Spec<...> for gamma and beta [H]");
  static_assert(is_real_floating_v<T>, "tshard: LayerNorm's element type is float, double or bfloat16");
  static_assert(tshard::detail::specs_on_mesh<M, ParamSpec>(),
                "tshard: LayerNorm's specs split over a mesh axis this mesh lacks (its parameter spec)"
                ": give the mesh that axis (of size 1 where nothing splits over it) or pass specs of its own axes");

 public:
  using Param = ShardedTensor<T, M, ParamSpec>;

  LayerNorm(const M& mesh, Eigen::Index features, T eps = T(1e-5))
      : gamma_(own_parameter("weight", detail::constant_init<T, ParamSpec>(mesh, {features}, T(1)))),
        beta_(own_parameter("bias", zeros<T, ParamSpec>(mesh, {features}))),  // PyTorch's names
        eps_(eps) {
    streams_parameters_ = true;  // every use is bracketed by use()
  }

  // x normalised over its last dim, forward only (under ts::ad: layer_norm's custom VJP).
  template <tshard::detail::FloatingTensor X>
  auto operator()(const X& x) {
    auto in_use = use();
    return layer_norm<X::rank - 1>(x, gamma_, beta_, eps_);
  }

  Param& gamma() { return gamma_; }
  Param& beta() { return beta_; }
  // The gradients (complete: an owning optimizer finishes their data-parallel sum first).
  Param& gamma_grad() { return gradient_of(gamma_); }
  Param& beta_grad() { return gradient_of(beta_); }

 private:
  Param &gamma_, &beta_;  // in the module's parameter slots
  T eps_;
};

}  // namespace tshard::nn
