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

// Whether two label lists are the same letters in the same order.
constexpr bool same_labels(const EinsumLabels& e) {
  if (e.na != e.nb) return false;
  for (int i = 0; i < e.na; ++i)
    if (e.a[i] != e.b[i]) return false;
  return true;
}

// A rule's product einsum<e>(u, v), as einsum() computes it (the same decision, plan, kernels
// and collectives, counted under "einsum"; a partial operand resolved first), never recorded.
template <class T>
BlockValue<T> rule_product(MeshState& mesh, const EinsumLabels& e, const BlockValue<T>& u, const BlockValue<T>& v) {
  OperatorScope scope("einsum");
  auto ua = implicit_reshard(mesh, u.spec, u.spec.without_partial(), u.shape, u.data.get(), "einsum");
  auto va = implicit_reshard(mesh, v.spec, v.spec.without_partial(), v.shape, v.data.get(), "einsum");
  const SpecDesc du = u.spec.without_partial(), dv = v.spec.without_partial();
  const EinsumDecision decision = decide_einsum(e, du, dv);
  BlockValue<T> out{nullptr, einsum_output_desc(e, decision, du, dv), einsum_output_shape(e, u.shape, v.shape)};
  out.data = pooled_array<T>(static_cast<std::size_t>(
      shard_layout(out.spec, out.shape, mesh.shape(), mesh.coords()).padded_size()));
  einsum_run<T>(mesh, e, decision, du, u.shape, ua.data, dv, v.shape, va.data, out.spec, out.shape, out.data.get(),
                EinsumStrategy::Auto);
  return out;
}

// The contribution of einsum<g>(u, v) to an operand of shape sx whose labels are g's output,
// where some of them are summed inside that operand alone: the einsum of the labels it knows,
// broadcast back over the rest (times ones: the transpose of that sum).
template <class T>
BlockValue<T> operand_gradient(MeshState& mesh, const EinsumLabels& g, const Extents& sx, const BlockValue<T>& u,
                               const BlockValue<T>& v) {
  if (outputs_known(g)) return rule_product(mesh, g, u, v);
  const EinsumLabels back = broadcast_back(g);
  BlockValue<T> ones;  // replicated: no padding
  ones.spec.rank = back.nb;
  for (int i = 0; i < back.nb; ++i) ones.shape[i] = sx[g.in_o(back.b[i])];
  const Index n = shard_layout(ones.spec, ones.shape, mesh.shape(), mesh.coords()).padded_size();
  ones.data = pooled_array<T>(static_cast<std::size_t>(n));
  std::fill(ones.data.get(), ones.data.get() + n, T(1));
  return rule_product(mesh, back, rule_product(mesh, known_part(g), u, v), ones);
}

// Each operand's gradient is an einsum of the cotangent with the other operand (GSPMD section
// 3.5: a gradient contracting a split batch gives a partial sum, resolved where it is read).
template <class T>
void einsum_vjp(const EinsumLabels& e, TypedGradNode<T>& self, const TapeValue<T>& a, const TapeValue<T>& b) {
  auto *na = node_of(a), *nb = node_of(b);
  if (!na && !nb) return;
  MeshState& mesh = *self.mesh;
  const bool full_contraction = e.no == 0 && same_labels(e);  // "ij,ij->": the cotangent scales
  const bool by_einsums =
      e.no > 0 && known_part(gradient_labels(e, true)).no > 0 && known_part(gradient_labels(e, false)).no > 0;
  if (!full_contraction && !by_einsums)
    throw SpecError(
        "tshard::ad: this einsum contracts to a scalar, or sums every index of an operand away, in a form whose "
        "gradient is not derived; sum first (ts::sum), then contract");
  const BlockValue<T> g{read_cotangent(self), self.primal, self.shape};
  const BlockValue<T> va{a.value, a.spec, a.shape}, vb{b.value, b.spec, b.shape};
  if (full_contraction) {
    const T s = g.data.get()[0];  // rank 0, replicated: the same on every rank
    auto scaled = [&](const BlockValue<T>& x) {  // s x, as an unevaluated s * x is evaluated
      const Index n = shard_layout(x.spec, x.shape, mesh.shape(), mesh.coords()).padded_size();
      auto out = pooled_array<T>(static_cast<std::size_t>(n));
      for (Index i = 0; i < n; ++i) out.get()[i] = s * x.data.get()[i];
      return out;
    };
    if (na) accumulate_block(*na, b.spec, b.shape, scaled(vb));
    if (nb) accumulate_block(*nb, a.spec, a.shape, scaled(va));
    return;
  }
  if (na) {
    auto c = operand_gradient(mesh, gradient_labels(e, true), a.shape, g, vb);
    accumulate_block(*na, c.spec, c.shape, std::move(c.data));
  }
  if (nb) {
    auto c = operand_gradient(mesh, gradient_labels(e, false), b.shape, va, g);
    accumulate_block(*nb, c.spec, c.shape, std::move(c.data));
  }
}

namespace grad {

template <class T>
void vjp(const Einsum& tag, std::type_identity<AnyOutput>, TypedGradNode<T>& self, const TapeValue<T>& a,
         const TapeValue<T>& b) {
  einsum_vjp(tag.e, self, a, b);
}

}  // namespace grad
}  // namespace tshard::detail

// Compiled once where the program links tshard::kernels (core/kernel_instances.hpp).
namespace tshard::detail {
#define TSHARD_INSTANCE(T) TSHARD_RULE_INSTANCE_2(T, TapeValue<T>, TapeValue<T>, grad::Einsum)
TSHARD_FOR_EACH_REAL(TSHARD_INSTANCE)
#undef TSHARD_INSTANCE
#define TSHARD_INSTANCE(T) TSHARD_KERNEL_INSTANCE(void einsum_vjp<T>(const EinsumLabels&, TypedGradNode<T>&, \
    const TapeValue<T>&, const TapeValue<T>&))
TSHARD_FOR_EACH_REAL(TSHARD_INSTANCE)
#undef TSHARD_INSTANCE
}  // namespace tshard::detail
