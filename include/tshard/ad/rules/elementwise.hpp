// Vector-Jacobian products of the elementwise operators: binary with numpy broadcasting (the
// cotangent of a broadcast operand is summed over the dims it was broadcast along), scalars on
// either side, unary functions, pow and where. Linear rules pass the cotangent on as it lies,
// a partial sum included; the others read it in the output's spec.
#pragma once
#include <type_traits>

#include "tshard/ad/cotangent.hpp"
#include "tshard/ops/elementwise.hpp"

namespace tshard::detail {

// v seen at rank `rank` (numpy aligns the last dims: R dims in front), as desc_of_rank types it.
inline SpecDesc desc_at_rank(const SpecDesc& v, int rank) {
  SpecDesc o = v;
  o.rank = rank;
  const int lead = rank - v.rank;
  for (int d = 0; d < kMaxRank; ++d) o.dims[d] = d >= lead && d - lead < v.rank ? v.dims[d - lead] : DimSplit{};
  return o;
}

// a (k) b for a rule, as the typed operator computes it (the same output spec, kernel and
// reshards, counted under `name`): plain operands, numpy broadcasting.
template <class T>
BlockValue<T> rule_binary(MeshState& mesh, BinaryKind k, const BlockValue<T>& a, const BlockValue<T>& b,
                          const char* name) {
  OperatorScope scope(name);
  const int rank = std::max(a.spec.rank, b.spec.rank);
  const SpecDesc da = desc_at_rank(a.spec, rank), db = desc_at_rank(b.spec, rank);
  const Extents ea = extents_of_rank(a.shape, a.spec.rank, rank), eb = extents_of_rank(b.shape, b.spec.rank, rank);
  BlockValue<T> out;
  out.spec = elementwise_desc(da.without_partial(), db.without_partial());
  for (int d = 0; d < rank; ++d) out.shape[d] = ea[d] == 1 ? eb[d] : ea[d];
  out.data = pooled_array<T>(
      static_cast<std::size_t>(shard_layout(out.spec, out.shape, mesh.shape(), mesh.coords()).padded_size()));
  binary_run<T>(mesh, k, da, ea, a.data.get(), db, eb, b.data.get(), out.spec, out.shape, out.data.get(), name);
  return out;
}

// x's node += the contribution c (of the output's rank) summed down to x's shape.
template <class T>
void add_unbroadcast_block(TypedGradNode<T>& node, BlockValue<T>&& c, T factor = T(1)) {
  add_unbroadcast(node, c.spec, c.shape, c.spec.rank, std::move(c.data), factor);
}

// a * b: da = g b, db = g a; a / b: da = g / b, db = -(g a) / (b b).
template <class T>
void product_vjp(BinaryKind k, TypedGradNode<T>& self, const TapeValue<T>& a, const TapeValue<T>& b) {
  auto *na = node_of(a), *nb = node_of(b);
  if (!na && !nb) return;
  MeshState& mesh = *self.mesh;
  const BlockValue<T> g{read_cotangent(self), self.primal, self.shape};
  const BlockValue<T> va{a.value, a.spec, a.shape}, vb{b.value, b.spec, b.shape};
  if (k == BinaryKind::Mul) {
    if (na) add_unbroadcast_block(*na, rule_binary(mesh, BinaryKind::Mul, g, vb, "multiply"));
    if (nb) add_unbroadcast_block(*nb, rule_binary(mesh, BinaryKind::Mul, g, va, "multiply"));
  } else {
    if (na) add_unbroadcast_block(*na, rule_binary(mesh, BinaryKind::Div, g, vb, "divide"));
    if (nb) {
      const auto bb = rule_binary(mesh, BinaryKind::Mul, vb, vb, "multiply");
      const auto ga = rule_binary(mesh, BinaryKind::Mul, g, va, "multiply");
      add_unbroadcast_block(*nb, rule_binary(mesh, BinaryKind::Div, ga, bb, "divide"), T(-1));
    }
  }
}

// f(g, v) over the valid elements of x's layout (never padding), as map computes it: v is the
// output (exp, tanh, sqrt, sigmoid) or x (the others), laid out as x.
template <class T>
void unary_vjp(UnaryKind k, TypedGradNode<T>& self, const TapeValue<T>& x, const TapeValue<T>& y) {
  auto* nx = node_of(x);
  if (!nx) return;
  MeshState& mesh = *self.mesh;
  const std::shared_ptr<T> g = read_cotangent(self);
  const bool by_output = k == UnaryKind::Exp || k == UnaryKind::Tanh || k == UnaryKind::Sqrt || k == UnaryKind::Sigmoid;
  const T* v = by_output ? y.value.get() : x.value.get();
  OperatorScope scope("map");
  const ShardLayout layout = shard_layout(self.primal, self.shape, mesh.shape(), mesh.coords());
  auto out = pooled_array<T>(static_cast<std::size_t>(layout.padded_size()));
  auto run = [&](auto f) {
    T* o = out.get();
    const T* gv = g.get();
    for_each_valid_run(layout, [&](Index off, Index n) {
      for (Index i = off; i < off + n; ++i) o[i] = T(f(gv[i], v[i]));
    });
  };
  switch (k) {
    case UnaryKind::Exp: run([](T gv, T yv) { return gv * yv; }); break;
    case UnaryKind::Tanh: run([](T gv, T yv) { return gv * (T(1) - yv * yv); }); break;
    case UnaryKind::Sqrt: run([](T gv, T yv) { return gv * T(0.5) / yv; }); break;
    case UnaryKind::Sigmoid: run([](T gv, T yv) { return gv * yv * (T(1) - yv); }); break;
    case UnaryKind::Log: run([](T gv, T xv) { return gv / xv; }); break;
    case UnaryKind::Relu:  // (real element types only: complex values have no order)
      if constexpr (!is_complex_v<T>) run([](T gv, T xv) { return xv > T(0) ? gv : T(0); });
      break;
    case UnaryKind::Abs:
      if constexpr (!is_complex_v<T>) run([](T gv, T xv) { return xv > T(0) ? gv : xv < T(0) ? -gv : T(0); });
      break;
    case UnaryKind::Square: run([](T gv, T xv) { return T(2) * xv * gv; }); break;
    case UnaryKind::Neg:  // a linear rule: recorded with its operand's node alone, never here
      throw SpecError("tshard::ad: internal: negation's rule was recorded with values");
  }
  accumulate_block(*nx, self.primal, self.shape, std::move(out));
}

// where(mask, a, b): a's contribution is where(mask, g, 0), b's where(mask, 0, g), each summed
// down to its operand's shape.
template <class T>
void where_vjp(TypedGradNode<T>& self, const TapeValue<bool>& mask, const TapeValue<T>& a, const TapeValue<T>& b) {
  auto *na = node_of(a), *nb = node_of(b);
  if (!na && !nb) return;
  MeshState& mesh = *self.mesh;
  const int rank = self.primal.rank;
  const std::shared_ptr<T> g = read_cotangent(self);
  const SpecDesc dm = desc_at_rank(mask.spec, rank), ds = ScalarOperand<T>::desc(rank);
  const Extents sm = extents_of_rank(mask.shape, mask.spec.rank, rank), ss = ScalarOperand<T>::shape(rank);
  const T zero(0);
  auto side = [&](bool to_a) {
    const SpecDesc dout = to_a ? elementwise_desc(elementwise_desc(dm, self.primal), ds)
                               : elementwise_desc(elementwise_desc(dm, ds), self.primal);
    BlockValue<T> c{nullptr, dout, self.shape};
    c.data = pooled_array<T>(
        static_cast<std::size_t>(shard_layout(dout, self.shape, mesh.shape(), mesh.coords()).padded_size()));
    OperatorScope scope("where");
    if (to_a)
      where_run<T>(mesh, dm, sm, mask.value.get(), self.primal, self.shape, g.get(), ds, ss, &zero, dout, self.shape,
                   c.data.get());
    else
      where_run<T>(mesh, dm, sm, mask.value.get(), ds, ss, &zero, self.primal, self.shape, g.get(), dout, self.shape,
                   c.data.get());
    return c;
  };
  if (na) add_unbroadcast_block(*na, side(true));
  if (nb) add_unbroadcast_block(*nb, side(false));
}

}  // namespace tshard::detail

namespace tshard::detail::grad {

// a + b, a - b: the cotangent passes on as it lies (a partial sum included), summed over the dims
// an operand was broadcast along. (The output's rank is its node's.)
template <BinaryKind K, class T>
void vjp(Binary<K>, std::type_identity<AnyOutput>, TypedGradNode<T>& self, const TapeNode<T>& a, const TapeNode<T>& b) {
  static_assert(K == BinaryKind::Add || K == BinaryKind::Sub);
  const SpecDesc dg = self.cotangent_desc;
  auto g = std::move(self.cotangent);
  if (auto* n = node_of(a)) add_unbroadcast(*n, dg, self.shape, self.primal.rank, g);
  if (auto* n = node_of(b)) add_unbroadcast(*n, dg, self.shape, self.primal.rank, g, K == BinaryKind::Sub ? T(-1) : T(1));
}

// a * b, a / b: products with the operands' values (kept by the rule).
template <BinaryKind K, class T>
void vjp(Binary<K>, std::type_identity<AnyOutput>, TypedGradNode<T>& self, const TapeValue<T>& a, const TapeValue<T>& b) {
  static_assert(K == BinaryKind::Mul || K == BinaryKind::Div);
  product_vjp(K, self, a, b);
}

// x + s, s - x, s x, x / s...: the cotangent times a constant factor.
template <BinaryKind K, bool ScalarLeft, class S, class T>
void vjp(WithScalar<K, ScalarLeft, S> tag, std::type_identity<AnyOutput>, TypedGradNode<T>& self, const TapeNode<T>& x) {
  auto* n = node_of(x);
  if (!n) return;
  T factor = T(1);
  if constexpr (K == BinaryKind::Sub && ScalarLeft) factor = T(-1);
  if constexpr (K == BinaryKind::Mul) factor = T(tag.s);
  if constexpr (K == BinaryKind::Div) factor = T(1) / T(tag.s);
  add_unbroadcast(*n, self.cotangent_desc, self.shape, self.primal.rank, std::move(self.cotangent), factor);
}

// s / x: -s g / x^2.
template <BinaryKind K, bool ScalarLeft, class S, class Out, class T, class X>
void vjp(WithScalar<K, ScalarLeft, S> tag, std::type_identity<Out>, TypedGradNode<T>& self, const X& x) {
  static_assert(K == BinaryKind::Div && ScalarLeft);
  if (!tracked(x)) return;
  const auto g = cotangent(std::type_identity<Out>{}, self, x.mesh());
  const T s = T(tag.s);
  accumulate(x, map([s](T gv, T xv) { return -s * gv / (xv * xv); }, g, x));
}

template <class T>
void vjp(Unary<UnaryKind::Neg>, std::type_identity<AnyOutput>, TypedGradNode<T>& self, const TapeNode<T>& x) {
  if (auto* n = node_of(x))
    add_unbroadcast(*n, self.cotangent_desc, self.shape, self.primal.rank, std::move(self.cotangent), T(-1));
}

// exp, log, tanh...: the cotangent times the derivative, read from the output y (exp, tanh, sqrt,
// sigmoid) or from x (the others); the rule keeps that one value.
template <UnaryKind K, class T>
void vjp(Unary<K>, std::type_identity<AnyOutput>, TypedGradNode<T>& self, const TapeValue<T>& x, const TapeValue<T>& y) {
  static_assert(K != UnaryKind::Neg);
  unary_vjp(K, self, x, y);
}

template <class P, class Out, class T, class X>
void vjp(Pow<P> tag, std::type_identity<Out>, TypedGradNode<T>& self, const X& x) {
  if (!tracked(x)) return;
  const auto g = cotangent(std::type_identity<Out>{}, self, x.mesh());
  const T p = T(tag.p);
  accumulate(x, map([p](T gv, T xv) { return gv * p * std::pow(xv, p - T(1)); }, g, x));
}

// where(mask, a, b): the cotangent goes to a where the mask holds and to b elsewhere.
template <class T>
void vjp(Where, std::type_identity<AnyOutput>, TypedGradNode<T>& self, const TapeValue<bool>& mask,
         const TapeValue<T>& a, const TapeValue<T>& b) {
  where_vjp(self, mask, a, b);
}

}  // namespace tshard::detail::grad

// Compiled once where the program links tshard::kernels (core/kernel_instances.hpp).
namespace tshard::detail {
#define TSHARD_INSTANCE(T)                                                                              \
  TSHARD_RULE_INSTANCE_2(T, TapeNode<T>, TapeNode<T>, grad::Binary<BinaryKind::Add>)                     \
  TSHARD_RULE_INSTANCE_2(T, TapeNode<T>, TapeNode<T>, grad::Binary<BinaryKind::Sub>)                     \
  TSHARD_RULE_INSTANCE_2(T, TapeValue<T>, TapeValue<T>, grad::Binary<BinaryKind::Mul>)                   \
  TSHARD_RULE_INSTANCE_2(T, TapeValue<T>, TapeValue<T>, grad::Binary<BinaryKind::Div>)                   \
  TSHARD_RULE_INSTANCE_1(T, TapeNode<T>, grad::WithScalar<BinaryKind::Add, false, T>)                    \
  TSHARD_RULE_INSTANCE_1(T, TapeNode<T>, grad::WithScalar<BinaryKind::Add, true, T>)                     \
  TSHARD_RULE_INSTANCE_1(T, TapeNode<T>, grad::WithScalar<BinaryKind::Sub, false, T>)                    \
  TSHARD_RULE_INSTANCE_1(T, TapeNode<T>, grad::WithScalar<BinaryKind::Sub, true, T>)                     \
  TSHARD_RULE_INSTANCE_1(T, TapeNode<T>, grad::WithScalar<BinaryKind::Mul, false, T>)                    \
  TSHARD_RULE_INSTANCE_1(T, TapeNode<T>, grad::WithScalar<BinaryKind::Mul, true, T>)                     \
  TSHARD_RULE_INSTANCE_1(T, TapeNode<T>, grad::WithScalar<BinaryKind::Div, false, T>)                    \
  TSHARD_RULE_INSTANCE_1(T, TapeNode<T>, grad::Unary<UnaryKind::Neg>)                                    \
  TSHARD_RULE_INSTANCE_2(T, TapeValue<T>, TapeValue<T>, grad::Unary<UnaryKind::Exp>)                     \
  TSHARD_RULE_INSTANCE_2(T, TapeValue<T>, TapeValue<T>, grad::Unary<UnaryKind::Log>)                     \
  TSHARD_RULE_INSTANCE_2(T, TapeValue<T>, TapeValue<T>, grad::Unary<UnaryKind::Tanh>)                    \
  TSHARD_RULE_INSTANCE_2(T, TapeValue<T>, TapeValue<T>, grad::Unary<UnaryKind::Relu>)                    \
  TSHARD_RULE_INSTANCE_2(T, TapeValue<T>, TapeValue<T>, grad::Unary<UnaryKind::Sqrt>)                    \
  TSHARD_RULE_INSTANCE_2(T, TapeValue<T>, TapeValue<T>, grad::Unary<UnaryKind::Abs>)                     \
  TSHARD_RULE_INSTANCE_2(T, TapeValue<T>, TapeValue<T>, grad::Unary<UnaryKind::Sigmoid>)                 \
  TSHARD_RULE_INSTANCE_2(T, TapeValue<T>, TapeValue<T>, grad::Unary<UnaryKind::Square>)                  \
  TSHARD_RULE_INSTANCE_3(T, TapeValue<bool>, TapeValue<T>, TapeValue<T>, grad::Where)
TSHARD_FOR_EACH_REAL(TSHARD_INSTANCE)
#undef TSHARD_INSTANCE
#define TSHARD_INSTANCE(T) TSHARD_KERNEL_INSTANCE(void product_vjp<T>(BinaryKind, TypedGradNode<T>&, \
    const TapeValue<T>&, const TapeValue<T>&))
TSHARD_FOR_EACH_REAL(TSHARD_INSTANCE)
#undef TSHARD_INSTANCE
#define TSHARD_INSTANCE(T) TSHARD_KERNEL_INSTANCE(void where_vjp<T>(TypedGradNode<T>&, const TapeValue<bool>&, \
    const TapeValue<T>&, const TapeValue<T>&))
TSHARD_FOR_EACH_REAL(TSHARD_INSTANCE)
#undef TSHARD_INSTANCE
#define TSHARD_INSTANCE(T) TSHARD_KERNEL_INSTANCE(void unary_vjp<T>(UnaryKind, TypedGradNode<T>&, \
    const TapeValue<T>&, const TapeValue<T>&))
TSHARD_FOR_EACH_REAL(TSHARD_INSTANCE)
#undef TSHARD_INSTANCE
}  // namespace tshard::detail
