// BatchNorm: batch normalisation as a module, with running statistics for evaluation.
#pragma once
#include <cmath>

#include "tshard/nn/functional/batch_norm.hpp"
#include "tshard/nn/init.hpp"
#include "tshard/nn/module.hpp"
#include "tshard/reshard/reshard.hpp"
#include "tshard/tensor/factories.hpp"

namespace tshard::nn {

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
    return detail::constant_init<T, Spec<R>>(mesh, {n}, v);
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
