// RMSNorm: RMS normalisation over the last dim as a module, its weight the parameter (Llama's
// norm; HF's LlamaRMSNorm and PyTorch's nn.RMSNorm name it "weight").
#pragma once
#include "tshard/nn/functional/rms_norm.hpp"
#include "tshard/nn/init.hpp"
#include "tshard/nn/module.hpp"

namespace tshard::nn {

// x / sqrt(mean(x^2) + eps) * weight over the last dim; the weight [H] (ones) of spec ParamSpec,
// rank 1 (replicated by default; S<"model"> where the hidden dim is split). eps defaults to HF's.
template <class T, class M, class ParamSpec = Spec<R>>
class RMSNorm : public Module {
  static_assert(tshard::detail::is_spec<ParamSpec>::value && ParamSpec::rank == 1,
                "tshard: RMSNorm's parameter spec is a rank-1 tshard::Spec<...> for its weight [H]");
  static_assert(is_real_floating_v<T>, "tshard: RMSNorm's element type is float, double or bfloat16");
  static_assert(tshard::detail::specs_on_mesh<M, ParamSpec>(),
                "tshard: RMSNorm's specs split over a mesh axis this mesh lacks (its parameter spec)"
                ": give the mesh that axis (of size 1 where nothing splits over it) or pass specs of its own axes");

 public:
  using Param = ShardedTensor<T, M, ParamSpec>;

  RMSNorm(const M& mesh, Eigen::Index features, T eps = T(1e-6))
      : weight_(own_parameter("weight", detail::constant_init<T, ParamSpec>(mesh, {features}, T(1)))), eps_(eps) {
    streams_parameters_ = true;  // every use is bracketed by use()
  }

  // x normalised over its last dim, forward only (the gradient derived).
  template <tshard::detail::FloatingTensor X>
  auto operator()(const X& x) {
    auto in_use = use();
    return rms_norm<X::rank - 1>(x, weight_, eps_);
  }

  Param& weight() { return weight_; }
  // The gradient (complete: an owning optimizer finishes its data-parallel sum first).
  Param& weight_grad() { return gradient_of(weight_); }

 private:
  Param& weight_;  // in the module's parameter slot
  T eps_;
};

}  // namespace tshard::nn
