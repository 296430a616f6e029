// MLP: x [.., D] -> fc2(gelu(fc1(x))), two Linear layers whose specs make it Megatron's MLP by
// default (the hidden dim split over "model": one all-reduce forward, one backward).
#pragma once
#include <cstdint>

#include "tshard/nn/functional/activations.hpp"
#include "tshard/nn/layers/linear.hpp"
#include "tshard/nn/module.hpp"

namespace tshard::nn {

// x [.., D] -> fc2(gelu(fc1(x))) with fc1 [D, F] laid out as InSpec and fc2 [F, D] as OutSpec.
// ActSpec pins the layout of x and of the output (tokens split over the weights' axis: Megatron's
// sequence parallelism, an all-gather before fc1 and a reduce-scatter after fc2); the hidden
// activations then keep ActSpec's leading dims where they do not share fc1's axes.
template <class T, class M, class InSpec = Spec<R, S<"model">>, class OutSpec = Spec<S<"model">, R>,
          class ActSpec = Deduced>
class MLP : public Module {
  static_assert(tshard::detail::specs_on_mesh<M, InSpec, OutSpec, ActSpec>(),
                "tshard: MLP's specs split over a mesh axis this mesh lacks (the defaults split the hidden dim over \"model\")"
                ": give the mesh that axis (of size 1 where nothing splits over it) or pass specs of its own axes");
  static auto hidden_spec() {
    if constexpr (tshard::detail::is_deduced<ActSpec>)
      return std::type_identity<Deduced>{};
    else
      return std::type_identity<tshard::detail::leading_dims_then_t<ActSpec, InSpec, tshard::detail::dim_at_t<InSpec, 1>>>{};
  }

 public:
  using Fc1 = Linear<T, M, InSpec, typename decltype(hidden_spec())::type>;
  using Fc2 = Linear<T, M, OutSpec, ActSpec>;

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

  Fc1& fc1() { return fc1_; }
  Fc2& fc2() { return fc2_; }

 private:
  Fc1 fc1_;
  Fc2 fc2_;
};

}  // namespace tshard::nn
