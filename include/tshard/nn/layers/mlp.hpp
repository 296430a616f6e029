// MLP: x [.., D] -> fc2(gelu(fc1(x))), two Linear layers whose specs make it Megatron's MLP by
// default (the hidden dim split over "model": one all-reduce forward, one backward).
#pragma once
#include <cstdint>

#include "tshard/nn/functional/activations.hpp"
#include "tshard/nn/layers/linear.hpp"
#include "tshard/nn/module.hpp"

namespace tshard::nn {

// x [.., D] -> fc2(gelu(fc1(x))) with fc1 [D, F] laid out as InSpec and fc2 [F, D] as OutSpec.
template <class T, class M, class InSpec = Spec<R, S<"model">>, class OutSpec = Spec<S<"model">, R>>
class MLP : public Module {
 public:
  MLP(const M& mesh, Eigen::Index dmodel, Eigen::Index hidden, std::uint64_t seed)
      : fc1_(mesh, dmodel, hidden, seed), fc2_(mesh, hidden, dmodel, seed + 1) {
    register_module("fc1", fc1_);
    register_module("fc2", fc2_);
  }

  // fc2(gelu(fc1(x))), forward only (derived gradients).
  template <tshard::detail::FloatingTensor X>
  auto operator()(const X& x) {
    tshard::detail::OperatorScope scope("mlp");
    auto in_use = use();
    return fc2_(gelu(fc1_(x)));
  }

  Linear<T, M, InSpec>& fc1() { return fc1_; }
  Linear<T, M, OutSpec>& fc2() { return fc2_; }

 private:
  Linear<T, M, InSpec> fc1_;
  Linear<T, M, OutSpec> fc2_;
};

}  // namespace tshard::nn
