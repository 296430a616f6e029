// Linear<T, Mesh, WeightSpec>: y = x W + b with W [in, out] laid out as WeightSpec and b [out]
// laid out like W's dim 1. One class is data-, column- or row-parallel by annotation alone
// (GSPMD section 4; Megatron's column and row patterns): activations and gradients follow by
// propagation, and the weight gradient is resolved into the weight's layout.
#pragma once
#include <cmath>
#include <cstdint>
#include <memory>
#include <string>

#include "tshard/nn/init.hpp"
#include "tshard/nn/module.hpp"
#include "tshard/ops/einsum.hpp"
#include "tshard/ops/elementwise.hpp"
#include "tshard/ops/inplace.hpp"
#include "tshard/ops/reduce.hpp"
#include "tshard/tensor/factories.hpp"

namespace tshard::nn {
template <class T, class M, class WeightSpec>
class Linear : public Module {
  static_assert(tshard::detail::is_spec<WeightSpec>::value && WeightSpec::rank == 2,
                "tshard: Linear's weight spec is a rank-2 tshard::Spec<in, out>");
  static_assert(is_real_floating_v<T>, "tshard: Linear's element type is float, double or bfloat16");

 public:
  using BiasSpec = Spec<tshard::detail::dim_at_t<WeightSpec, 1>>;
  using Weight = ShardedTensor<T, M, WeightSpec>;
  using Bias = ShardedTensor<T, M, BiasSpec>;

  // Weights and bias uniform in [-1/sqrt(in), 1/sqrt(in)) as PyTorch's nn.Linear, drawn from
  // (seed, global index); gradients zero.
  Linear(const M& mesh, Eigen::Index in, Eigen::Index out, std::uint64_t seed, bool with_bias = true)
      : weight_(own_parameter("weight", detail::uniform_init<T, WeightSpec>(mesh, {in, out}, seed, 1.0 / std::sqrt(double(std::max<Eigen::Index>(in, 1)))))),
        bias_(own_parameter(with_bias ? "bias" : "", detail::uniform_init<T, BiasSpec>(mesh, {out}, seed ^ 0xB1A5ull, with_bias ? 1.0 / std::sqrt(double(std::max<Eigen::Index>(in, 1))) : 0.0))),
        weight_grad_(gradient_of(weight_)),
        bias_grad_(gradient_of(bias_)),
        with_bias_(with_bias) {
    streams_parameters_ = true;  // every forward and backward is bracketed by use()
  }

  Weight& weight() { return weight_; }
  Bias& bias() { return bias_; }
  Weight& weight_grad() { return weight_grad_; }
  Bias& bias_grad() { return bias_grad_; }
  const Weight& weight() const { return weight_; }
  const Bias& bias() const { return bias_; }
  bool has_bias() const { return with_bias_; }

  // f(parameter, gradient) for the weight, and the bias where the layer has one.
  template <class F>
  void for_each_parameter(F&& f) {
    f(weight_, weight_grad_);
    if (with_bias_) f(bias_, bias_grad_);
  }

  // x W + b for x [.., in] of rank 2 or 3; x is kept (shared, not copied) for backward.
  template <ShardedTensorType X>
  auto forward(const X& x_in) {
    tshard::detail::OperatorScope scope("linear");
    auto in_use = use();
    const auto& x = tshard::detail::resolved(x_in, "linear");
    check_input(x, "tshard::nn::Linear::forward");
    saved_.save(x);
    // The bias is added after a row-parallel product's partial is resolved, as in Megatron
    // (one result type whether the layer has a bias or not).
    auto product = times_weight(x);
    using Product = decltype(product);
    using Out = ShardedTensor<T, M, typename Product::SpecType>;
    if (with_bias_) {
      if constexpr (Product::is_partial) {
        return with_bias(std::move(product));
      } else {
        Out y(std::move(product));
        y += bias_;  // in place: no second output buffer
        return y;
      }
    }
    // Without bias no pass is spent adding zeros; a partial is resolved all the same.
    if constexpr (Product::is_partial)
      return tshard::detail::implicit_reshard<typename Product::SpecType>(product, "linear");
    else
      return Out(std::move(product));
  }

  // x W + b, forward only: under ts::ad its gradient is derived (two einsums and a sum), and
  // nothing is kept in the layer.
  template <ShardedTensorType X>
  auto operator()(const X& x) {
    tshard::detail::OperatorScope scope("linear");
    auto in_use = use();
    check_input(x, "tshard::nn::Linear");
    auto product = times_weight(x);
    using Out = ShardedTensor<T, M, typename decltype(product)::SpecType>;
    if (with_bias_) return with_bias(std::move(product));
    return tshard::detail::implicit_reshard<typename Out::SpecType>(product, "linear");
  }

  // dL/dx for dL/dy of the last forward; adds dL/dW and dL/db into weight_grad() and bias_grad()
  // (a partial over the batch's axes is resolved into their layout: the data-parallel sum).
  template <ShardedTensorType DY>
  auto backward(const DY& dy_in) {
    static_assert(DY::rank == 2 || DY::rank == 3, "tshard: Linear's output gradient is [B, out] or [B, T, out]");
    tshard::detail::OperatorScope scope("linear_backward");
    auto in_use = use();
    if (saved_.empty()) throw SpecError("tshard::nn::Linear::backward: no forward to take the gradient of");
    const auto& dy = tshard::detail::resolved(dy_in, "linear_backward");
    if (DY::rank != saved_.rank() ||
        tshard::detail::extents_of(dy)[DY::rank - 1] != tshard::detail::extents_of(weight_)[1])
      throw ShapeError("tshard::nn::Linear::backward: the gradient " + dy.describe() + " does not match the output of " +
                       "the last forward (weight " + weight_.describe() + ")");
    add_weight_grad(dy);
    if (with_bias_) detail::accumulate_gradient(bias_grad_, sum_leading_dims(dy), deferred_, "linear_backward");
    auto dx = [&] {
      if constexpr (DY::rank == 2)
        return einsum<"bo,io->bi">(dy, weight_);
      else
        return einsum<"bto,io->bti">(dy, weight_);
    }();
    gradients_ready();
    return dx;
  }

  void zero_grad() {
    detail::zero_fill(weight_grad_);
    detail::zero_fill(bias_grad_);
  }

 private:
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
  // x W for x [B, in] or [B, T, in].
  template <class X>
  auto times_weight(const X& x) {
    if constexpr (X::rank == 2)
      return einsum<"bi,io->bo">(x, weight_);
    else
      return einsum<"bti,io->bto">(x, weight_);
  }

  // weight_grad += x^T dy on descriptors: the saved input's type is a run-time fact here.
  template <class DY>
  void add_weight_grad(const DY& dy) {
    auto& mesh = *tshard::detail::state_of(weight_.mesh());
    const int rank = saved_.rank();
    const tshard::detail::SpecDesc saved_desc = saved_.desc();
    const tshard::detail::Extents saved_shape = saved_.extents();
    const T* saved = saved_.data();
    const auto e = rank == 2 ? tshard::detail::parse_einsum(FixedString("bi,bo->io"))
                                    : tshard::detail::parse_einsum(FixedString("bti,bto->io"));
    const auto decision = tshard::detail::decide_einsum(e, saved_desc, dy.spec_desc);
    const tshard::detail::SpecDesc out = tshard::detail::einsum_output_desc(e, decision, saved_desc, dy.spec_desc);
    const tshard::detail::Extents shape = tshard::detail::extents_of(weight_);
    const auto l = tshard::detail::shard_layout(out, shape, mesh.shape(), mesh.coords());
    if (!tshard::detail::TensorAccess::has_storage(weight_grad_) && deferred_ && !(Weight::spec_desc.split_axes() & deferred_) &&
        out.partial == tshard::detail::PartialKind::Sum && out.partial_axes == deferred_ && out.without_partial() == Weight::spec_desc) {
      // The first contribution after the owner's zero_grad(): the product is written straight
      // into the gradient's memory (the owner sums it over the data axis).
      tshard::detail::TensorAccess::acquire_storage(weight_grad_, false);
      tshard::detail::einsum_run<T>(mesh, e, decision, saved_desc, saved_shape, saved, dy.spec_desc,
                                    tshard::detail::extents_of(dy), dy.data(), out, shape, weight_grad_.data(),
                                    EinsumStrategy::Auto);
      return;
    }
    tshard::detail::Scratch<T> g(static_cast<std::size_t>(std::max<tshard::detail::Index>(l.padded_size(), 1)));
    tshard::detail::einsum_run<T>(mesh, e, decision, saved_desc, saved_shape, saved, dy.spec_desc,
                                  tshard::detail::extents_of(dy), dy.data(), out, shape, g.data(),
                                  EinsumStrategy::Auto);
    tshard::detail::TensorAccess::acquire_storage(weight_grad_, true);
    detail::accumulate_gradient(mesh, weight_grad_.data(), Weight::spec_desc, shape, g.data(), out, deferred_,
                                "linear_backward");
  }

  // In the module's parameter slots (registered as "weight" and "bias"): a moved layer keeps them.
  Weight& weight_;
  Bias& bias_;
  Weight& weight_grad_;
  Bias& bias_grad_;
  bool with_bias_ = true;
  detail::SavedActivation<T, M> saved_;
};

}  // namespace tshard::nn
