// Layout plans: the specs a model's layers take, as one struct, so a model is data-, tensor- or
// expert-parallel by naming a plan (Megatron-LM's tensor parallelism, Shoeybi et al. 2019).
#pragma once
#include "tshard/core/fixed_string.hpp"
#include "tshard/core/spec.hpp"

namespace tshard::parallel {

// The parameter specs of a block, Megatron's pattern over the mesh axis Model: Wq, Wk, Wv [D, Dh,
// H] and Wo [Dh, H, D] split over the heads, W1 [D, F] over its columns, W2 [F, D] over its
// rows, layer norms replicated. Any struct with these five names works.
template <FixedString Model = "model">
struct MegatronSpecs {
  static constexpr auto model_axis = Model;   // splits the experts' hidden dim (MoE blocks)
  static constexpr FixedString expert_axis = "data";  // splits the experts and the token groups
  using qkv = Spec<R, R, S<Model>>;
  using attention_out = Spec<R, S<Model>, R>;
  using mlp_in = Spec<R, S<Model>>;
  using mlp_out = Spec<S<Model>, R>;
  using norm = Spec<R>;
};

// Megatron's sequence parallelism (Korthikanti et al. 2022): the same weights, with the residual
// stream's tokens split over Model too (and its batch over Batch, where named), so layer norms,
// dropout and residual sums work on 1/Model of the tokens. Each attention and MLP all-gathers its
// input's tokens and reduce-scatters its output into them: the bytes of the two all-reduces
// tensor parallelism makes, in four collectives.
template <FixedString Model = "model", FixedString... Batch>
struct MegatronSequenceParallelSpecs : MegatronSpecs<Model> {
  static_assert(sizeof...(Batch) <= 1, "tshard: MegatronSequenceParallelSpecs<Model, Batch> names at most one batch axis");
  using activation = Spec<std::conditional_t<sizeof...(Batch) == 0, R, S<Batch...>>, S<Model>, R>;
};

}  // namespace tshard::parallel

namespace tshard::nn {
using parallel::MegatronSequenceParallelSpecs;
using parallel::MegatronSpecs;
}  // namespace tshard::nn
