// Batch normalisation (Ioffe and Szegedy 2015) of a tensor split anywhere: statistics over every
// dim but Dim, summed across every mesh axis that splits those dims, so a batch split over
// "data" and an image split over space normalise with the statistics of the whole global batch
// (the cross-replica batch norm of the MLPerf TPU work). Written with tshard's differentiable
// operators: the sums are sharded reductions whose partials are resolved once, and the gradient
// is derived. BatchNorm is the module: gamma, beta, and running statistics for evaluation.
#pragma once
#include <cmath>
#include <string>
#include <utility>

#include "tshard/ad/ad.hpp"
#include "tshard/nn/module.hpp"
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

// The layer: gamma (ones) and beta (zeros) [C] replicated, and running mean and (unbiased)
// variance updated with `momentum` in training, as PyTorch's BatchNorm: train() normalises with
// the batch's statistics, eval() with the running ones. The running statistics are buffers
// ("running_mean", "running_var", PyTorch's names): in the state dict and in checkpoints, never
// in the optimizer.
template <class T, class M, int Dim = 1>
class BatchNorm : public Module {
 public:
  using Vector = ShardedTensor<T, M, Spec<R>>;
  BatchNorm(const M& mesh, Eigen::Index channels, double momentum = 0.1, T eps = T(1e-5))
      : gamma_(register_parameter("weight", constant(mesh, channels, T(1)))),
        beta_(register_parameter("bias", constant(mesh, channels, T(0)))),
        running_mean_(register_buffer("running_mean", constant(mesh, channels, T(0)))),
        running_var_(register_buffer("running_var", constant(mesh, channels, T(1)))),
        momentum_(momentum),
        eps_(eps) {}

  Vector& weight() { return gamma_; }
  Vector& bias() { return beta_; }
  const Vector& running_mean() const { return running_mean_; }
  const Vector& running_var() const { return running_var_; }

  template <tshard::detail::FloatingTensor X>
  auto operator()(const X& x) {
    static_assert(X::rank >= 2 && Dim < X::rank, "tshard: BatchNorm's Dim is a dim of x");
    constexpr int Trailing = X::rank - 1 - Dim;
    if (!is_training()) {  // the running statistics, as constants
      auto scale = detail::per_channel<Trailing>(gamma_ / tshard::sqrt(running_var_ + eps_));
      auto shift = detail::per_channel<Trailing>(beta_ - running_mean_ * (gamma_ / tshard::sqrt(running_var_ + eps_)));
      return x * scale + shift;
    }
    {  // the batch's statistics, untracked, into the running ones
      X plain = x;  // a copy off the tape
      tshard::detail::TensorAccess::set_node(plain, nullptr);
      const double count = double(tshard::detail::volume(tshard::detail::extents_of(plain), X::rank)) /
                           double(tshard::detail::extents_of(plain)[Dim]);
      auto mean = sum_all_but(plain, std::make_integer_sequence<int, X::rank - 1>{}) * T(1 / count);
      auto centred = plain - detail::per_channel<Trailing>(reshard<Spec<R>>(mean));
      auto var = sum_all_but(centred * centred, std::make_integer_sequence<int, X::rank - 1>{}) * T(1 / std::max(count - 1, 1.0));
      running_mean_ = reshard<Spec<R>>(running_mean_ * T(1 - momentum_) + reshard<Spec<R>>(mean) * T(momentum_));
      running_var_ = reshard<Spec<R>>(running_var_ * T(1 - momentum_) + reshard<Spec<R>>(var) * T(momentum_));
    }
    return batch_norm<Dim>(x, gamma_, beta_, eps_);
  }

 private:
  static Vector constant(const M& mesh, Eigen::Index n, T v) {
    return from_function<T, Spec<R>>(mesh, {n}, [v](const auto&) { return v; });
  }
  template <class X, int... I>
  static auto sum_all_but(const X& x, std::integer_sequence<int, I...>) {
    return tshard::sum<(I < Dim ? I : I + 1)...>(x);
  }

  Vector& gamma_;
  Vector& beta_;
  Vector &running_mean_, &running_var_;  // in the module's buffers
  double momentum_;
  T eps_;
};

}  // namespace tshard::nn
