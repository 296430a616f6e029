// GShard's top-2 gating (Lepikhin et al., arXiv 2006.16668, algorithm 1) on one rank's whole
// groups of logits, and its backward: the kernels under MoE's gate (nn/layers/moe.hpp).
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "tshard/nn/layers/moe_dispatch.hpp"
#include "tshard/tensor/factories.hpp"

namespace tshard::nn {

// What a forward's routing decided, summed over the whole input (every rank agrees).
struct RoutingStats {
  std::int64_t assignments = 0;  // (token, expert) pairs chosen by the gate: top-1 plus routed top-2
  std::int64_t dropped = 0;      // of those, over capacity
  double aux_loss = 0;           // GShard's l_aux of this input (1 when perfectly balanced)
};

namespace detail {

// GShard's top-2 gating on this rank's whole groups of logits [Gp, S, E] (local, column-major;
// rows g < groups valid): fills combine [Gp, S, E, C] (GShard's dispatch mask is its nonzero
// pattern; the layer dispatches by the routes), the probabilities and routes, and returns the
// sum over the groups of E * sum_e density_e * mean-gate_e.
template <class T>
double top2_gating(const T* logits, Index gp, Index groups, Index s_len, Index experts, Index capacity,
                   bool random_routing, std::uint64_t seed, Index first_group, Index row_offset, Index rows_total,
                   T* combine, T* probs, Route* routes, T* density, RoutingStats& stats) {
  const Index plane = gp * s_len;  // stride of e in [Gp, S, E]
  const Index slot = plane * experts;  // stride of c in [Gp, S, E, C]
  std::fill(combine, combine + slot * capacity, T(0));
  double aux = 0;
  std::vector<Index> count1(static_cast<std::size_t>(experts)), count2(static_cast<std::size_t>(experts));
  std::vector<double> mean_gate(static_cast<std::size_t>(experts));
  std::vector<double> w2(static_cast<std::size_t>(s_len));
  for (Index g = 0; g < groups; ++g) {
    std::fill(count1.begin(), count1.end(), 0);
    std::fill(count2.begin(), count2.end(), 0);
    std::fill(mean_gate.begin(), mean_gate.end(), 0.0);
    for (Index s = 0; s < s_len; ++s) {
      const Index at = g + gp * s;
      double top = -INFINITY;
      for (Index e = 0; e < experts; ++e) top = std::max(top, double(logits[at + plane * e]));
      double z = 0;
      for (Index e = 0; e < experts; ++e) z += std::exp(double(logits[at + plane * e]) - top);
      Index e1 = 0, e2 = -1;
      for (Index e = 0; e < experts; ++e) {
        probs[at + plane * e] = T(std::exp(double(logits[at + plane * e]) - top) / z);
        mean_gate[std::size_t(e)] += double(probs[at + plane * e]);
        if (probs[at + plane * e] > probs[at + plane * e1]) e1 = e;
      }
      for (Index e = 0; e < experts; ++e)
        if (e != e1 && (e2 < 0 || probs[at + plane * e] > probs[at + plane * e2])) e2 = e;
      if (e2 < 0) e2 = e1;  // one expert: no second choice
      Route& r = routes[at];
      r = Route{std::int32_t(e1), std::int32_t(e2), -1, -1};
      // Top-1 positions in token order; over capacity the token is dropped by that expert.
      const Index pos = count1[std::size_t(e1)]++;
      if (pos < capacity) r.c1 = std::int32_t(pos);
      const double p1 = probs[at + plane * e1], p2 = e2 != e1 ? double(probs[at + plane * e2]) : 0.0;
      w2[std::size_t(s)] = p2 / (p1 + p2);
    }
    // Top-2 positions follow the top-1 tokens each expert kept.
    for (Index s = 0; s < s_len; ++s) {
      const Index at = g + gp * s;
      Route& r = routes[at];
      if (r.e2 == r.e1) continue;
      if (random_routing) {
        const std::uint64_t token = std::uint64_t(first_group + g + row_offset) + std::uint64_t(rows_total) * std::uint64_t(s);
        if (tshard::detail::random_value<double>(seed, token) >= 2 * w2[std::size_t(s)]) continue;
      }
      ++stats.assignments;
      const Index pos = std::min(count1[std::size_t(r.e2)], capacity) + count2[std::size_t(r.e2)]++;
      if (pos < capacity) r.c2 = std::int32_t(pos);
      else ++stats.dropped;
    }
    double group_aux = 0;
    for (Index e = 0; e < experts; ++e) {
      const double d = double(count1[std::size_t(e)]) / double(s_len);
      density[g + gp * e] = T(d);
      group_aux += d * mean_gate[std::size_t(e)] / double(s_len);
    }
    aux += double(experts) * group_aux;
    for (Index s = 0; s < s_len; ++s) {
      const Index at = g + gp * s;
      const Route& r = routes[at];
      ++stats.assignments;
      if (r.c1 < 0) ++stats.dropped;
      const double p1 = probs[at + plane * r.e1], p2 = r.e2 != r.e1 ? double(probs[at + plane * r.e2]) : 0.0;
      if (r.c1 >= 0) combine[at + plane * r.e1 + slot * r.c1] = T(p1 / (p1 + p2));
      if (r.c2 >= 0) combine[at + plane * r.e2 + slot * r.c2] = T(p2 / (p1 + p2));
    }
  }
  return aux;
}

// d logits [Gp, S, E] from d combine [Gp, S, E, C] (through the normalised top-2 gates and the
// softmax) plus `aux_grad` times the auxiliary loss's gradient (d l_aux / d p = E density / S).
template <class T>
void top2_gating_backward(const T* dcombine, const T* probs, const Route* routes, const T* density, Index gp, Index groups,
                          Index s_len, Index experts, double aux_grad, T* dlogits) {
  const Index plane = gp * s_len, slot = plane * experts;
  std::fill(dlogits, dlogits + plane * experts, T(0));
  std::vector<double> dp(static_cast<std::size_t>(experts));
  for (Index g = 0; g < groups; ++g)
    for (Index s = 0; s < s_len; ++s) {
      const Index at = g + gp * s;
      const Route& r = routes[at];
      for (Index e = 0; e < experts; ++e)
        dp[std::size_t(e)] = aux_grad * double(experts) * double(density[g + gp * e]) / double(s_len);
      const double p1 = probs[at + plane * r.e1];
      const double dw1 = r.c1 >= 0 ? double(dcombine[at + plane * r.e1 + slot * r.c1]) : 0.0;
      if (r.e2 != r.e1) {
        const double p2 = probs[at + plane * r.e2], den = p1 + p2;
        const double dw2 = r.c2 >= 0 ? double(dcombine[at + plane * r.e2 + slot * r.c2]) : 0.0;
        dp[std::size_t(r.e1)] += p2 * (dw1 - dw2) / (den * den);
        dp[std::size_t(r.e2)] += p1 * (dw2 - dw1) / (den * den);
      }
      // (one expert: w1 = p1 / p1 = 1 has no gradient)
      double dot = 0;
      for (Index e = 0; e < experts; ++e) dot += double(probs[at + plane * e]) * dp[std::size_t(e)];
      for (Index e = 0; e < experts; ++e)
        dlogits[at + plane * e] = T(double(probs[at + plane * e]) * (dp[std::size_t(e)] - dot));
    }
}

}  // namespace detail
}  // namespace tshard::nn
