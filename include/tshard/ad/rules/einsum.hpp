// The vector-Jacobian product of einsum: two einsums, the cotangent contracted with the other
// operand, each deducing its own spec and strategy as any einsum does (GSPMD section 3.5): a
// gradient contracting a split batch gives a partial sum, resolved where it is read.
#pragma once
#include <algorithm>
#include <array>
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

// An operand gradient's labels without those it cannot know: labels summed inside that operand
// alone appear in neither the cotangent nor the other operand.
constexpr EinsumLabels known_part(const EinsumLabels& g) {
  EinsumLabels r = g;
  r.no = 0;
  for (int i = 0; i < g.no; ++i)
    if (g.in_a(g.o[i]) >= 0 || g.in_b(g.o[i]) >= 0) r.o[r.no++] = g.o[i];
  return r;
}
// The known part times ones over the unknown labels, in the operand's order: an outer product,
// the transpose of summing those labels away (d/dx sum_i x_i = 1 for every i).
constexpr EinsumLabels broadcast_back(const EinsumLabels& g) {
  const EinsumLabels k = known_part(g);
  EinsumLabels r;
  r.na = k.no;
  r.a = k.o;
  for (int i = 0; i < g.no; ++i)
    if (g.in_a(g.o[i]) < 0 && g.in_b(g.o[i]) < 0) r.b[r.nb++] = g.o[i];
  r.no = g.no;
  r.o = g.o;
  return r;
}

namespace grad {

// A rule's product: never recorded (see einsum_labeled's Record).
template <EinsumLabels G, class U, class V>
auto rule_einsum(const U& u, const V& v) {
  return einsum_labeled<G, U, V, false>(u, v, EinsumStrategy::Auto, "backward");
}

// The contribution of einsum<G>(u, v) to an operand x whose labels are G's output, where some of
// them are summed inside x alone: the einsum of the labels it knows, broadcast back over the rest.
template <EinsumLabels G, class X, class U, class V>
auto operand_gradient(const X& x, const U& u, const V& v) {
  if constexpr (outputs_known(G)) {
    return rule_einsum<G>(u, v);
  } else {
    constexpr EinsumLabels B = broadcast_back(G);
    using T = typename X::Scalar;
    std::array<Eigen::Index, std::size_t(B.nb)> extents{};
    for (int i = 0; i < B.nb; ++i) extents[std::size_t(i)] = extents_of(x)[std::size_t(G.in_o(B.b[i]))];
    ShardedTensor<T, typename X::MeshT, Replicated<B.nb>> ones(x.mesh(), extents);  // replicated: no padding
    std::fill(ones.data(), ones.data() + ones.padded_size(), T(1));
    return rule_einsum<B>(rule_einsum<known_part(G)>(u, v), ones);
  }
}

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
  // Each gradient is an einsum of the cotangent with the other operand; labels summed inside one
  // operand alone are broadcast back over (the transpose of that sum).
  constexpr bool by_einsums = E.no > 0 && known_part(gradient_labels(E, true)).no > 0 &&
                              known_part(gradient_labels(E, false)).no > 0;
  if constexpr (full_contraction) {
    const auto g = cotangent(std::type_identity<Out>{}, self, a.mesh());
    const T s = g.data()[0];  // rank 0, replicated: the same on every rank
    if (ta) accumulate(a, b * s);
    if (tb) accumulate(b, a * s);
  } else if constexpr (by_einsums) {
    const auto g = cotangent(std::type_identity<Out>{}, self, a.mesh());
    if (ta) accumulate(a, operand_gradient<gradient_labels(E, true)>(a, g, b));
    if (tb) accumulate(b, operand_gradient<gradient_labels(E, false)>(b, a, g));
  } else {
    throw SpecError(
        "tshard::ad: this einsum contracts to a scalar, or sums every index of an operand away, in a form whose "
        "gradient is not derived; sum first (ts::sum), then contract");
  }
}

}  // namespace grad
}  // namespace tshard::detail
