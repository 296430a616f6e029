// softmax and log_softmax over a dim that may be split, with their backward. Over a split dim
// the max and the sum are partials resolved by all-reduces of one value per row: nothing of
// the dim's size moves (Megatron's vocab-parallel softmax, GSPMD section 3.4).
// Under a gradient (ts::ad) each is one node whose rule is its backward (a custom VJP): the
// composite's max, sum and exp keep nothing on the tape.
#pragma once
#include "tshard/ad/custom_vjp.hpp"
#include "tshard/ops/elementwise.hpp"
#include "tshard/ops/reduce.hpp"

namespace tshard::nn {

template <int Dim, tshard::detail::FloatingTensor P, tshard::detail::FloatingTensor DP>
auto softmax_backward(const P& p, const DP& dp);
template <int Dim, tshard::detail::FloatingTensor LP, tshard::detail::FloatingTensor DLP>
auto log_softmax_backward(const LP& lp, const DLP& dlp);

template <int Dim, tshard::detail::FloatingTensor X>
auto softmax(const X& x) {
  constexpr bool valid = tshard::detail::dims_valid<X::rank, Dim>() && !is_complex_v<typename X::Scalar>;
  static_assert(tshard::detail::dims_valid<X::rank, Dim>(), "tshard: the softmax dim must be less than the tensor's rank");
  static_assert(!is_complex_v<typename X::Scalar>, "tshard: softmax takes real values");
  if constexpr (!valid) {
    return x;  // after the sentence above, no errors from the body
  } else {
    tshard::detail::OperatorScope scope("softmax");
    return ad::custom_vjp(
        [](const auto& v) {
          auto e = exp(v - max<Dim>(v, keep_dims));
          return e / sum<Dim>(e, keep_dims);
        },
        [](const auto& dp, const auto& p, const auto&) { return softmax_backward<Dim>(p, dp); }, x);
  }
}

// dL/dx given p = softmax(x) and dL/dp: p (dp - sum(p dp)).
template <int Dim, tshard::detail::FloatingTensor P, tshard::detail::FloatingTensor DP>
auto softmax_backward(const P& p, const DP& dp) {
  tshard::detail::OperatorScope scope("softmax_backward");
  return p * (dp - sum<Dim>(p * dp, keep_dims));
}

// x - max - log(sum(exp(x - max))) along Dim.
template <int Dim, tshard::detail::FloatingTensor X>
auto log_softmax(const X& x) {
  constexpr bool valid = tshard::detail::dims_valid<X::rank, Dim>() && !is_complex_v<typename X::Scalar>;
  static_assert(tshard::detail::dims_valid<X::rank, Dim>(), "tshard: the log_softmax dim must be less than the tensor's rank");
  static_assert(!is_complex_v<typename X::Scalar>, "tshard: log_softmax takes real values");
  if constexpr (!valid) {
    return x;  // after the sentence above, no errors from the body
  } else {
    tshard::detail::OperatorScope scope("log_softmax");
    return ad::custom_vjp(
        [](const auto& v) {
          auto z = v - max<Dim>(v, keep_dims);
          return z - log(sum<Dim>(exp(z), keep_dims));
        },
        [](const auto& dlp, const auto& lp, const auto&) { return log_softmax_backward<Dim>(lp, dlp); }, x);
  }
}

// dL/dx given lp = log_softmax(x) and dL/dlp: dlp - exp(lp) sum(dlp).
template <int Dim, tshard::detail::FloatingTensor LP, tshard::detail::FloatingTensor DLP>
auto log_softmax_backward(const LP& lp, const DLP& dlp) {
  tshard::detail::OperatorScope scope("log_softmax_backward");
  return dlp - exp(lp) * sum<Dim>(dlp, keep_dims);
}

}  // namespace tshard::nn
