// Linear<T, Mesh, WeightSpec, OutSpec>: y = x W + b with W [in, out] laid out as WeightSpec and b
// [out] laid out like W's dim 1. One class is data-, column- or row-parallel by annotation alone
// (GSPMD section 4; Megatron's column and row patterns): activations and gradients follow by
// propagation, and the weight gradient is resolved into the weight's layout. A pinned OutSpec
// fixes the output's layout too (Megatron's sequence parallelism: a column-parallel layer
// all-gathers its tokens, a row-parallel one reduce-scatters its partial into them).
#pragma once
#include <cstdint>
#include <memory>
#include <string>

#include "tshard/nn/init.hpp"
#include "tshard/nn/layers/pinned_activations.hpp"
#include "tshard/nn/module.hpp"
#include "tshard/ops/einsum.hpp"
#include "tshard/ops/elementwise.hpp"
#include "tshard/ops/inplace.hpp"
#include "tshard/ops/reduce.hpp"
#include "tshard/tensor/factories.hpp"

namespace tshard::nn {
template <class T, class M, class WeightSpec, class OutSpec = Deduced>
class Linear : public Module {
  static_assert(tshard::detail::is_spec<WeightSpec>::value && WeightSpec::rank == 2,
                "tshard: Linear's weight spec is a rank-2 tshard::Spec<in, out>");
  static_assert(tshard::detail::is_deduced<OutSpec> || tshard::detail::pinned_rank<OutSpec>() == 2 ||
                    tshard::detail::pinned_rank<OutSpec>() == 3,
                "tshard: Linear's output spec is tshard::Deduced or a Spec of rank 2 ([B, out]) or 3 ([B, T, out])");
  static_assert(is_real_floating_v<T>, "tshard: Linear's element type is float, double or bfloat16");
  static_assert(tshard::detail::specs_on_mesh<M, WeightSpec, OutSpec>(),
                "tshard: Linear's specs split over a mesh axis this mesh lacks (its weight spec or output spec)"
                ": give the mesh that axis (of size 1 where nothing splits over it) or pass specs of its own axes");

 public:
  using BiasSpec = Spec<tshard::detail::dim_at_t<WeightSpec, 1>>;
  using Weight = ShardedTensor<T, M, WeightSpec>;
  using Bias = ShardedTensor<T, M, BiasSpec>;

  // Weights and bias uniform in [-1/sqrt(in), 1/sqrt(in)) as PyTorch's nn.Linear, drawn from
  // (seed, global index); gradients zero.
  Linear(const M& mesh, Eigen::Index in, Eigen::Index out, std::uint64_t seed, bool with_bias = true)
      : weight_(own_parameter("weight", detail::uniform_init<T, WeightSpec>(mesh, {in, out}, seed, init::default_bound(in)))),
        bias_(own_parameter(with_bias ? "bias" : "", detail::uniform_init<T, BiasSpec>(mesh, {out}, seed ^ 0xB1A5ull, with_bias ? init::default_bound(in) : 0.0))),
        with_bias_(with_bias) {
    streams_parameters_ = true;  // every use is bracketed by use()
  }

  Weight& weight() { return weight_; }
  Bias& bias() { return bias_; }
  // The gradients (complete: an owning optimizer finishes their data-parallel sum first).
  Weight& weight_grad() { return gradient_of(weight_); }
  Bias& bias_grad() { return gradient_of(bias_); }
  const Weight& weight() const { return weight_; }
  const Bias& bias() const { return bias_; }
  bool has_bias() const { return with_bias_; }

  // x W + b for x [.., in] of rank 2 or 3, forward only: under ts::ad its gradient is derived
  // (two einsums and a sum). A row-parallel product's partial is resolved before the bias, as in
  // Megatron (one result type whether the layer has a bias or not). With OutSpec pinned, the
  // input first takes the layout whose product lands there (OutSpec's leading dims, whole where
  // they would share an axis with the weight), and the product is moved into OutSpec,
  // a partial by reduce-scatter where OutSpec splits.
  template <ShardedTensorType X>
  auto operator()(const X& x) {
    tshard::detail::OperatorScope scope("linear");
    auto in_use = use();
    check_input(x, "tshard::nn::Linear");
    if constexpr (!tshard::detail::is_deduced<OutSpec>) {
      static_assert(OutSpec::rank == X::rank, "tshard: Linear's pinned output spec has the rank of its input");
      auto product = times_weight<OutSpec>(detail::input_for_pinned<OutSpec, WeightSpec>(x));
      if (!with_bias_) return product;
      return detail::biased_as<OutSpec>(product, bias_);
    } else {
      return deduced(x);
    }
  }

 private:
  template <class X>
  auto deduced(const X& x) {
    auto product = times_weight(x);
    using Out = ShardedTensor<T, M, typename decltype(product)::SpecType>;
    if (with_bias_) return with_bias(std::move(product));
    return tshard::detail::implicit_reshard<typename Out::SpecType>(product, "linear");
  }

  // product + b in the product's spec. Where the partial resolved and the bias's split give
  // another layout (an input split over the weight's output axis: its contraction is a partial
  // over it), the sum is moved back into it.
  template <class P>
  auto with_bias(P&& product) {
    using Out = ShardedTensor<T, M, typename std::remove_cvref_t<P>::SpecType>;
    using Sum = std::remove_cvref_t<decltype(std::forward<P>(product) + bias_)>;
    if constexpr (std::is_same_v<Sum, Out>)
      return Out(std::forward<P>(product) + bias_);
    else
      return tshard::detail::implicit_reshard<typename Out::SpecType>(std::forward<P>(product) + bias_, "linear");
  }

  template <class X>
  void check_input(const X& x, const char* op) const {
    static_assert(X::rank == 2 || X::rank == 3, "tshard: Linear takes inputs [B, in] or [B, T, in]");
    static_assert(std::is_same_v<typename X::Scalar, T>, "tshard: Linear's input has the layer's element type");
    if (tshard::detail::extents_of(x)[X::rank - 1] != tshard::detail::extents_of(weight_)[0])
      throw ShapeError(std::string(op) + ": the input " + x.describe() + " does not end in the weight's " +
                       std::to_string(tshard::detail::extents_of(weight_)[0]) + " input features (weight " +
                       weight_.describe() + ")");
  }
  // x W for x [B, in] or [B, T, in], in the layout propagation gives or in Pinned.
  template <class Pinned = Deduced, class X>
  auto times_weight(const X& x) {
    if constexpr (!tshard::detail::is_deduced<Pinned>) {
      if constexpr (X::rank == 2)
        return einsum<"bi,io->bo", Pinned>(x, weight_);
      else
        return einsum<"bti,io->bto", Pinned>(x, weight_);
    } else if constexpr (X::rank == 2) {
      return einsum<"bi,io->bo">(x, weight_);
    } else {
      return einsum<"bti,io->bto">(x, weight_);
    }
  }

  // In the module's parameter slots (registered as "weight" and "bias"): a moved layer keeps them.
  Weight& weight_;
  Bias& bias_;
  bool with_bias_ = true;
};

}  // namespace tshard::nn
