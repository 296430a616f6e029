// RMS normalisation (Zhang & Sennrich 2019; Llama's, as HF's LlamaRMSNorm and PyTorch's
// F.rms_norm): x / sqrt(mean(x^2) + eps) * weight over the last dim, differentiable as the
// operators it is written with (a split last dim: its mean a partial sum, resolved).
#pragma once
#include "tshard/ops/elementwise.hpp"
#include "tshard/ops/reduce.hpp"

namespace tshard::nn {

template <int Dim, tshard::detail::FloatingTensor X, tshard::detail::FloatingTensor W>
auto rms_norm(const X& x, const W& weight, typename X::Scalar eps) {
  static_assert(Dim == X::rank - 1, "tshard: rms_norm normalises the last dim (the weight aligns with it)");
  static_assert(W::rank == 1, "tshard: rms_norm's weight is a rank-1 tensor [H]");
  using T = typename X::Scalar;
  tshard::detail::OperatorScope scope("rms_norm");
  return x * (T(1) / sqrt(mean<Dim>(x * x, keep_dims) + eps)) * weight;
}

}  // namespace tshard::nn
