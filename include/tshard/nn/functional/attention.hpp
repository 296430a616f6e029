// Causal multi-head attention with its backward, on time-major [T, B, Dh, H] tensors whose head
// dim H may be split (Megatron's attention by annotation: every head is local, so scores and
// softmax move nothing). The Attention layer is nn/layers/attention.hpp.
#pragma once
#include <cmath>
#include <cstdint>
#include <limits>
#include <memory>
#include <optional>
#include <vector>
#include <tuple>
#include <utility>

#include "tshard/ad/custom_vjp.hpp"
#include "tshard/nn/functional/softmax.hpp"
#include "tshard/ops/einsum.hpp"
#include "tshard/ops/reduce.hpp"

namespace tshard::nn {
namespace detail {

using tshard::detail::Index;

// Whether scores [T, S, B, H] hold whole rows on this rank (T and S not split): the fused
// kernels below then run; otherwise the generic masked softmax (partials over split dims).
template <class X>
inline constexpr bool whole_rows_v = X::spec_desc.dims[0].count == 0 && X::spec_desc.dims[1].count == 0;

// In place on a local block [T, S, B, H] (T, S whole): p = softmax over s of scale * x with s > t
// masked out. Three passes, each over contiguous (t, b) runs with per-row running max and sum.
template <class T>
void causal_softmax_kernel(T* x, const tshard::detail::ShardLayout& l, T scale) {
  const Index Tn = l.padded[0], S = l.padded[1], pB = l.padded[2], B = l.valid[2], H = l.valid[3];
  using A = accumulator_t<T>;  // (float for bfloat16)
  const A sc = A(scale);
  std::vector<A> m(static_cast<std::size_t>(Tn * pB)), z(m.size());
  for (Index h = 0; h < H; ++h) {
    T* xh = x + h * Tn * S * pB;
    std::fill(m.begin(), m.end(), -std::numeric_limits<A>::infinity());
    std::fill(z.begin(), z.end(), A(0));
    for (Index b = 0; b < B; ++b)
      for (Index s = 0; s < S; ++s) {
        T* row = xh + (s + S * b) * Tn;
        A* mb = m.data() + b * Tn;
        for (Index t = s; t < Tn; ++t) mb[t] = std::max(mb[t], sc * A(row[t]));
      }
    for (Index b = 0; b < B; ++b)
      for (Index s = 0; s < S; ++s) {
        T* row = xh + (s + S * b) * Tn;
        const A* mb = m.data() + b * Tn;
        A* zb = z.data() + b * Tn;
        for (Index t = 0; t < std::min(s, Tn); ++t) row[t] = T(0);
        for (Index t = s; t < Tn; ++t) {
          const A e = std::exp(sc * A(row[t]) - mb[t]);
          row[t] = T(e);
          zb[t] += e;
        }
      }
    for (auto& v : z) v = A(1) / v;
    for (Index b = 0; b < B; ++b)
      for (Index s = 0; s < S; ++s) {
        T* row = xh + (s + S * b) * Tn;
        const A* zb = z.data() + b * Tn;
        for (Index t = s; t < Tn; ++t) row[t] = T(A(row[t]) * zb[t]);
      }
  }
}

// In place on dp [T, S, B, H] (T, S whole): ds = scale * p (dp - sum_s p dp).
template <class T>
void causal_softmax_backward_kernel(const T* p, T* dp, const tshard::detail::ShardLayout& l, T scale) {
  const Index Tn = l.padded[0], S = l.padded[1], pB = l.padded[2], B = l.valid[2], H = l.valid[3];
  using A = accumulator_t<T>;  // (float for bfloat16)
  const A sc = A(scale);
  std::vector<A> r(static_cast<std::size_t>(Tn * pB));
  for (Index h = 0; h < H; ++h) {
    const Index base = h * Tn * S * pB;
    std::fill(r.begin(), r.end(), A(0));
    for (Index b = 0; b < B; ++b)
      for (Index s = 0; s < S; ++s) {
        const Index row = base + (s + S * b) * Tn;
        A* rb = r.data() + b * Tn;
        for (Index t = s; t < Tn; ++t) rb[t] += A(p[row + t]) * A(dp[row + t]);
      }
    for (Index b = 0; b < B; ++b)
      for (Index s = 0; s < S; ++s) {
        const Index row = base + (s + S * b) * Tn;
        const A* rb = r.data() + b * Tn;
        for (Index t = 0; t < std::min(s, Tn); ++t) dp[row + t] = T(0);
        for (Index t = s; t < Tn; ++t) dp[row + t] = T(sc * A(p[row + t]) * (A(dp[row + t]) - rb[t]));
      }
  }
}

// scores(t, s, b, h) = -inf where s > t (a position sees itself and the past only).
template <class X>
void mask_future(X& scores) {
  using T = typename X::Scalar;
  T* d = scores.data();
  tshard::detail::for_each_local<X::rank>(tshard::detail::layout_of(scores),
                                          [&](const auto& g, tshard::detail::Index lin) {
                                            if (g[1] > g[0]) d[lin] = -std::numeric_limits<T>::infinity();
                                          });
}

template <class Q>
typename Q::Scalar attention_scale(const Q& q) {
  using T = typename Q::Scalar;
  using A = accumulator_t<T>;
  return T(A(1) / std::sqrt(A(std::max<Eigen::Index>(tshard::detail::extents_of(q)[2], 1))));
}

// A typed einsum result resolved (a partial where its contracted dim was split).
template <class X>
auto resolved_value(X&& x) {
  using Raw = std::remove_cvref_t<X>;
  using Out = ShardedTensor<typename Raw::Scalar, typename Raw::MeshT, typename Raw::SpecType>;
  if constexpr (Raw::is_partial)
    return tshard::detail::implicit_reshard<typename Raw::SpecType>(x, "attention");
  else
    return Out(std::forward<X>(x));
}

}  // namespace detail

// softmax(q k^T / sqrt(Dh) + causal mask) v for q, k, v [T, B, Dh, H] (time-major, as Megatron
// lays attention out: every product then reads its operands in place): returns the context
// [T, B, Dh, H] and the probabilities [T, S, B, H] (kept for backward). Any dim may be split;
// with T whole (the usual layouts) the mask and softmax are one fused local kernel.
template <tshard::detail::FloatingTensor Q, tshard::detail::FloatingTensor K, tshard::detail::FloatingTensor V>
auto causal_attention(const Q& q, const K& k, const V& v) {
  static_assert(Q::rank == 4 && K::rank == 4 && V::rank == 4, "tshard: causal_attention takes q, k, v [T, B, Dh, H]");
  tshard::detail::OperatorScope scope("attention");
  if (tshard::detail::extents_of(q) != tshard::detail::extents_of(k) ||
      tshard::detail::extents_of(q) != tshard::detail::extents_of(v))
    throw ShapeError("tshard::nn::causal_attention: q " + q.describe() + ", k " + k.describe() + " and v " + v.describe() +
                     " differ in shape");
  auto scores = detail::resolved_value(einsum<"tbkh,sbkh->tsbh">(q, k));
  using Scores = decltype(scores);
  const auto scale = detail::attention_scale(q);
  if constexpr (detail::whole_rows_v<Scores>) {
    // The fused kernel overwrites the scores: under a gradient (q, k or v tracked) the recorded
    // operators below run instead (nn::attention takes its fused backward as a custom VJP).
    if (!tshard::detail::recording(q, k, v)) {
      detail::causal_softmax_kernel(scores.data(), tshard::detail::layout_of(scores), scale);
      auto context = einsum<"tsbh,sbkh->tbkh">(scores, v);
      return std::pair{std::move(context), std::move(scores)};
    }
  }
  scores *= scale;
  detail::mask_future(scores);  // (a masked score's gradient is zero: softmax's output there is)
  Scores p = softmax<1>(scores);
  auto context = einsum<"tsbh,sbkh->tbkh">(p, v);
  return std::pair{std::move(context), std::move(p)};
}

// dq, dk, dv given q, k, v [T, B, Dh, H], the forward's probabilities p [T, S, B, H] and
// dL/dcontext.
template <tshard::detail::FloatingTensor Q, tshard::detail::FloatingTensor K, tshard::detail::FloatingTensor V,
          tshard::detail::FloatingTensor P, tshard::detail::FloatingTensor DC>
auto causal_attention_backward(const Q& q, const K& k, const V& v, const P& p, const DC& dcontext) {
  static_assert(Q::rank == 4 && P::rank == 4 && DC::rank == 4, "tshard: causal_attention_backward takes [T, B, Dh, H] tensors");
  tshard::detail::OperatorScope scope("attention_backward");
  tshard::detail::refuse_tracked("nn::causal_attention_backward", tshard::detail::kNoSecondOrder, q, k, v, p, dcontext);
  const auto scale = detail::attention_scale(q);
  auto dp = detail::resolved_value(einsum<"tbkh,sbkh->tsbh">(dcontext, v));
  auto dv = einsum<"tsbh,tbkh->sbkh">(p, dcontext);
  auto ds = [&] {
    using DP = decltype(dp);
    if constexpr (detail::whole_rows_v<DP> && std::is_same_v<typename P::SpecType, typename DP::SpecType> && !P::is_partial) {
      detail::causal_softmax_backward_kernel(p.data(), dp.data(), tshard::detail::layout_of(dp), scale);
      return std::move(dp);
    } else {
      return softmax_backward<1>(p, dp) * scale;  // zero where masked: p is 0 there
    }
  }();
  auto dq = einsum<"tsbh,sbkh->tbkh">(ds, k);
  auto dk = einsum<"tsbh,tbkh->sbkh">(ds, q);
  return std::tuple{std::move(dq), std::move(dk), std::move(dv)};
}

// The context of causal attention alone, for model code under ts::ad: one node whose rule is
// causal_attention_backward (the probabilities the forward computed are kept for it, as the
// hand-written layer keeps them). q, k, v [T, B, Dh, H], time-major.
template <tshard::detail::FloatingTensor Q, tshard::detail::FloatingTensor K, tshard::detail::FloatingTensor V>
auto attention(const Q& q, const K& k, const V& v) {
  using P = decltype(causal_attention(q, k, v).second);
  auto probabilities = std::make_shared<std::optional<P>>();
  return ad::custom_vjp(
      [probabilities](const auto& qv, const auto& kv, const auto& vv) {
        auto [context, p] = causal_attention(qv, kv, vv);
        *probabilities = std::move(p);
        return context;
      },
      [probabilities](const auto& dcontext, const auto&, const auto& qv, const auto& kv, const auto& vv) {
        auto grads = causal_attention_backward(qv, kv, vv, **probabilities, dcontext);
        probabilities->reset();
        return grads;
      },
      q, k, v);
}

}  // namespace tshard::nn
