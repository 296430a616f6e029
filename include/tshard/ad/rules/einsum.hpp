// The vector-Jacobian product of einsum: two einsums, the cotangent contracted with the other
// operand, each deducing its own spec and strategy as any einsum does (GSPMD section 3.5): a
// gradient contracting a split batch gives a partial sum, resolved where it is read.
#pragma once
#include <type_traits>

#include "tshard/ad/cotangent.hpp"
#include "tshard/ops/einsum.hpp"

namespace tshard::detail {

// The labels of an einsum's operand gradient: "out,other->operand" (left: the operand is a).
constexpr EinsumLabels gradient_labels(const EinsumLabels& e, bool left) {
  EinsumLabels g;
  if (left) {
    g.na = e.no, g.a = e.o, g.nb = e.nb, g.b = e.b, g.no = e.na, g.o = e.a;
  } else {
    g.na = e.na, g.a = e.a, g.nb = e.no, g.b = e.o, g.no = e.nb, g.o = e.b;
  }
  return g;
}

namespace grad {

// Whether two label lists are the same letters in the same order.
constexpr bool same_labels(const EinsumLabels& e) {
  if (e.na != e.nb) return false;
  for (int i = 0; i < e.na; ++i)
    if (e.a[i] != e.b[i]) return false;
  return true;
}

template <EinsumLabels E, class Out, class T, class A, class B>
void vjp(Einsum<E>, std::type_identity<Out>, TypedGradNode<T>& self, const A& a, const B& b) {
  const bool ta = tracked(a), tb = tracked(b);
  if (!ta && !tb) return;
  constexpr bool full_contraction = E.no == 0 && same_labels(E);  // "ij,ij->": the cotangent scales
  constexpr bool by_einsums = E.no > 0 && outputs_known(gradient_labels(E, true)) && outputs_known(gradient_labels(E, false));
  if constexpr (full_contraction) {
    const auto g = cotangent(std::type_identity<Out>{}, self, a.mesh());
    const T s = g.data()[0];  // rank 0, replicated: the same on every rank
    if (ta) accumulate(a, b * s);
    if (tb) accumulate(b, a * s);
  } else if constexpr (by_einsums) {
    const auto g = cotangent(std::type_identity<Out>{}, self, a.mesh());
    if (ta) accumulate(a, einsum_labeled<gradient_labels(E, true)>(g, b, EinsumStrategy::Auto, "backward"));
    if (tb) accumulate(b, einsum_labeled<gradient_labels(E, false)>(a, g, EinsumStrategy::Auto, "backward"));
  } else {
    throw SpecError(
        "tshard::ad: this einsum sums an index away inside one operand (or contracts to a scalar in another "
        "order): its gradient is not derived; sum that index first (ts::sum), then contract");
  }
}

}  // namespace grad
}  // namespace tshard::detail
